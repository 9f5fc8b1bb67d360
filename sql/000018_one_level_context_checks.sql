-- The policy helpers check the context's proof in their own body instead of calling
-- crm.verified_context, another SECURITY DEFINER function: each helper a policy runs is then one
-- function call instead of two or three (PL/pgSQL → SQL → the check), about 20 µs less of
-- PostgreSQL per helper and statement (docs/performance.md). The check itself is unchanged: the
-- HMAC of the settings with the key only the owner reads, bound to this backend and transaction.
-- crm.my_workspace_ids (000012, the workspace list only) keeps calling crm.verified_context.
--
-- It is written once, in crm.proven_context: a plain SQL set-returning function, which PostgreSQL
-- inlines into the query of each helper that selects from it (it must stay SQL, non-strict, not
-- SECURITY DEFINER and without SET clauses to be inlined). Inlined, it runs with the helper's
-- rights, the owner's; called on its own it runs with the caller's, and crm_api may neither call
-- it nor read the key it needs.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create function crm.proven_context()
returns table (user_id uuid, workspace_id uuid, scopes text[], oauth_app_id uuid)
language sql stable rows 1
as $$
  -- One row always; a value the proof does not cover never reaches a cast. offset 0 keeps the
  -- check one computation rather than one per column.
  select case when v.proven then c.u::uuid end, case when v.proven then c.w::uuid end,
         case when v.proven then nullif(c.s, '')::text[] end, case when v.proven then nullif(c.a, '')::uuid end
    from (select pg_catalog.current_setting('crm.user_id', true) as u, pg_catalog.current_setting('crm.workspace_id', true) as w,
                 coalesce(pg_catalog.current_setting('crm.scopes', true), '') as s,
                 coalesce(pg_catalog.current_setting('crm.oauth_app_id', true), '') as a,
                 pg_catalog.current_setting('crm.context_proof', true) as p) c,
         lateral (select pg_catalog.encode(public.hmac(crm.context_message(c.u, c.w, c.s, c.a),
                                                       (select k.value from crm.internal_secrets k where k.name = 'context_proof'),
                                                       'sha256'), 'hex') = c.p as proven
                  offset 0) v
$$;
comment on function crm.proven_context() is
  'The (user, workspace, token scopes, OAuth app) of this transaction when its proof checks out; nulls otherwise. Inlined into the SECURITY DEFINER helpers that select from it (internal; crm_api calls those).';
revoke execute on function crm.proven_context() from public;

create or replace function crm.verified_context(out user_id uuid, out workspace_id uuid, out scopes text[], out oauth_app_id uuid)
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select c.user_id, c.workspace_id, c.scopes, c.oauth_app_id from crm.proven_context() c
$$;

create or replace function crm.current_user_id() returns uuid
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select c.user_id from crm.proven_context() c
$$;

create or replace function crm.current_workspace_id() returns uuid
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select c.workspace_id from crm.proven_context() c
$$;

create or replace function crm.current_oauth_app_id() returns uuid
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select c.oauth_app_id from crm.proven_context() c
$$;

-- Without a proven context: the empty list, which allows nothing.
create or replace function crm.current_scopes() returns text[]
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select case when c.user_id is null then '{}'::text[] else c.scopes end from crm.proven_context() c
$$;

-- The role's grant, found by the membership key (no proven user: no row, so null).
create or replace function crm.grant_scope(p_resource text, p_action text) returns text
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select g.scope
    from crm.proven_context() c
    join crm.memberships m on m.workspace_id = c.workspace_id and m.user_id = c.user_id and m.suspended_at is null
    join crm.role_grants g on g.workspace_id = m.workspace_id and g.role_id = m.role_id
                          and g.resource = p_resource and g.action = p_action
   where crm.scopes_cover(c.scopes, p_resource, p_action)
$$;

create or replace function crm.scope_owner_ids(p_resource text, p_action text) returns uuid[]
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select coalesce((
    select case g.scope
             when 'own' then array[c.user_id]
             when 'team' then crm.team_user_ids(c.user_id, c.workspace_id)
           end
      from crm.proven_context() c
      join crm.memberships m on m.workspace_id = c.workspace_id and m.user_id = c.user_id and m.suspended_at is null
      join crm.role_grants g on g.workspace_id = m.workspace_id and g.role_id = m.role_id
                            and g.resource = p_resource and g.action = p_action
     where crm.scopes_cover(c.scopes, p_resource, p_action)), '{}'::uuid[])
$$;

create or replace function crm.is_admin() returns boolean
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select coalesce((
    select r.is_admin
      from crm.proven_context() c
      join crm.memberships m on m.workspace_id = c.workspace_id and m.user_id = c.user_id and m.suspended_at is null
      join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id), false)
$$;

create or replace function crm.is_admin_for(p_scope text) returns boolean
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select coalesce((
    select r.is_admin
      from crm.proven_context() c
      join crm.memberships m on m.workspace_id = c.workspace_id and m.user_id = c.user_id and m.suspended_at is null
      join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
     where crm.scopes_include(c.scopes, p_scope)), false)
$$;

create or replace function crm.current_team_user_ids() returns uuid[]
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select case when c.user_id is not null then crm.team_user_ids(c.user_id, c.workspace_id) end from crm.proven_context() c
$$;

create or replace function crm.colleague_ids() returns uuid[]
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select array(select m.user_id from crm.proven_context() c join crm.memberships m on m.workspace_id = c.workspace_id)
$$;
