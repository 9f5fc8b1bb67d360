-- Scoped access (API.md section 4a): what a token may do is the intersection of its user's role
-- and the token's scopes, decided by the same row-level security as everything else.
--
-- The proven request context carries the token's scopes (crm.scopes) and, for an OAuth access
-- token, the app it was issued to (crm.oauth_app_id); the HMAC proof covers both, so a scope list
-- set, cleared or widened by hand reads as "nobody". The policy helpers intersect:
--   * crm.grant_scope / crm.scope_owner_ids answer for resource:action only when the scopes cover
--     it (view and export need <resource>:read or :write; create, update, delete and import need
--     <resource>:write), so every record policy applies the scopes without being rewritten;
--   * admin-only rules ask crm.is_admin_for(scope): the role's is_admin and, for a scoped token,
--     webhooks:manage (webhook subscriptions, deliveries, attempts) or workspace:admin (members,
--     roles and their grants, teams, invitations, OAuth apps).
-- A token without scopes (null) acts with its user's whole role, as before.
--
-- Every helper still verifies the proof once per call and policies call each helper once per
-- statement (an InitPlan): the scopes add two settings to read and a few bytes to the HMAC.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- =============================================================================================
-- What a scope list allows

-- Inlinable (one expression, immutable): policies pass it the list from crm.current_scopes().
create function crm.scopes_cover(p_scopes text[], p_resource text, p_action text) returns boolean
language sql immutable parallel safe
as $$
  select p_scopes is null
      or (p_resource || ':write') = any (p_scopes)
      or (p_action in ('view', 'export') and (p_resource || ':read') = any (p_scopes))
$$;
comment on function crm.scopes_cover(text[], text, text) is
  'Whether a token''s scopes allow resource:action (null = unscoped: everything the role allows). view and export need <resource>:read or :write; create, update, delete and import need <resource>:write.';
revoke execute on function crm.scopes_cover(text[], text, text) from public;
grant execute on function crm.scopes_cover(text[], text, text) to crm_api;

create function crm.scopes_include(p_scopes text[], p_scope text) returns boolean
language sql immutable parallel safe
as $$
  select p_scopes is null or p_scope = any (p_scopes)
$$;
comment on function crm.scopes_include(text[], text) is
  'Whether a token''s scopes hold one named scope such as workspace:admin (null = unscoped: yes).';
revoke execute on function crm.scopes_include(text[], text) from public;
grant execute on function crm.scopes_include(text[], text) to crm_api;

-- =============================================================================================
-- The request context and its proof: user, workspace, the token's scopes and app
--
-- The message: user / workspace / scopes / app / backend pid / transaction start. Scopes are the
-- text of the array ('' when unscoped), the app its uuid ('' for none); a null in any part makes
-- the whole message null, and a null HMAC never matches. Inlined into its callers; internal.
create function crm.context_message(p_user_id text, p_workspace_id text, p_scopes text, p_oauth_app_id text) returns bytea
language sql stable
as $$
  select convert_to(p_user_id || '/' || p_workspace_id || '/' || p_scopes || '/' || p_oauth_app_id || '/'
                    || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8')
$$;
comment on function crm.context_message(text, text, text, text) is
  'What crm.context_proof signs: user, workspace, scopes (array text, '''' when unscoped), OAuth app ('''' for none), backend pid and transaction start. Inlined into its callers; internal.';
revoke execute on function crm.context_message(text, text, text, text) from public;

-- The two-argument forms stay for callers that name them: an unscoped context without an app.
create or replace function crm.context_message(p_user_id text, p_workspace_id text) returns bytea
language sql stable
as $$
  select crm.context_message(p_user_id, p_workspace_id, '', '')
$$;
comment on function crm.context_message(text, text) is 'The message of an unscoped context without an OAuth app (crm.context_message with four arguments). Internal.';

create function crm.context_proof(p_user_id uuid, p_workspace_id uuid, p_scopes text[], p_oauth_app_id uuid) returns text
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select encode(
    public.hmac(crm.context_message(p_user_id::text, p_workspace_id::text, coalesce(p_scopes::text, ''), coalesce(p_oauth_app_id::text, '')),
                (select s.value from crm.internal_secrets s where s.name = 'context_proof'),
                'sha256'),
    'hex')
$$;
comment on function crm.context_proof(uuid, uuid, text[], uuid) is
  'HMAC binding a user, workspace, token scopes and OAuth app to this backend and this transaction; only SECURITY DEFINER code can compute it.';
revoke execute on function crm.context_proof(uuid, uuid, text[], uuid) from public;

create or replace function crm.context_proof(p_user_id uuid, p_workspace_id uuid) returns text
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select crm.context_proof(p_user_id, p_workspace_id, null, null)
$$;
comment on function crm.context_proof(uuid, uuid) is 'The proof of an unscoped context without an OAuth app.';

create function crm.set_context(p_user_id uuid, p_workspace_id uuid, p_via text, p_scopes text[], p_oauth_app_id uuid) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  perform set_config('crm.user_id', p_user_id::text, true);
  perform set_config('crm.workspace_id', p_workspace_id::text, true);
  perform set_config('crm.via', coalesce(p_via, 'api'), true);
  perform set_config('crm.scopes', coalesce(p_scopes::text, ''), true);
  perform set_config('crm.oauth_app_id', coalesce(p_oauth_app_id::text, ''), true);
  perform set_config('crm.context_proof', crm.context_proof(p_user_id, p_workspace_id, p_scopes, p_oauth_app_id), true);
end
$$;
comment on function crm.set_context(uuid, uuid, text, text[], uuid) is
  'Sets the transaction-local request context (user, workspace, via, token scopes, OAuth app) with its proof. Not executable by crm_api.';
revoke execute on function crm.set_context(uuid, uuid, text, text[], uuid) from public;

create or replace function crm.set_context(p_user_id uuid, p_workspace_id uuid, p_via text) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  perform crm.set_context(p_user_id, p_workspace_id, p_via, null, null);
end
$$;
comment on function crm.set_context(uuid, uuid, text) is 'Sets an unscoped request context without an OAuth app. Not executable by crm_api.';

-- The verified context gains the scopes and the app (a new result type: dropped and created again;
-- its callers resolve it when they run).
drop function crm.verified_context();
create function crm.verified_context(out user_id uuid, out workspace_id uuid, out scopes text[], out oauth_app_id uuid)
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_user text := current_setting('crm.user_id', true);
  v_workspace text := current_setting('crm.workspace_id', true);
  v_scopes text := coalesce(current_setting('crm.scopes', true), '');
  v_app text := coalesce(current_setting('crm.oauth_app_id', true), '');
  v_proof text := current_setting('crm.context_proof', true);
begin
  if v_proof is null or v_proof = '' or v_user !~ '^[0-9a-f-]{36}$' or v_workspace !~ '^[0-9a-f-]{36}$'
     or (v_app <> '' and v_app !~ '^[0-9a-f-]{36}$') then
    return;
  end if;
  if encode(public.hmac(crm.context_message(v_user, v_workspace, v_scopes, v_app),
                        (select s.value from crm.internal_secrets s where s.name = 'context_proof'),
                        'sha256'), 'hex') is distinct from v_proof then
    return;
  end if;
  user_id := v_user::uuid;
  workspace_id := v_workspace::uuid;
  -- Only a proven value gets here, and only crm.set_context and crm.authenticate write one.
  scopes := nullif(v_scopes, '')::text[];
  oauth_app_id := nullif(v_app, '')::uuid;
end
$$;
comment on function crm.verified_context() is
  'The (user, workspace, token scopes, OAuth app) of this transaction when its proof checks out; nulls otherwise. scopes null with a user = an unscoped token.';
revoke execute on function crm.verified_context() from public;

create or replace function crm.current_user_id() returns uuid
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  return (crm.verified_context()).user_id;
end
$$;

create or replace function crm.current_workspace_id() returns uuid
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  return (crm.verified_context()).workspace_id;
end
$$;

create function crm.current_scopes() returns text[]
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_context record := crm.verified_context();
begin
  -- Without a proven context: the empty list, which allows nothing.
  if v_context.user_id is null then return '{}'; end if;
  return v_context.scopes;
end
$$;
comment on function crm.current_scopes() is
  'The scopes of this transaction''s token: null for an unscoped token (the whole role), {} without a proven context. Pass it to crm.scopes_cover / crm.scopes_include as (select crm.current_scopes()).';
revoke execute on function crm.current_scopes() from public;
grant execute on function crm.current_scopes() to crm_api;

create function crm.current_oauth_app_id() returns uuid
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  return (crm.verified_context()).oauth_app_id;
end
$$;
comment on function crm.current_oauth_app_id() is 'The OAuth app whose access token this transaction acts with, or null (describes events; authorizes nothing).';
revoke execute on function crm.current_oauth_app_id() from public;
grant execute on function crm.current_oauth_app_id() to crm_api;

-- The role's grant, when the token's scopes cover the action.
create or replace function crm.grant_scope(p_resource text, p_action text) returns text
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_context record := crm.verified_context();
begin
  if v_context.user_id is null or not crm.scopes_cover(v_context.scopes, p_resource, p_action) then return null; end if;
  return crm.member_scope(v_context.user_id, v_context.workspace_id, p_resource, p_action);
end
$$;
comment on function crm.grant_scope(text, text) is
  'The scope (own, team, all) the current member''s role grants for resource:action, or null; null too when the token''s scopes do not cover the action. Read live, so role changes apply on the next statement.';

create or replace function crm.scope_owner_ids(p_resource text, p_action text) returns uuid[]
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_context record := crm.verified_context();
begin
  if v_context.user_id is null or not crm.scopes_cover(v_context.scopes, p_resource, p_action) then return '{}'; end if;
  return case crm.member_scope(v_context.user_id, v_context.workspace_id, p_resource, p_action)
           when 'own' then array[v_context.user_id]
           when 'team' then crm.team_user_ids(v_context.user_id, v_context.workspace_id)
           else '{}'::uuid[]
         end;
end
$$;
comment on function crm.scope_owner_ids(text, text) is
  'Owners whose records an own or team scope covers; empty for all (checked separately), no grant, or an action the token''s scopes do not cover.';

create or replace function crm.is_admin() returns boolean
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
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
comment on function crm.is_admin() is
  'Whether the current member''s role is an admin role, whatever the token''s scopes. Admin-only rules use crm.is_admin_for(scope) instead.';

create function crm.is_admin_for(p_scope text) returns boolean
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_context record := crm.verified_context();
begin
  if v_context.user_id is null or not crm.scopes_include(v_context.scopes, p_scope) then return false; end if;
  return coalesce((
    select r.is_admin
      from crm.memberships m
      join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
     where m.workspace_id = v_context.workspace_id and m.user_id = v_context.user_id and m.suspended_at is null), false);
end
$$;
comment on function crm.is_admin_for(text) is
  'Whether the current member''s role is an admin role and the token may use it for this scope: webhooks:manage (webhooks) or workspace:admin (members, roles, teams, invitations, OAuth apps). An unscoped token may.';
revoke execute on function crm.is_admin_for(text) from public;
grant execute on function crm.is_admin_for(text) to crm_api;

-- The ids among p_user_ids that are not members of the current workspace. An import checks its
-- owners with it: a token without workspace:admin sees only its own membership row, yet may give
-- records to colleagues (the owner foreign key would refuse a stranger; this names the row first).
create function crm.non_member_ids(p_user_ids uuid[]) returns uuid[]
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select array(
    select distinct u.id from unnest(p_user_ids) as u (id)
     where u.id is not null
       and not exists (select from crm.memberships m where m.workspace_id = (select crm.current_workspace_id()) and m.user_id = u.id)
     order by u.id)
$$;
comment on function crm.non_member_ids(uuid[]) is 'The ids among p_user_ids (nulls left out) that are not members of the current workspace (all of them without a proven context).';
revoke execute on function crm.non_member_ids(uuid[]) from public;
grant execute on function crm.non_member_ids(uuid[]) to crm_api;

-- =============================================================================================
-- Policies: admin-only rules ask for the scope that covers them

-- Members, roles and their grants, teams: workspace:admin.
drop policy roles_write_admin on crm.roles;
create policy roles_write_admin on crm.roles for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')));
comment on policy roles_write_admin on crm.roles is 'Admins manage custom roles (a scoped token needs workspace:admin).';

drop policy role_grants_write_admin on crm.role_grants;
create policy role_grants_write_admin on crm.role_grants for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')));
comment on policy role_grants_write_admin on crm.role_grants is 'Admins change the grants of custom roles (a scoped token needs workspace:admin).';

-- The member list is workspace administration: a scoped token without workspace:admin sees its own
-- memberships only (the API shows a non-admin only themself as well).
drop policy memberships_select_own_or_workspace on crm.memberships;
create policy memberships_select_own_or_workspace on crm.memberships for select to crm_api
  using (user_id = (select crm.current_user_id())
         or (workspace_id = (select crm.current_workspace_id()) and crm.scopes_include((select crm.current_scopes()), 'workspace:admin')));
comment on policy memberships_select_own_or_workspace on crm.memberships is
  'A user sees their own memberships and the members of the current workspace (a scoped token only with workspace:admin).';

drop policy memberships_write_admin on crm.memberships;
create policy memberships_write_admin on crm.memberships for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')));
comment on policy memberships_write_admin on crm.memberships is
  'Admins add, change, suspend and remove members of their workspace (a scoped token needs workspace:admin).';

drop policy teams_write_admin on crm.teams;
create policy teams_write_admin on crm.teams for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')));
comment on policy teams_write_admin on crm.teams is 'Admins manage teams (a scoped token needs workspace:admin).';

drop policy team_members_write_admin on crm.team_members;
create policy team_members_write_admin on crm.team_members for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')));
comment on policy team_members_write_admin on crm.team_members is 'Admins change team membership (a scoped token needs workspace:admin).';

-- Invitations and OAuth apps: workspace:admin.
drop policy invitations_all_admin on crm.invitations;
create policy invitations_all_admin on crm.invitations for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')));
comment on policy invitations_all_admin on crm.invitations is
  'Only admins see, create and withdraw the invitations of their workspace (a scoped token needs workspace:admin).';

drop policy invitation_teams_all_admin on crm.invitation_teams;
create policy invitation_teams_all_admin on crm.invitation_teams for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')));
comment on policy invitation_teams_all_admin on crm.invitation_teams is 'Follows crm.invitations: admins only (a scoped token needs workspace:admin).';

drop policy oauth_apps_all_admin on crm.oauth_apps;
create policy oauth_apps_all_admin on crm.oauth_apps for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin')));
comment on policy oauth_apps_all_admin on crm.oauth_apps is
  'Admins of the current workspace register, see and delete its apps (a scoped token needs workspace:admin); others see none.';

-- Webhooks: webhooks:manage.
drop policy webhook_subscriptions_all_admin on crm.webhook_subscriptions;
create policy webhook_subscriptions_all_admin on crm.webhook_subscriptions for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('webhooks:manage')))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('webhooks:manage')));
comment on policy webhook_subscriptions_all_admin on crm.webhook_subscriptions is
  'Admins of the current workspace see and manage its subscriptions (a scoped token needs webhooks:manage); everyone else sees none.';

drop policy webhook_deliveries_select_admin on crm.webhook_deliveries;
create policy webhook_deliveries_select_admin on crm.webhook_deliveries for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('webhooks:manage')));
comment on policy webhook_deliveries_select_admin on crm.webhook_deliveries is
  'Admins of the workspace read its delivery log (a scoped token needs webhooks:manage); writes go through SECURITY DEFINER functions only.';

drop policy webhook_attempts_select_admin on crm.webhook_attempts;
create policy webhook_attempts_select_admin on crm.webhook_attempts for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('webhooks:manage')));
comment on policy webhook_attempts_select_admin on crm.webhook_attempts is
  'Admins of the workspace read the attempts of its deliveries (a scoped token needs webhooks:manage).';

-- The webhook functions' gate: a non-admin is forbidden; an admin whose token lacks
-- webhooks:manage is told which scope is missing.
create or replace function crm.require_webhook_access() returns void
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  if not crm.is_admin() then
    raise exception 'webhooks are managed by workspace admins' using errcode = 'CR403', hint = 'forbidden';
  end if;
  if not crm.is_admin_for('webhooks:manage') then
    raise exception 'this token''s scopes do not include webhooks:manage' using errcode = 'CR403', hint = 'insufficient_scope';
  end if;
  if not crm.webhooks_enabled(crm.current_workspace_id()) then
    raise exception 'webhooks need the Pro plan or an active trial' using errcode = 'CR402', hint = 'plan_required';
  end if;
end
$$;
comment on function crm.require_webhook_access() is
  'Raises CR403 forbidden unless the caller is an admin, CR403 insufficient_scope when the token lacks webhooks:manage, then CR402 plan_required unless the workspace may use webhooks.';

-- Associations: linking two records changes what each shows, so a scoped token needs write on at
-- least one end's type (the API asks update on the addressed record) besides seeing both ends.
create function crm.scopes_cover_link(p_scopes text[], p_contact_id uuid, p_company_id uuid, p_deal_id uuid) returns boolean
language sql immutable parallel safe
as $$
  select p_scopes is null
      or (p_contact_id is not null and 'contacts:write' = any (p_scopes))
      or (p_company_id is not null and 'companies:write' = any (p_scopes))
      or (p_deal_id is not null and 'deals:write' = any (p_scopes))
$$;
comment on function crm.scopes_cover_link(text[], uuid, uuid, uuid) is 'Whether a token''s scopes may change a link: write on the type of one of its two ends (null = unscoped: yes).';
revoke execute on function crm.scopes_cover_link(text[], uuid, uuid, uuid) from public;
grant execute on function crm.scopes_cover_link(text[], uuid, uuid, uuid) to crm_api;

create policy associations_insert_scopes on crm.associations as restrictive for insert to crm_api
  with check (crm.scopes_cover_link((select crm.current_scopes()), contact_id, company_id, deal_id));
comment on policy associations_insert_scopes on crm.associations is 'A scoped token links records only with write on one end''s type.';
create policy associations_delete_scopes on crm.associations as restrictive for delete to crm_api
  using (crm.scopes_cover_link((select crm.current_scopes()), contact_id, company_id, deal_id));
comment on policy associations_delete_scopes on crm.associations is 'A scoped token unlinks records only with write on one end''s type.';

-- Tokens: a scoped token creates only tokens within its own scopes, and an OAuth access token
-- none at all (an app's access must not outlive the app's revocation as a personal token).
drop policy tokens_insert_own on crm.tokens;
create policy tokens_insert_own on crm.tokens for insert to crm_api
  with check (user_id = (select crm.current_user_id())
              and (select crm.current_oauth_app_id()) is null
              and ((select crm.current_scopes()) is null or scopes <@ (select crm.current_scopes())));
comment on policy tokens_insert_own on crm.tokens is
  'A signed-in user creates API tokens for themself; a scoped token only within its own scopes, an OAuth access token not at all.';

-- =============================================================================================
-- Imports land as the token that started them: the scopes and app of the queueing request are
-- kept with the import and restored in every batch's context, so an import cannot do more than
-- the token that queued it (a contacts:write token cannot create companies through an import).
alter table crm.imports add column token_scopes text[];
alter table crm.imports add column oauth_app_id uuid;
comment on column crm.imports.token_scopes is 'The scopes of the token that queued the import (null: unscoped); its batches land within them.';
comment on column crm.imports.oauth_app_id is 'The OAuth app through which the import was queued, if any (its events name the app).';

-- An import holds the file's rows of its record type: a scoped token sees it only with the
-- import action on that type (<type>:write).
drop policy imports_select_own_or_admin on crm.imports;
create policy imports_select_own_or_admin on crm.imports for select to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and (user_id = (select crm.current_user_id()) or (select crm.is_admin()))
         and crm.scopes_cover((select crm.current_scopes()), record_type, 'import'));
comment on policy imports_select_own_or_admin on crm.imports is
  'An import is seen by the member who uploaded it and by admins; by a scoped token only with write on its record type.';

-- Staged rows and errors name no record type: they follow their import's visibility for a scoped
-- token (an unscoped one never reaches the lookup).
drop policy import_rows_select_own_or_admin on crm.import_rows;
create policy import_rows_select_own_or_admin on crm.import_rows for select to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and (user_id = (select crm.current_user_id()) or (select crm.is_admin()))
         and ((select crm.current_scopes()) is null
              or exists (select from crm.imports i where i.workspace_id = import_rows.workspace_id and i.id = import_rows.import_id)));
comment on policy import_rows_select_own_or_admin on crm.import_rows is 'Staged rows are seen like their import.';

drop policy import_errors_select_own_or_admin on crm.import_errors;
create policy import_errors_select_own_or_admin on crm.import_errors for select to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and (user_id = (select crm.current_user_id()) or (select crm.is_admin()))
         and ((select crm.current_scopes()) is null
              or exists (select from crm.imports i where i.workspace_id = import_errors.workspace_id and i.id = import_errors.import_id)));
comment on policy import_errors_select_own_or_admin on crm.import_errors is 'Errors are seen like their import.';

create or replace function crm.queue_import(p_import_id uuid, p_mapping jsonb, p_mode text, p_match_on text, p_dry_run boolean) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_context record := crm.verified_context();
  v_workspace uuid := v_context.workspace_id;
  v_record_type text;
  v_status text;
  v_dry_run boolean;
  v_available boolean;
begin
  select i.record_type, i.status, i.dry_run, (i.staged or i.file_bytes is not null)
    into v_record_type, v_status, v_dry_run, v_available
    from crm.imports i
   where i.workspace_id = v_workspace and i.id = p_import_id and i.user_id = v_context.user_id
     for update;
  if not found then
    raise exception 'no such import' using errcode = 'CR404', hint = 'not_found';
  end if;
  if crm.grant_scope(v_record_type, 'import') is null then
    raise exception 'your role has no % import grant', v_record_type using errcode = 'CR403', hint = 'forbidden';
  end if;
  if p_mode = 'upsert' and crm.grant_scope(v_record_type, 'update') is null then
    raise exception 'an upsert needs the % update grant', v_record_type using errcode = 'CR403', hint = 'forbidden';
  end if;
  -- A file runs once for real; after a dry run it may run again (for real or dry).
  if not (v_status = 'uploaded' or (v_status in ('completed', 'failed') and v_dry_run)) then
    raise exception 'this import has already been started (status %)', v_status using errcode = 'CR409', hint = 'import_already_started';
  end if;
  if not v_available then
    raise exception 'the file of this import has been removed; upload it again' using errcode = 'CR409', hint = 'import_file_removed';
  end if;
  delete from crm.import_errors e where e.workspace_id = v_workspace and e.import_id = p_import_id;
  update crm.imports i
     set status = 'queued', mapping = p_mapping, mode = p_mode, match_on = p_match_on, dry_run = p_dry_run,
         last_row_done = 0, created = 0, updated = 0, skipped = 0, failed = 0, companies_created = 0,
         failure = null, queued_at = now(), started_at = null, finished_at = null,
         token_scopes = v_context.scopes, oauth_app_id = v_context.oauth_app_id
   where i.workspace_id = v_workspace and i.id = p_import_id;
  perform graphile_worker.add_job('process_import',
    json_build_object('workspace_id', v_workspace, 'import_id', p_import_id),
    max_attempts => 5, job_key => 'process_import:' || p_import_id::text);
end
$$;
comment on function crm.queue_import(uuid, jsonb, text, text, boolean) is
  'Starts an import: checks the import grant (and update for upsert) of the caller, records the options and the token''s scopes and app, and adds the process_import job in the same transaction.';

create or replace function crm.begin_import_batch(p_workspace_id uuid, p_import_id uuid)
returns table (status text, record_type text, columns text[], mapping jsonb, mode text, match_on text, dry_run boolean, last_row_done integer)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_user uuid;
  v_scopes text[];
  v_app uuid;
begin
  -- Column by column: never drags the file (file_bytes) into the function.
  select i.user_id, i.token_scopes, i.oauth_app_id, i.status, i.record_type, i.columns, i.mapping, i.mode, i.match_on, i.dry_run, i.last_row_done
    into v_user, v_scopes, v_app, status, record_type, columns, mapping, mode, match_on, dry_run, last_row_done
    from crm.imports i where i.workspace_id = p_workspace_id and i.id = p_import_id
     for update;
  if not found then
    raise exception 'no such import' using errcode = 'CR404', hint = 'not_found';
  end if;
  if not exists (select from crm.memberships m join crm.users u on u.id = m.user_id
                  where m.workspace_id = p_workspace_id and m.user_id = v_user
                    and m.suspended_at is null and u.suspended_at is null) then
    raise exception 'the importing member is suspended or has left the workspace' using errcode = 'CR403', hint = 'forbidden';
  end if;
  perform crm.set_context(v_user, p_workspace_id, 'import', v_scopes, v_app);
  perform set_config('crm.import_id', p_import_id::text, true);
  perform set_config('crm.import_proof', crm.import_proof(p_import_id), true);
  if crm.grant_scope(record_type, 'import') is null then
    raise exception 'the importing member''s role has no % import grant', record_type using errcode = 'CR403', hint = 'forbidden';
  end if;
  if mode = 'upsert' and crm.grant_scope(record_type, 'update') is null then
    raise exception 'the importing member''s role has no % update grant (needed for upsert)', record_type using errcode = 'CR403', hint = 'forbidden';
  end if;
  if status = 'queued' then
    update crm.imports i set status = 'processing', started_at = coalesce(i.started_at, now())
     where i.workspace_id = p_workspace_id and i.id = p_import_id;
    status := 'processing';
  end if;
  return next;
end
$$;
comment on function crm.begin_import_batch(uuid, uuid) is
  'Worker only: opens an import batch as the importing user (via import, within the scopes of the token that queued it), after checking membership and grants; locks the import row.';

-- =============================================================================================
-- Events: a change made through an OAuth app names the app.
create or replace function crm.event_actor() returns jsonb
language sql stable
as $$
  select case when c.user_id is null
              then jsonb_build_object('type', 'system', 'id', null, 'via', 'system')
              when c.app_id is not null
              then jsonb_build_object('type', 'user', 'id', c.user_id,
                                      'via', case when c.via = 'api' then 'oauth' else c.via end, 'app_id', c.app_id)
              else jsonb_build_object('type', 'user', 'id', c.user_id, 'via', c.via)
         end
    from (select crm.current_user_id() as user_id, crm.current_oauth_app_id() as app_id, coalesce(crm.current_via(), 'api') as via) c
$$;
comment on function crm.event_actor() is
  'The actor of an event from the request context: the user and how they came in (api, ui, import; oauth with app_id for an OAuth app''s access token, an import queued through an app keeps via import and names the app), or system.';

-- =============================================================================================
-- Authentication: the token's scopes, its bound workspace and its app
--
-- As before, one SQL statement (see sql/000002_tenancy.sql for why). What changes:
--   * a token bound to a workspace (OAuth access tokens) works only there: X-Tenant-Slug naming
--     another workspace finds no membership (workspace_not_found), and without the header the
--     bound workspace is chosen;
--   * kind oauth is an API token like kind token (API access off stops both);
--   * the proven context carries the scopes and the app, and both are returned.
-- A new result type: dropped and created again (single-statement reads name it in their text).
drop function crm.authenticate(bytea, text, text, integer);
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
  rate_reset_seconds integer,
  scopes text[],
  oauth_app_id uuid
)
language sql volatile security definer
set search_path = pg_catalog, crm, pg_temp
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
    select t.id as token_id, t.kind, t.revoked_at, t.expires_at, t.last_used_at, t.scopes, t.oauth_app_id,
           t.workspace_id as bound_workspace_id,
           u.id as user_id, u.suspended_at, u.api_access, u.last_workspace_id
      from crm.tokens t join crm.users u on u.id = t.user_id
     where t.token_hash = p_token_hash
  ),
  -- The workspace named by the slug; without one, the last used, else the oldest joined, an active
  -- membership preferred over a suspended one. A bound token knows only its workspace.
  member as (
    select m.workspace_id, m.suspended_at, w.slug, r.is_admin
      from caller c
      join crm.memberships m on m.user_id = c.user_id
      join crm.workspaces w on w.id = m.workspace_id
      join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
     where (p_slug is null or w.slug = p_slug)
       and (c.bound_workspace_id is null or m.workspace_id = c.bound_workspace_id)
     order by (m.workspace_id = c.last_workspace_id) desc nulls last, (m.suspended_at is null) desc, m.joined_at
     limit 1
  ),
  verdict as (
    select c.token_id, c.kind, c.last_used_at, c.user_id, c.last_workspace_id, c.scopes, c.oauth_app_id,
           m.workspace_id, m.slug, m.is_admin,
           case
             when c.user_id is null then 'token_invalid'
             when c.revoked_at is not null then 'token_revoked'
             when c.expires_at <= now() then 'token_expired'
             -- A UI session works only through the UI (its cookie); copied into an Authorization
             -- header it is refused, so turning API access off cannot be side-stepped with it.
             when c.kind = 'session' and p_via is distinct from 'ui' then 'token_invalid'
             when c.suspended_at is not null then 'user_suspended'
             when c.kind in ('token', 'oauth') and not c.api_access then 'api_access_disabled'
             when m.workspace_id is null then 'workspace_not_found'
             when m.suspended_at is not null then 'user_suspended'
           end as failure
      from (select) as always_one_row
      left join caller c on true
      left join member m on true
  ),
  -- A request that passed the checks counts: this backend's counter goes up, and the other
  -- backends' counters for the same user and minute are added (this statement's snapshot does not
  -- see its own insert, so the new count comes from RETURNING). Counted per user, whatever the
  -- token: a scoped token or an app's access token shares its user's limit.
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
           set_config('crm.scopes', coalesce(a.scopes::text, ''), true) as scopes,
           set_config('crm.oauth_app_id', coalesce(a.oauth_app_id::text, ''), true) as oauth_app_id,
           set_config('crm.context_proof', encode(public.hmac(
             crm.context_message(a.user_id::text, a.workspace_id::text, coalesce(a.scopes::text, ''), coalesce(a.oauth_app_id::text, '')),
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
         greatest(1, ceil(extract(epoch from (date_trunc('minute', now()) + interval '1 minute' - now())))::integer),
         a.scopes, a.oauth_app_id
    from counted k
    left join admitted a on true
    left join context x on true
$$;
comment on function crm.authenticate(bytea, text, text, integer) is
  'Per-request authentication in one call: token (expiry, revocation, bound workspace), user (suspension, API access), workspace choice (slug, else last used, else oldest joined), membership suspension, the rate-limit counter, last-used bookkeeping, and the proven request context with the token''s scopes and OAuth app. Returns failure = the API error code when refused.';
revoke execute on function crm.authenticate(bytea, text, text, integer) from public;
grant execute on function crm.authenticate(bytea, text, text, integer) to crm_api;

-- =============================================================================================
-- DBA access: act as a member, optionally through a scoped token
create function crm.act_as(p_email text, p_slug text, scopes text[]) returns text
language plpgsql volatile
as $$
declare
  v_user_id uuid;
  v_workspace_id uuid;
begin
  if act_as.scopes is not null and not crm.scopes_are_valid(act_as.scopes) then
    raise exception 'crm.act_as: scopes must be 1 to 9 distinct names of crm.known_scopes()' using errcode = 'CR422', hint = 'validation_failed';
  end if;
  select u.id, w.id into v_user_id, v_workspace_id
  from crm.users u
  join crm.memberships m on m.user_id = u.id
  join crm.workspaces w on w.id = m.workspace_id
  where u.email = lower(p_email) and w.slug = p_slug;
  if v_user_id is null then
    raise exception 'crm.act_as: % is not a member of workspace %', p_email, p_slug using errcode = 'CR404', hint = 'not_found';
  end if;
  perform crm.set_context(v_user_id, v_workspace_id, 'system', act_as.scopes, null);
  -- Invoker's rights: only a role allowed to run set_context (the owner, a superuser) gets here.
  perform set_config('role', 'crm_api', true);
  return format('acting as %s in %s%s until the end of this transaction', lower(p_email), p_slug,
                case when act_as.scopes is null then '' else ' with scopes ' || array_to_string(act_as.scopes, ' ') end);
end
$$;
comment on function crm.act_as(text, text, text[]) is
  'Inside a transaction (BEGIN ... ROLLBACK), makes every following query run as crm_api with the member''s proven context, limited to the given token scopes (null: the whole role): you see exactly what such a token sees through the API.';
revoke execute on function crm.act_as(text, text, text[]) from public;

create or replace function crm.act_as(p_email text, p_slug text) returns text
language plpgsql volatile
as $$
begin
  return crm.act_as(p_email, p_slug, scopes => null);
end
$$;
comment on function crm.act_as(text, text) is
  'crm.act_as without scopes: every following query of the transaction runs as crm_api with the member''s whole role, as their unscoped tokens and sessions do.';

-- =============================================================================================
-- Audit views: what each scope allows, and what every live scoped token may do
create view crm.scope_actions as
  select s.scope, r.resource, a.action
    from unnest(crm.known_scopes()) with ordinality as s (scope, position),
         unnest(array['contacts', 'companies', 'deals']) as r (resource),
         unnest(array['view', 'create', 'update', 'delete', 'import', 'export']) as a (action)
   where crm.scopes_cover(array[s.scope], r.resource, a.action)
   order by s.position, r.resource, a.action;
comment on view crm.scope_actions is 'Every resource:action each record scope allows (crm.scopes_cover); a token may do the intersection of these with its role''s grants.';

-- crm.member_access is a member's whole role (their sessions and unscoped tokens); a scoped
-- token's effective access is narrower and listed here, one row per grant it keeps, plus the admin
-- areas its scopes open when the role is an admin role.
create view crm.token_access as
  with live as (
    select t.id, t.kind, t.name, t.scopes, t.user_id, t.workspace_id as bound_workspace_id, t.oauth_app_id, u.email
      from crm.tokens t
      join crm.users u on u.id = t.user_id
     where t.scopes is not null and t.revoked_at is null and t.expires_at > now()
       and u.suspended_at is null and u.api_access
  ),
  membership as (
    select l.*, w.slug, m.workspace_id, m.role_id, r.is_admin, a.name as app
      from live l
      join crm.memberships m on m.user_id = l.user_id and (l.bound_workspace_id is null or m.workspace_id = l.bound_workspace_id)
      join crm.workspaces w on w.id = m.workspace_id
      join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
      left join crm.oauth_apps a on a.workspace_id = l.bound_workspace_id and a.id = l.oauth_app_id
     where m.suspended_at is null
  )
  select b.slug as workspace, b.email, b.id as token_id, b.kind, b.name as token_name, b.app, b.scopes,
         g.resource, g.action, g.scope
    from membership b
    join crm.role_grants g on g.workspace_id = b.workspace_id and g.role_id = b.role_id
   where crm.scopes_cover(b.scopes, g.resource, g.action)
  union all
  select b.slug, b.email, b.id, b.kind, b.name, b.app, b.scopes, split_part(s.scope, ':', 1), split_part(s.scope, ':', 2), 'all'
    from membership b
    cross join unnest(array['webhooks:manage', 'workspace:admin']) as s (scope)
   where b.is_admin and s.scope = any (b.scopes);
comment on view crm.token_access is
  'Effective access of every live scoped token (unscoped tokens have their member''s crm.member_access): workspace, email, token, kind, name, OAuth app, its scopes, then resource, action, scope (own, team, all) for each role grant the scopes keep, and webhooks:manage / workspace:admin as resource:action with scope all when the role is an admin role.';
