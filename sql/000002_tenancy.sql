-- Tenancy and access: workspaces, users, memberships, roles and grants, teams, tokens, sign-in
-- throttling, two-factor material, the per-request context that every policy trusts (and the
-- import context beside it), authentication, DBA access and the audit views.
--
-- Trust model: the service connects as the owner role (the one that runs migrations) and switches
-- to crm_api inside each request transaction. crm_api can set any crm.* setting itself, so the
-- settings alone prove nothing: crm.authenticate (or crm.act_as, for DBAs) also sets
-- crm.context_proof, an HMAC over user, workspace, backend pid and transaction start time, keyed
-- by a secret in crm.internal_secrets that crm_api cannot read. The policy helpers return null
-- unless the proof matches, so hand-set settings see zero rows.

-- Transaction-local limits, as in every migration: waiting long for a lock would hold up every
-- query queued behind the migration, and no statement here should run for long.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- ---------------------------------------------------------------------------------------------
-- Internal secret (never readable by crm_api)
create table crm.internal_secrets (
  name text primary key,
  value bytea not null
);
alter table crm.internal_secrets enable row level security;
comment on table crm.internal_secrets is 'Keys used only inside SECURITY DEFINER functions; crm_api has no grant and no policy here.';
insert into crm.internal_secrets (name, value) values ('context_proof', gen_random_bytes(32));

-- =============================================================================================
-- The request context
--
-- The proof's message, written once. A plain SQL function (no SECURITY DEFINER, no SET clause) whose
-- body is one expression: PostgreSQL inlines it into each caller, so it costs nothing to share.
-- Internal: crm_api has no EXECUTE (the message alone proves nothing without the key anyway).
create function crm.context_message(p_user_id text, p_workspace_id text) returns bytea
language sql stable
as $$
  select convert_to(p_user_id || '/' || p_workspace_id || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8')
$$;
comment on function crm.context_message(text, text) is
  'What crm.context_proof signs: user, workspace, backend pid and transaction start (ids as uuid text). Inlined into its callers; internal.';
revoke execute on function crm.context_message(text, text) from public;

create function crm.context_proof(p_user_id uuid, p_workspace_id uuid) returns text
language sql stable security definer
set search_path = pg_catalog, public
as $$
  select encode(
    hmac(crm.context_message(p_user_id::text, p_workspace_id::text),
         (select value from crm.internal_secrets where name = 'context_proof'),
         'sha256'),
    'hex')
$$;
comment on function crm.context_proof(uuid, uuid) is 'HMAC binding a user and workspace to this backend and this transaction; only SECURITY DEFINER code can compute it.';
revoke execute on function crm.context_proof(uuid, uuid) from public;

create function crm.set_context(p_user_id uuid, p_workspace_id uuid, p_via text) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, public
as $$
begin
  perform set_config('crm.user_id', p_user_id::text, true);
  perform set_config('crm.workspace_id', p_workspace_id::text, true);
  perform set_config('crm.via', coalesce(p_via, 'api'), true);
  perform set_config('crm.context_proof', crm.context_proof(p_user_id, p_workspace_id), true);
end
$$;
comment on function crm.set_context(uuid, uuid, text) is 'Sets the transaction-local request context with its proof. Not executable by crm_api.';
revoke execute on function crm.set_context(uuid, uuid, text) from public;

-- Every helper below verifies the proof exactly once (through crm.verified_context), so a context
-- set by hand as crm_api reads as "nobody". Policies call each helper once per statement as an
-- InitPlan; keeping the HMAC count at one per helper is what keeps RLS cheap (bench/).
-- crm.verified_context computes the HMAC itself, and the helpers are PL/pgSQL that call it as an
-- expression: PL/pgSQL evaluates a bare function call without starting an executor, where a
-- SQL-language wrapper selecting FROM another function pays a function scan (three such layers per
-- helper per statement cost more than the check itself).
create function crm.verified_context(out user_id uuid, out workspace_id uuid)
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_user text := current_setting('crm.user_id', true);
  v_workspace text := current_setting('crm.workspace_id', true);
  v_proof text := current_setting('crm.context_proof', true);
begin
  if v_proof is null or v_proof = '' or v_user !~ '^[0-9a-f-]{36}$' or v_workspace !~ '^[0-9a-f-]{36}$' then
    return;
  end if;
  if encode(hmac(crm.context_message(v_user, v_workspace),
                 (select s.value from crm.internal_secrets s where s.name = 'context_proof'),
                 'sha256'), 'hex') is distinct from v_proof then
    return;
  end if;
  user_id := v_user::uuid;
  workspace_id := v_workspace::uuid;
end
$$;
comment on function crm.verified_context() is 'The (user, workspace) of this transaction when its proof checks out; nulls otherwise.';

create function crm.current_user_id() returns uuid
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
begin
  return (crm.verified_context()).user_id;
end
$$;
comment on function crm.current_user_id() is 'The authenticated user of this transaction, or null when no proven context was set. Wrap as (select crm.current_user_id()) in policies.';

create function crm.current_workspace_id() returns uuid
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
begin
  return (crm.verified_context()).workspace_id;
end
$$;
comment on function crm.current_workspace_id() is 'The workspace chosen for this transaction, or null without a proven context.';

create function crm.current_via() returns text
language sql stable
as $$
  select coalesce(nullif(current_setting('crm.via', true), ''), 'system')
$$;
comment on function crm.current_via() is 'How the change arrived: api, ui, import or system (only used to describe events, never to authorize).';

-- The scope helpers: the widest scope the member's role grants comes from crm.member_scope
-- (defined with the tables it reads, below), called once the context is verified.
create function crm.grant_scope(p_resource text, p_action text) returns text
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_context record := crm.verified_context();
begin
  if v_context.user_id is null then return null; end if;
  return crm.member_scope(v_context.user_id, v_context.workspace_id, p_resource, p_action);
end
$$;
comment on function crm.grant_scope(text, text) is 'The scope (own, team, all) the current member''s role grants for resource:action, or null. Read live, so role changes apply on the next statement.';

create function crm.scope_owner_ids(p_resource text, p_action text) returns uuid[]
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_context record := crm.verified_context();
begin
  if v_context.user_id is null then return '{}'; end if;
  return case crm.member_scope(v_context.user_id, v_context.workspace_id, p_resource, p_action)
           when 'own' then array[v_context.user_id]
           when 'team' then crm.team_user_ids(v_context.user_id, v_context.workspace_id)
           else '{}'::uuid[]
         end;
end
$$;
comment on function crm.scope_owner_ids(text, text) is 'Owners whose records an own or team scope covers; empty for all (checked separately) or no grant.';

create function crm.is_admin() returns boolean
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_context record := crm.verified_context();
begin
  if v_context.user_id is null then return false; end if;
  return coalesce((
    select r.is_admin
      from crm.memberships m
      join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
     where m.workspace_id = v_context.workspace_id and m.user_id = v_context.user_id and m.suspended_at is null), false);
end
$$;
comment on function crm.is_admin() is 'Whether the current member''s role is an admin role.';

create function crm.current_team_user_ids() returns uuid[]
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_context record := crm.verified_context();
begin
  if v_context.user_id is null then return null; end if;
  return crm.team_user_ids(v_context.user_id, v_context.workspace_id);
end
$$;
comment on function crm.current_team_user_ids() is 'The current user and everyone sharing a team with them in the current workspace.';

-- =============================================================================================
-- The import context. crm.via = 'import' only describes events; what authorizes an import's
-- inserts is crm.import_id, which carries an HMAC proof like the request context (the record
-- policies of 000003_records.sql read it; 000006_imports.sql sets it).
create function crm.import_proof(p_import_id uuid) returns text
language sql stable security definer
set search_path = pg_catalog, public
as $$
  select encode(
    hmac(convert_to('import/' || p_import_id::text || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8'),
         (select value from crm.internal_secrets where name = 'context_proof'),
         'sha256'),
    'hex')
$$;
comment on function crm.import_proof(uuid) is 'HMAC binding an import to this backend and transaction.';
revoke execute on function crm.import_proof(uuid) from public;

create function crm.current_import_id() returns uuid
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_import text := nullif(current_setting('crm.import_id', true), '');
begin
  if v_import is null or v_import !~ '^[0-9a-f-]{36}$' or crm.current_user_id() is null then
    return null;
  end if;
  if crm.import_proof(v_import::uuid) is distinct from current_setting('crm.import_proof', true) then
    return null;
  end if;
  return v_import::uuid;
end
$$;
comment on function crm.current_import_id() is 'The import this transaction lands rows for, or null (no proven import context).';
grant execute on function crm.current_import_id() to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Workspaces
-- (Their select policy follows crm.memberships, which crm.my_workspace_ids reads.)
create table crm.workspaces (
  id uuid primary key default crm.uuid_v7(),
  slug text not null constraint workspaces_slug_key unique
    constraint workspaces_slug_format check (slug ~ '^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$'),
  name text not null constraint workspaces_name_length check (length(btrim(name)) between 1 and 255),
  plan text not null default 'free' constraint workspaces_plan_known check (plan in ('free', 'pro')),
  trial_ends_at timestamptz,
  seat_limit integer constraint workspaces_seat_limit_positive check (seat_limit is null or seat_limit >= 0),
  created_at timestamptz not null default now()
);
alter table crm.workspaces enable row level security;
comment on table crm.workspaces is 'A tenant. Every tenant table carries workspace_id first in its keys.';
comment on column crm.workspaces.trial_ends_at is 'Webhooks work on pro, or while now() < trial_ends_at.';
comment on column crm.workspaces.seat_limit is 'Active (not suspended) members may not exceed this; null means unlimited.';

-- Built-in roles, created by the database for every new workspace.
create function crm.tg_workspaces__create_builtin_roles() returns trigger
language plpgsql
set search_path = pg_catalog, public
as $$
declare
  v_admin uuid;
  v_member uuid;
  v_read_only uuid;
begin
  insert into crm.roles (workspace_id, name, is_admin, is_builtin) values (new.id, 'admin', true, true) returning id into v_admin;
  insert into crm.roles (workspace_id, name, is_admin, is_builtin) values (new.id, 'member', false, true) returning id into v_member;
  insert into crm.roles (workspace_id, name, is_admin, is_builtin) values (new.id, 'read_only', false, true) returning id into v_read_only;
  insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
  select new.id, v_admin, r, a, 'all'
  from unnest(array['contacts', 'companies', 'deals']) r, unnest(array['view', 'create', 'update', 'delete', 'import', 'export']) a
  union all
  select new.id, v_member, r, a, case a when 'view' then 'all' else 'own' end
  from unnest(array['contacts', 'companies', 'deals']) r, unnest(array['view', 'create', 'update', 'delete']) a
  union all
  select new.id, v_read_only, r, 'view', 'all'
  from unnest(array['contacts', 'companies', 'deals']) r;
  return null;
end
$$;
create trigger tg_workspaces__create_builtin_roles after insert on crm.workspaces
  for each row execute function crm.tg_workspaces__create_builtin_roles();
comment on function crm.tg_workspaces__create_builtin_roles() is 'admin (every grant, all), member (view all; create, update, delete own), read_only (view all).';
grant select on crm.workspaces to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Users (platform-wide; a user joins workspaces through memberships)
-- (Their select policy follows crm.memberships, which crm.colleague_ids reads.)
create table crm.users (
  id uuid primary key default crm.uuid_v7(),
  email text not null constraint users_email_key unique
    constraint users_email_format check (email = lower(email) and email ~ '^[^@\s]+@[^@\s]+\.[^@\s]+$' and length(email) <= 254),
  name text not null constraint users_name_length check (length(btrim(name)) between 1 and 255),
  password_hash text,
  api_access boolean not null default true,
  suspended_at timestamptz,
  last_workspace_id uuid references crm.workspaces (id) on delete set null,
  created_at timestamptz not null default now()
);
alter table crm.users enable row level security;
comment on table crm.users is 'People who sign in. Email is stored lower-case, so the unique key is case-insensitive.';
comment on column crm.users.password_hash is 'scrypt (N=32768, r=8, p=1, 16-byte salt), encoded as scrypt$N$r$p$salt$hash (base64url).';
comment on column crm.users.api_access is 'Platform operator switch: when false, the user''s API tokens stop working at once.';
comment on column crm.users.suspended_at is 'Platform-wide suspension: every token and session of the user stops at once.';
create policy users_update_self on crm.users for update to crm_api
  using (id = (select crm.current_user_id())) with check (id = (select crm.current_user_id()));
comment on policy users_update_self on crm.users is 'A user changes only their own name and password.';
grant select (id, email, name, api_access, suspended_at, created_at) on crm.users to crm_api;
grant update (name, password_hash) on crm.users to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Roles and grants
-- (The select policy of roles follows crm.memberships, which crm.my_workspace_ids reads.)
create table crm.roles (
  workspace_id uuid not null references crm.workspaces (id) on delete cascade,
  id uuid not null default crm.uuid_v7(),
  name text not null constraint roles_name_format check (name ~ '^[a-z][a-z0-9_]{0,62}$'),
  is_admin boolean not null default false,
  is_builtin boolean not null default false,
  created_at timestamptz not null default now(),
  primary key (workspace_id, id),
  constraint roles_name_key unique (workspace_id, name)
);
alter table crm.roles enable row level security;
comment on table crm.roles is 'Per-workspace roles. Built-in: admin, member, read_only (created by a trigger on crm.workspaces).';

-- Built-in roles and their grants are fixed.
create function crm.tg_roles__protect_builtin() returns trigger
language plpgsql
as $$
begin
  if tg_op = 'DELETE' and old.is_builtin and exists (select 1 from crm.workspaces where id = old.workspace_id) then
    raise exception 'built-in role % cannot be deleted', old.name using errcode = 'CR422', hint = 'validation_failed';
  elsif tg_op = 'UPDATE' and old.is_builtin then
    raise exception 'built-in role % cannot be changed', old.name using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return coalesce(new, old);
end
$$;
create trigger tg_roles__protect_builtin before update or delete on crm.roles
  for each row execute function crm.tg_roles__protect_builtin();
comment on function crm.tg_roles__protect_builtin() is 'Refuses changes to built-in roles (they are removed only with their workspace).';
create policy roles_write_admin on crm.roles for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy roles_write_admin on crm.roles is 'Admins manage custom roles.';
grant select, insert, delete on crm.roles to crm_api;
-- Admins may rename a custom role and turn its admin flag on or off.
grant update (name, is_admin) on crm.roles to crm_api;

create table crm.role_grants (
  workspace_id uuid not null,
  role_id uuid not null,
  resource text not null constraint role_grants_resource_known check (resource in ('contacts', 'companies', 'deals')),
  action text not null constraint role_grants_action_known check (action in ('view', 'create', 'update', 'delete', 'import', 'export')),
  scope text not null constraint role_grants_scope_known check (scope in ('own', 'team', 'all')),
  primary key (workspace_id, role_id, resource, action),
  foreign key (workspace_id, role_id) references crm.roles (workspace_id, id) on delete cascade
);
alter table crm.role_grants enable row level security;
comment on table crm.role_grants is 'resource:action:scope grants of a role; one scope per resource and action.';

create function crm.tg_role_grants__protect_builtin() returns trigger
language plpgsql
as $$
declare
  v_role crm.roles;
begin
  select * into v_role from crm.roles where workspace_id = coalesce(new.workspace_id, old.workspace_id) and id = coalesce(new.role_id, old.role_id);
  -- During workspace creation the trigger above inserts the built-in grants: allow inserts then.
  if v_role.is_builtin and (tg_op <> 'INSERT' or v_role.created_at <> now()) and found then
    raise exception 'grants of built-in role % cannot be changed', v_role.name using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return coalesce(new, old);
end
$$;
create trigger tg_role_grants__protect_builtin before insert or update or delete on crm.role_grants
  for each row execute function crm.tg_role_grants__protect_builtin();
comment on function crm.tg_role_grants__protect_builtin() is 'Refuses grant changes on built-in roles after their creation transaction.';
create policy role_grants_select_workspace on crm.role_grants for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()));
comment on policy role_grants_select_workspace on crm.role_grants is 'Members see the grants of the current workspace''s roles.';
create policy role_grants_write_admin on crm.role_grants for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy role_grants_write_admin on crm.role_grants is 'Admins change the grants of custom roles.';
grant select, insert, update, delete on crm.role_grants to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Memberships
-- (The seat and last-admin triggers are in 000004_members.sql.)
create table crm.memberships (
  workspace_id uuid not null references crm.workspaces (id) on delete cascade,
  user_id uuid not null references crm.users (id) on delete cascade,
  role_id uuid not null,
  suspended_at timestamptz,
  joined_at timestamptz not null default now(),
  primary key (workspace_id, user_id),
  foreign key (workspace_id, role_id) references crm.roles (workspace_id, id)
);
alter table crm.memberships enable row level security;
-- Serves "which workspaces is this user in" (authentication, /api/workspaces).
create index memberships_user_idx on crm.memberships (user_id, joined_at);
-- Serves "is this role in use" (role deletion) and the role's members.
create index memberships_role_idx on crm.memberships (workspace_id, role_id);
comment on table crm.memberships is 'A user''s place in a workspace: one role, an optional suspension.';
create policy memberships_select_own_or_workspace on crm.memberships for select to crm_api
  using (user_id = (select crm.current_user_id()) or workspace_id = (select crm.current_workspace_id()));
comment on policy memberships_select_own_or_workspace on crm.memberships is 'A user sees their own memberships and the members of the current workspace.';
create policy memberships_write_admin on crm.memberships for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy memberships_write_admin on crm.memberships is 'Admins add, change, suspend and remove members of their workspace.';
grant select, insert, delete on crm.memberships to crm_api;
grant update (role_id, suspended_at) on crm.memberships to crm_api;

-- The widest scope a member's role grants for resource:action, shared by crm.grant_scope and
-- crm.scope_owner_ids. Takes the already verified user and workspace (no second HMAC check) and is
-- internal: crm_api has no EXECUTE, so nobody can ask it about another user.
create function crm.member_scope(p_user_id uuid, p_workspace_id uuid, p_resource text, p_action text) returns text
language sql stable
as $$
  select g.scope
    from crm.memberships m
    join crm.role_grants g on g.workspace_id = m.workspace_id and g.role_id = m.role_id
   where m.workspace_id = p_workspace_id and m.user_id = p_user_id
     and m.suspended_at is null and g.resource = p_resource and g.action = p_action
$$;
comment on function crm.member_scope(uuid, uuid, text, text) is
  'The scope (own, team, all) the member''s role grants for resource:action, or null (internal; callers verify the context first).';
revoke execute on function crm.member_scope(uuid, uuid, text, text) from public;

create function crm.colleague_ids() returns uuid[]
language sql stable security definer
set search_path = pg_catalog, public
as $$
  select array(select m.user_id from crm.verified_context() c join crm.memberships m on m.workspace_id = c.workspace_id)
$$;
comment on function crm.colleague_ids() is 'The members of the current workspace (lets members see each other''s names).';

create function crm.my_workspace_ids() returns uuid[]
language sql stable security definer
set search_path = pg_catalog, public
as $$
  select array(select m.workspace_id from crm.verified_context() c join crm.memberships m on m.user_id = c.user_id)
$$;
comment on function crm.my_workspace_ids() is 'Every workspace the current user belongs to (for the workspace list and its role names).';

-- Policies that read crm.memberships through the helpers above.
create policy workspaces_select_member on crm.workspaces for select to crm_api
  using (id = any ((select crm.my_workspace_ids())::uuid[]));
comment on policy workspaces_select_member on crm.workspaces is 'A user sees the workspaces they belong to.';

create policy users_select_self_or_colleague on crm.users for select to crm_api
  using (id = (select crm.current_user_id()) or id = any ((select crm.colleague_ids())::uuid[]));
comment on policy users_select_self_or_colleague on crm.users is 'A user sees themself and the members of the current workspace.';
create policy roles_select_workspace on crm.roles for select to crm_api
  using (workspace_id = any ((select crm.my_workspace_ids())::uuid[]));
comment on policy roles_select_workspace on crm.roles is 'Members see the roles of their workspaces (the workspace list shows their role in each).';

-- ---------------------------------------------------------------------------------------------
-- Teams
create table crm.teams (
  workspace_id uuid not null references crm.workspaces (id) on delete cascade,
  id uuid not null default crm.uuid_v7(),
  name text not null constraint teams_name_length check (length(btrim(name)) between 1 and 100),
  created_at timestamptz not null default now(),
  primary key (workspace_id, id),
  constraint teams_name_key unique (workspace_id, name)
);
alter table crm.teams enable row level security;
comment on table crm.teams is 'Groups of members; the team scope covers records owned by anyone sharing a team with the user.';
create policy teams_select_workspace on crm.teams for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()));
comment on policy teams_select_workspace on crm.teams is 'Members see the teams of the current workspace.';
create policy teams_write_admin on crm.teams for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy teams_write_admin on crm.teams is 'Admins manage teams.';
grant select, insert, update, delete on crm.teams to crm_api;

create table crm.team_members (
  workspace_id uuid not null,
  team_id uuid not null,
  user_id uuid not null,
  primary key (workspace_id, team_id, user_id),
  foreign key (workspace_id, team_id) references crm.teams (workspace_id, id) on delete cascade,
  foreign key (workspace_id, user_id) references crm.memberships (workspace_id, user_id) on delete cascade
);
alter table crm.team_members enable row level security;
-- Serves crm.scope_owner_ids: the teams of the current user.
create index team_members_user_idx on crm.team_members (workspace_id, user_id);
comment on table crm.team_members is 'Which members belong to which teams.';
create policy team_members_select_workspace on crm.team_members for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()));
comment on policy team_members_select_workspace on crm.team_members is 'Members see who is in which team.';
create policy team_members_write_admin on crm.team_members for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy team_members_write_admin on crm.team_members is 'Admins change team membership.';
grant select, insert, update, delete on crm.team_members to crm_api;

create function crm.team_user_ids(p_user_id uuid, p_workspace_id uuid) returns uuid[]
language sql stable
as $$
  select array(
    select p_user_id
    union
    select mate.user_id
    from crm.team_members mine
    join crm.team_members mate on mate.workspace_id = mine.workspace_id and mate.team_id = mine.team_id
    where mine.workspace_id = p_workspace_id and mine.user_id = p_user_id
  )
$$;
comment on function crm.team_user_ids(uuid, uuid) is 'A user and everyone sharing a team with them in a workspace (internal; not granted to crm_api).';

grant execute on function crm.current_user_id(), crm.current_workspace_id(), crm.current_via(),
  crm.grant_scope(text, text), crm.current_team_user_ids(), crm.scope_owner_ids(text, text), crm.is_admin(),
  crm.colleague_ids(), crm.my_workspace_ids() to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Tokens and sessions
create table crm.tokens (
  id uuid primary key default crm.uuid_v7(),
  user_id uuid not null references crm.users (id) on delete cascade,
  kind text not null constraint tokens_kind_known check (kind in ('token', 'session')),
  name text not null constraint tokens_name_length check (length(name) between 1 and 200),
  token_hash bytea not null constraint tokens_token_hash_key unique,
  created_at timestamptz not null default now(),
  expires_at timestamptz not null,
  revoked_at timestamptz,
  last_used_at timestamptz
);
alter table crm.tokens enable row level security;
-- Serves /api/tokens and "revoke all".
create index tokens_user_idx on crm.tokens (user_id, created_at);
comment on table crm.tokens is 'Bearer tokens (kind token) and UI sessions (kind session); only a SHA-256 of the secret is stored.';
create policy tokens_select_own on crm.tokens for select to crm_api
  using (user_id = (select crm.current_user_id()));
comment on policy tokens_select_own on crm.tokens is 'A user sees their own tokens and sessions.';
create policy tokens_update_own on crm.tokens for update to crm_api
  using (user_id = (select crm.current_user_id())) with check (user_id = (select crm.current_user_id()));
comment on policy tokens_update_own on crm.tokens is 'A user revokes their own tokens and sessions.';
create policy tokens_insert_own on crm.tokens for insert to crm_api
  with check (user_id = (select crm.current_user_id()));
comment on policy tokens_insert_own on crm.tokens is 'A signed-in user creates API tokens for themself.';
grant select (id, user_id, kind, name, created_at, expires_at, revoked_at, last_used_at) on crm.tokens to crm_api;
grant insert (user_id, kind, name, token_hash, expires_at) on crm.tokens to crm_api;
grant update (revoked_at) on crm.tokens to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Sign-in throttling and two-factor material (reached only through SECURITY DEFINER functions)
create table crm.sign_in_failures (
  email text not null,
  failed_at timestamptz not null default now()
);
alter table crm.sign_in_failures enable row level security;
-- Serves the 5-failures-in-15-minutes check.
create index sign_in_failures_email_idx on crm.sign_in_failures (email, failed_at);
comment on table crm.sign_in_failures is 'Failed password checks by email (known or not), for throttling.';

create table crm.user_totp (
  user_id uuid primary key references crm.users (id) on delete cascade,
  secret_encrypted bytea not null,
  confirmed_at timestamptz,
  created_at timestamptz not null default now(),
  last_used_step bigint
);
alter table crm.user_totp enable row level security;
comment on table crm.user_totp is 'TOTP secrets, AES-256-GCM encrypted with a key derived from APP_SECRET; two-factor is on once confirmed_at is set.';

-- user_totp.last_used_step: a TOTP code signs in once. The code of a 30-second step stays valid
-- for about 90 s (one step of clock drift either way), so a code seen over someone's shoulder, or replayed from a proxy log,
-- would otherwise sign in again within that window. Each user's last accepted step is kept, and a
-- sign-in is accepted only with a later step.
comment on column crm.user_totp.last_used_step is 'The RFC 6238 time step of the last code accepted at sign-in; a code of this step or an earlier one is refused.';

create function crm.tg_user_totp__steps_only_forward() returns trigger
language plpgsql
as $$
begin
  if old.last_used_step is not null and (new.last_used_step is null or new.last_used_step <= old.last_used_step) then
    raise exception 'a TOTP step is used once: % is not after %', new.last_used_step, old.last_used_step
      using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return new;
end
$$;
create trigger tg_user_totp__steps_only_forward before update of last_used_step on crm.user_totp
  for each row execute function crm.tg_user_totp__steps_only_forward();
comment on function crm.tg_user_totp__steps_only_forward() is 'Refuses moving last_used_step back or setting it again to the same step: a code is accepted once.';

create table crm.recovery_codes (
  user_id uuid not null references crm.users (id) on delete cascade,
  code_hash bytea not null,
  used_at timestamptz,
  primary key (user_id, code_hash)
);
alter table crm.recovery_codes enable row level security;
comment on table crm.recovery_codes is 'Single-use recovery codes, SHA-256 hashed (they are high-entropy random strings).';

create table crm.two_factor_challenges (
  id uuid primary key default crm.uuid_v7(),
  user_id uuid not null references crm.users (id) on delete cascade,
  device_name text not null,
  attempts integer not null default 0,
  expires_at timestamptz not null,
  completed_at timestamptz
);
alter table crm.two_factor_challenges enable row level security;
comment on table crm.two_factor_challenges is 'Pending second steps of a sign-in; the signed challenge token names one row, which allows 5 tries.';

-- ---------------------------------------------------------------------------------------------
-- Rate limit: fixed one-minute windows, one counter row per (user, window, backend). Splitting by
-- backend pid means concurrent requests never wait on each other's row lock (a backend runs one
-- transaction at a time); the limit check sums the few rows of the window. Unlogged: counting a
-- request writes no WAL and needs no flush at commit (measured: auth went from 0.47 to 0.2 ms);
-- after a database crash the counters start again from zero, which only forgives one minute.
-- Every request rewrites its backend's counter row, and crm.authenticate sums the user's rows. At
-- the default fill factor a page collects a hundred dead versions before it is pruned and the sum
-- walks them all; with room kept free (fillfactor 10), PostgreSQL prunes the page as it goes
-- (profiled: the sum's cost fell by two thirds under 50 concurrent requests).
create unlogged table crm.rate_limit_counters (
  user_id uuid not null,
  window_start timestamptz not null,
  backend_pid integer not null,
  count integer not null,
  primary key (user_id, window_start, backend_pid)
) with (fillfactor = 10);
alter table crm.rate_limit_counters enable row level security;
comment on table crm.rate_limit_counters is 'Requests per user per clock-aligned minute, shared by every API process.';

-- =============================================================================================
-- Authentication: one call per request
--
-- crm.authenticate is one SQL statement: the checks, the rate-limit counter, the bookkeeping and the
-- proven context, in one plan. Every statement a PL/pgSQL function runs through SPI pays an
-- executor start-up, and the checks alone are about ten statements.
--
-- Its bookkeeping (the user's last workspace, the token's last use) changes a row about once a
-- minute per token; as UPDATE CTEs it would open, lock and initialise both tables and their indexes
-- on every request (measured: ~28 µs of its ~195 µs). So it is a function called from a CASE only
-- when something changes. Internal; runs with crm.authenticate's rights.
create function crm.touch_caller(p_user_id uuid, p_workspace_id uuid, p_set_workspace boolean, p_token_id uuid, p_touch_token boolean) returns boolean
language plpgsql volatile
as $$
begin
  if p_set_workspace then
    update crm.users set last_workspace_id = p_workspace_id where id = p_user_id;
  end if;
  if p_touch_token then
    update crm.tokens set last_used_at = now() where id = p_token_id;
  end if;
  return true;
end
$$;
comment on function crm.touch_caller(uuid, uuid, boolean, uuid, boolean) is
  'crm.authenticate''s bookkeeping: the user''s last workspace and the token''s last use, when they change (internal).';
revoke execute on function crm.touch_caller(uuid, uuid, boolean, uuid, boolean) from public;

-- Single-statement reads (GET one record, list and search) send crm.authenticate and their query as
-- one statement, on connections whose session role is crm_api from the start (row-level security
-- is fixed when a statement is planned, so the role cannot change inside the statement that
-- reads). Those connections call crm.authenticate as crm_api, so crm_api may execute it.
--
-- What this opens: crm.authenticate succeeds only for the SHA-256 of a live token, and crm_api
-- cannot read token hashes (crm.tokens grants it no token_hash column), so calling it directly
-- proves nothing that the HTTP API does not already accept.
create function crm.authenticate(p_token_hash bytea, p_slug text, p_via text, p_rate_limit integer)
returns table (
  failure text,
  user_id uuid,
  workspace_id uuid,
  workspace_slug text,
  token_id uuid,
  token_kind text,
  is_admin boolean,
  rate_count integer,
  rate_reset_seconds integer
)
language sql volatile security definer
set search_path = pg_catalog, public
-- With custom plans this statement would be planned again on every call; its generic plan is the
-- same index lookups.
set plan_cache_mode = force_generic_plan
-- Every lookup here has its index. The rate-limit counters are rewritten by every request, so the
-- planner's statistics see a small table and pick a sequential scan through all its row versions;
-- the (user_id, window_start, backend_pid) key reads only this user's rows.
set enable_seqscan = off
-- One row; the default estimate (1000) would make every single-statement read's plan cost a
-- thousand times its lateral query.
rows 1
as $$
  with caller as (
    select t.id as token_id, t.kind, t.revoked_at, t.expires_at, t.last_used_at,
           u.id as user_id, u.suspended_at, u.api_access, u.last_workspace_id
      from crm.tokens t join crm.users u on u.id = t.user_id
     where t.token_hash = p_token_hash
  ),
  -- The workspace named by the slug; without one, the last used, else the oldest joined, an active
  -- membership preferred over a suspended one.
  member as (
    select m.workspace_id, m.suspended_at, w.slug, r.is_admin
      from caller c
      join crm.memberships m on m.user_id = c.user_id
      join crm.workspaces w on w.id = m.workspace_id
      join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
     where p_slug is null or w.slug = p_slug
     order by (m.workspace_id = c.last_workspace_id) desc nulls last, (m.suspended_at is null) desc, m.joined_at
     limit 1
  ),
  verdict as (
    select c.token_id, c.kind, c.last_used_at, c.user_id, c.last_workspace_id, m.workspace_id, m.slug, m.is_admin,
           case
             when c.user_id is null then 'token_invalid'
             when c.revoked_at is not null then 'token_revoked'
             when c.expires_at <= now() then 'token_expired'
             -- A UI session works only through the UI (its cookie); copied into an Authorization
             -- header it is refused, so turning API access off cannot be side-stepped with it.
             when c.kind = 'session' and p_via is distinct from 'ui' then 'token_invalid'
             when c.suspended_at is not null then 'user_suspended'
             when c.kind = 'token' and not c.api_access then 'api_access_disabled'
             when m.workspace_id is null then 'workspace_not_found'
             when m.suspended_at is not null then 'user_suspended'
           end as failure
      from (select) as always_one_row
      left join caller c on true
      left join member m on true
  ),
  -- A request that passed the checks counts: this backend's counter goes up, and the other
  -- backends' counters for the same user and minute are added (this statement's snapshot does not
  -- see its own insert, so the new count comes from RETURNING).
  bumped as (
    insert into crm.rate_limit_counters as rc (user_id, window_start, backend_pid, count)
    select v.user_id, date_trunc('minute', now()), pg_backend_pid(), 1 from verdict v where v.failure is null
    on conflict (user_id, window_start, backend_pid) do update set count = rc.count + 1
    returning rc.count
  ),
  counted as (
    select v.*, (select b.count from bumped b) + coalesce((
             select sum(o.count)::integer from crm.rate_limit_counters o
              where o.user_id = v.user_id and o.window_start = date_trunc('minute', now()) and o.backend_pid <> pg_backend_pid()), 0) as rate_count
      from verdict v
  ),
  admitted as materialized (
    select k.* from counted k where k.failure is null and k.rate_count <= p_rate_limit
  ),
  -- The proven context, exactly as crm.set_context sets it (same message, same key), and the
  -- bookkeeping when it changes. A CTE with volatile calls is materialized, so it runs once, and
  -- only for an admitted caller.
  context as materialized (
    select set_config('crm.user_id', a.user_id::text, true) as user_id,
           set_config('crm.workspace_id', a.workspace_id::text, true) as workspace_id,
           set_config('crm.via', coalesce(p_via, 'api'), true) as via,
           set_config('crm.context_proof', encode(hmac(
             crm.context_message(a.user_id::text, a.workspace_id::text),
             (select s.value from crm.internal_secrets s where s.name = 'context_proof'),
             'sha256'), 'hex'), true) as proof,
           case when a.last_workspace_id is distinct from a.workspace_id
                  or a.last_used_at is null or a.last_used_at < now() - interval '1 minute'
                then crm.touch_caller(a.user_id, a.workspace_id, a.last_workspace_id is distinct from a.workspace_id,
                                      a.token_id, a.last_used_at is null or a.last_used_at < now() - interval '1 minute')
                else true
           end as touched
      from admitted a
  )
  select coalesce(k.failure, case when k.rate_count > p_rate_limit then 'rate_limited' end),
         case when x.proof is not null and x.touched then a.user_id end,
         a.workspace_id, a.slug, a.token_id, a.kind, a.is_admin,
         k.rate_count,
         greatest(1, ceil(extract(epoch from (date_trunc('minute', now()) + interval '1 minute' - now())))::integer)
    from counted k
    left join admitted a on true
    left join context x on true
$$;
comment on function crm.authenticate(bytea, text, text, integer) is
  'Per-request authentication in one call: token (expiry, revocation), user (suspension, API access), workspace choice (slug, else last used, else oldest joined), membership suspension, the rate-limit counter, last-used bookkeeping, and the proven request context. Returns failure = the API error code when refused.';
revoke execute on function crm.authenticate(bytea, text, text, integer) from public;
grant execute on function crm.authenticate(bytea, text, text, integer) to crm_api;

-- A request that fails after authentication rolls its transaction back, counter included; the
-- API then counts it again outside the transaction so failed requests still use up the limit.
create function crm.count_request(p_user_id uuid) returns void
language sql volatile security definer
set search_path = pg_catalog, public
as $$
  insert into crm.rate_limit_counters as c (user_id, window_start, backend_pid, count)
  values (p_user_id, date_trunc('minute', now()), pg_backend_pid(), 1)
  on conflict (user_id, window_start, backend_pid) do update set count = c.count + 1
$$;
comment on function crm.count_request(uuid) is 'Counts a request whose transaction rolled back against the user''s rate limit.';
revoke execute on function crm.count_request(uuid) from public;

-- =============================================================================================
-- DBA access: see exactly what a member sees
create function crm.act_as(p_email text, p_slug text) returns text
language plpgsql volatile
as $$
declare
  v_user_id uuid;
  v_workspace_id uuid;
begin
  select u.id, w.id into v_user_id, v_workspace_id
  from crm.users u
  join crm.memberships m on m.user_id = u.id
  join crm.workspaces w on w.id = m.workspace_id
  where u.email = lower(p_email) and w.slug = p_slug;
  if v_user_id is null then
    raise exception 'crm.act_as: % is not a member of workspace %', p_email, p_slug using errcode = 'CR404', hint = 'not_found';
  end if;
  perform crm.set_context(v_user_id, v_workspace_id, 'system');
  -- Invoker's rights: only a role allowed to run set_context (the owner, a superuser) gets here.
  perform set_config('role', 'crm_api', true);
  return format('acting as %s in %s until the end of this transaction', lower(p_email), p_slug);
end
$$;
comment on function crm.act_as(text, text) is
  'Inside a transaction (BEGIN ... ROLLBACK), makes every following query run as crm_api with the member''s proven context: you see exactly what they see through the API.';
revoke execute on function crm.act_as(text, text) from public;

-- =============================================================================================
-- Pre-authentication functions: sign-in and token issue. Executable by the owner role only (the
-- token endpoints run before there is a user to act as).
create function crm.sign_in_failures_recent(p_email text) returns table (failures integer, retry_after_seconds integer)
language sql stable
as $$
  select count(*)::integer,
         coalesce(ceil(extract(epoch from (min(failed_at) + interval '15 minutes' - now())))::integer, 0)
  from crm.sign_in_failures
  where email = lower(p_email) and failed_at > now() - interval '15 minutes'
$$;
comment on function crm.sign_in_failures_recent(text) is 'Failed sign-ins for an email in the last 15 minutes, and when the oldest of them leaves the window.';

create function crm.issue_token(p_user_id uuid, p_kind text, p_name text, p_token_hash bytea, p_ttl interval)
returns table (id uuid, expires_at timestamptz)
language sql volatile
as $$
  insert into crm.tokens (user_id, kind, name, token_hash, expires_at)
  values (p_user_id, p_kind, left(p_name, 200), p_token_hash, now() + p_ttl)
  returning id, expires_at
$$;
comment on function crm.issue_token(uuid, text, text, bytea, interval) is 'Stores a new token or session (its SHA-256 only).';

-- =============================================================================================
-- Audit views for DBAs (run with the owner's rights; not granted to crm_api)
create view crm.permission_matrix as
  select w.slug as workspace, r.name as role, g.resource, g.action, g.scope
  from crm.role_grants g
  join crm.roles r on r.workspace_id = g.workspace_id and r.id = g.role_id
  join crm.workspaces w on w.id = g.workspace_id;
comment on view crm.permission_matrix is 'Every grant of every role: workspace, role, resource, action, scope.';

create view crm.member_access as
  select w.slug as workspace, u.email, r.name as role, g.resource, g.action, g.scope
  from crm.memberships m
  join crm.users u on u.id = m.user_id
  join crm.workspaces w on w.id = m.workspace_id
  join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
  join crm.role_grants g on g.workspace_id = r.workspace_id and g.role_id = r.id
  where m.suspended_at is null and u.suspended_at is null;
comment on view crm.member_access is 'Effective access of every active member (suspended members and users have none).';

-- =============================================================================================
-- Housekeeping steps (crm.housekeeping, in 000001_foundation.sql, runs every crm.prune_* function).
create function crm.prune_tenancy(log_retention_days integer) returns bigint
language sql volatile
as $$
  with tokens as (delete from crm.tokens where expires_at < now() - interval '7 days' or revoked_at < now() - interval '7 days' returning 1),
       failures as (delete from crm.sign_in_failures where failed_at < now() - interval '15 minutes' returning 1),
       counters as (delete from crm.rate_limit_counters where window_start < now() - interval '2 minutes' returning 1),
       challenges as (delete from crm.two_factor_challenges where expires_at < now() - interval '1 hour' returning 1)
  select (select count(*) from tokens) + (select count(*) from failures) + (select count(*) from counters) + (select count(*) from challenges)
$$;
comment on function crm.prune_tenancy(integer) is 'Removes expired tokens (a week after expiry or revocation), old sign-in failures, rate-limit windows and challenges.';
