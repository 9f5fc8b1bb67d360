-- Workspace administration: invitations, and the rules that sign-up, invitations, members and roles
-- need (the seat limit, a workspace always keeps an active admin, a role in use is kept), with the
-- pre-authentication helpers of sign-up and invitation acceptance.

-- Transaction-local limits, as in every migration: waiting long for a lock would hold up every
-- query queued behind the migration, and no statement here should run for long.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- ---------------------------------------------------------------------------------------------
-- Invitations
create table crm.invitations (
  workspace_id uuid not null references crm.workspaces (id) on delete cascade,
  id uuid not null default crm.uuid_v7(),
  email text not null
    constraint invitations_email_format check (email = lower(email) and email ~ '^[^@\s]+@[^@\s]+\.[^@\s]+$' and length(email) <= 254),
  role_id uuid not null,
  token_hash bytea not null constraint invitations_token_hash_key unique,
  invited_by uuid references crm.users (id) on delete set null,
  created_at timestamptz not null default now(),
  expires_at timestamptz not null,
  accepted_at timestamptz,
  accepted_by uuid references crm.users (id) on delete set null,
  primary key (workspace_id, id),
  -- Deleting a role is refused while a pending invitation names it (tg_roles__refuse_delete_in_use);
  -- the cascade only removes accepted ones, which are history.
  foreign key (workspace_id, role_id) references crm.roles (workspace_id, id) on delete cascade
);
alter table crm.invitations enable row level security;
-- One pending invitation per address: inviting again replaces it (the API deletes the old one first).
create unique index invitations_pending_email_key on crm.invitations (workspace_id, email) where accepted_at is null;
-- Serves "is this role named by a pending invitation" (role deletion).
create index invitations_role_idx on crm.invitations (workspace_id, role_id) where accepted_at is null;
comment on table crm.invitations is 'Invitations to join a workspace: a single-use secret (SHA-256 stored), valid 7 days, with the role and teams the member gets.';
comment on column crm.invitations.token_hash is 'SHA-256 of the secret in accept_url; the secret itself is shown once, to the inviting admin (and mailed when SMTP_URL is set).';

create table crm.invitation_teams (
  workspace_id uuid not null,
  invitation_id uuid not null,
  team_id uuid not null,
  primary key (workspace_id, invitation_id, team_id),
  foreign key (workspace_id, invitation_id) references crm.invitations (workspace_id, id) on delete cascade,
  foreign key (workspace_id, team_id) references crm.teams (workspace_id, id) on delete cascade
);
alter table crm.invitation_teams enable row level security;
-- Serves the cascade when a team is deleted.
create index invitation_teams_team_idx on crm.invitation_teams (workspace_id, team_id);
comment on table crm.invitation_teams is 'Teams an invited member joins on acceptance (a team deleted meanwhile is simply dropped).';

create policy invitations_all_admin on crm.invitations for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy invitations_all_admin on crm.invitations is 'Only admins see, create and withdraw the invitations of their workspace.';
create policy invitation_teams_all_admin on crm.invitation_teams for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy invitation_teams_all_admin on crm.invitation_teams is 'Follows crm.invitations: admins only.';

-- Acceptance runs as the owner role (the invitee is not a member yet), so crm_api never updates.
grant select (workspace_id, id, email, role_id, invited_by, created_at, expires_at, accepted_at, accepted_by) on crm.invitations to crm_api;
grant insert (workspace_id, email, role_id, token_hash, invited_by, expires_at), delete on crm.invitations to crm_api;
grant select, insert, delete on crm.invitation_teams to crm_api;

create function crm.prune_invitations(log_retention_days integer) returns bigint
language sql volatile
as $$
  with gone as (
    delete from crm.invitations
    where accepted_at is null and expires_at < now() - make_interval(days => log_retention_days)
    returning 1)
  select count(*) from gone
$$;
comment on function crm.prune_invitations(integer) is 'Removes invitations that expired unaccepted more than the retention period ago (they stay listed as expired until then).';

-- ---------------------------------------------------------------------------------------------
-- Seats and the last admin
--
-- These triggers run with the owner's rights (SECURITY DEFINER), whoever fires them: as crm_api,
-- the seat check's SELECT ... FOR UPDATE on crm.workspaces would need an UPDATE grant crm_api does
-- not have, and the last-admin check would read crm.workspaces through RLS, which hides the
-- workspace from an admin the moment their own membership is deleted (so the last admin could
-- remove themself). Both must see the workspace as it is.
create function crm.tg_memberships__check_seats() returns trigger
language plpgsql security definer
set search_path = pg_catalog, public
as $$
declare
  v_limit integer;
  v_used integer;
begin
  if new.suspended_at is not null or (tg_op = 'UPDATE' and old.suspended_at is null) then
    return new;
  end if;
  -- Lock the workspace row so two concurrent joins cannot both take the last seat.
  select seat_limit into v_limit from crm.workspaces where id = new.workspace_id for update;
  if v_limit is null then return new; end if;
  select count(*) into v_used from crm.memberships
  where workspace_id = new.workspace_id and suspended_at is null and user_id <> new.user_id;
  if v_used >= v_limit then
    raise exception 'no seat left: % of % seats are in use', v_used, v_limit using errcode = 'CR422', hint = 'seat_limit_reached';
  end if;
  return new;
end
$$;
create trigger tg_memberships__check_seats before insert or update of suspended_at on crm.memberships
  for each row execute function crm.tg_memberships__check_seats();
comment on function crm.tg_memberships__check_seats() is 'Active members may not exceed the workspace seat limit (on join and on unsuspend).';

create function crm.tg_memberships__keep_an_admin() returns trigger
language plpgsql security definer
set search_path = pg_catalog, public
as $$
begin
  if exists (select 1 from crm.workspaces where id = old.workspace_id)
     and exists (select 1 from crm.roles r where r.workspace_id = old.workspace_id and r.id = old.role_id and r.is_admin)
     and not exists (
       select 1 from crm.memberships m join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
       where m.workspace_id = old.workspace_id and r.is_admin and m.suspended_at is null) then
    raise exception 'the last admin of a workspace cannot be removed, demoted or suspended' using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return null;
end
$$;
create trigger tg_memberships__keep_an_admin after update of role_id, suspended_at or delete on crm.memberships
  for each row execute function crm.tg_memberships__keep_an_admin();
comment on function crm.tg_memberships__keep_an_admin() is 'A workspace always keeps at least one active admin.';

-- ---------------------------------------------------------------------------------------------
-- Roles: one in use is kept; a custom admin role keeps the workspace's last admin.
create function crm.tg_roles__refuse_delete_in_use() returns trigger
language plpgsql security definer
set search_path = pg_catalog, public
as $$
begin
  -- A workspace being deleted takes its roles with it: only a role of a live workspace is checked.
  if exists (select 1 from crm.workspaces where id = old.workspace_id)
     and (exists (select 1 from crm.memberships where workspace_id = old.workspace_id and role_id = old.id)
          or exists (select 1 from crm.invitations where workspace_id = old.workspace_id and role_id = old.id and accepted_at is null)) then
    raise exception 'role % is in use by members or pending invitations; give them another role first', old.name
      using errcode = 'CR409', hint = 'role_in_use';
  end if;
  return old;
end
$$;
-- Named to sort after tg_roles__protect_builtin, so a built-in role answers 422 first.
create trigger tg_roles__refuse_delete_in_use before delete on crm.roles
  for each row execute function crm.tg_roles__refuse_delete_in_use();
comment on function crm.tg_roles__refuse_delete_in_use() is 'A role held by a member or named by a pending invitation cannot be deleted (409 role_in_use).';

create function crm.tg_roles__keep_an_admin() returns trigger
language plpgsql security definer
set search_path = pg_catalog, public
as $$
begin
  if old.is_admin and not new.is_admin and not exists (
       select 1 from crm.memberships m join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
       where m.workspace_id = new.workspace_id and r.is_admin and m.suspended_at is null) then
    raise exception 'the last admin of a workspace cannot be demoted' using errcode = 'CR422', hint = 'validation_failed', detail = '/is_admin';
  end if;
  return null;
end
$$;
create trigger tg_roles__keep_an_admin after update of is_admin on crm.roles
  for each row execute function crm.tg_roles__keep_an_admin();
comment on function crm.tg_roles__keep_an_admin() is 'Turning is_admin off on a custom role must leave the workspace an active admin (the membership trigger cannot see this change).';

-- ---------------------------------------------------------------------------------------------
-- Pre-authentication helpers for sign-up and invitation acceptance (owner role only).
create function crm.free_workspace_slug(p_base text) returns text
language sql stable
as $$
  select candidate
  from (select p_base as candidate, 1 as n
        union all
        select left(p_base, 56) || '-' || n, n from generate_series(2, 100000) n) c
  where not exists (select 1 from crm.workspaces w where w.slug = c.candidate)
  order by n
  limit 1
$$;
comment on function crm.free_workspace_slug(text) is 'The first free slug of base, base-2, base-3, ... (sign-up retries on the rare race for the same one).';

create function crm.token_user(p_token_hash bytea) returns table (failure text, user_id uuid)
language sql stable
as $$
  select case
           when t.id is null then 'token_invalid'
           when t.revoked_at is not null then 'token_revoked'
           when t.expires_at <= now() then 'token_expired'
           when u.suspended_at is not null then 'user_suspended'
           when t.kind = 'token' and not u.api_access then 'api_access_disabled'
         end,
         u.id
  from (select 1) one
  left join crm.tokens t on t.token_hash = p_token_hash
  left join crm.users u on u.id = t.user_id
$$;
comment on function crm.token_user(bytea) is 'Who a bearer token proves, without choosing a workspace (invitation acceptance by an existing user, who may belong to none yet); failure is the API error code when refused.';
