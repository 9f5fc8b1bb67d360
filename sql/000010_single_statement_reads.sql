-- Single-statement reads: GET one record, list and search send crm.authenticate and their query as
-- one statement, on connections whose session role is crm_api from the start (row-level security
-- is fixed when a statement is planned, so the role cannot change inside the statement that
-- reads). Those connections call crm.authenticate as crm_api, so crm_api may execute it.
--
-- What this opens: crm.authenticate succeeds only for the SHA-256 of a live token, and crm_api
-- cannot read token hashes (crm.tokens grants it no token_hash column), so calling it directly
-- proves nothing that the HTTP API does not already accept.
grant execute on function crm.authenticate(bytea, text, text, integer) to crm_api;

-- =============================================================================================
-- Cheaper authentication and policy helpers. Same answers as before; fewer statements inside.
--
-- Every statement a PL/pgSQL function runs through SPI pays an executor start-up; a SQL-language
-- wrapper that selects FROM another function pays a function scan. crm.authenticate ran about ten
-- such statements per request and every policy helper stacked three function layers (SQL wrapper
-- → verified_context → context_proof) per statement. Now:
--   * crm.authenticate is one SQL statement (was PL/pgSQL running about ten): checks, the
--     rate-limit counter, the bookkeeping updates and the proven context, in one plan;
--   * crm.verified_context computes the HMAC itself, and the helpers call it as an expression
--     (PL/pgSQL evaluates a bare function call without starting an executor).
-- The proof, its message and its key are unchanged, so contexts set by crm.set_context (crm.act_as)
-- and by crm.authenticate verify alike.

create or replace function crm.authenticate(p_token_hash bytea, p_slug text, p_via text, p_rate_limit integer)
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
-- With custom plans this statement was planned again on every call; its generic plan is the same
-- index lookups.
set plan_cache_mode = force_generic_plan
-- Every lookup here has its index. The rate-limit counters are rewritten by every request, so the
-- planner's statistics see a small table and pick a sequential scan through all its row versions;
-- the (user_id, window_start, backend_pid) key reads only this user's rows.
set enable_seqscan = off
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
  touched_user as (
    update crm.users u set last_workspace_id = a.workspace_id
      from admitted a where u.id = a.user_id and a.last_workspace_id is distinct from a.workspace_id
  ),
  touched_token as (
    update crm.tokens t set last_used_at = now()
      from admitted a where t.id = a.token_id and (a.last_used_at is null or a.last_used_at < now() - interval '1 minute')
  ),
  -- The proven context, exactly as crm.set_context sets it (same message, same key). A CTE with
  -- volatile calls is materialized, so it runs once, and only for an admitted caller.
  context as materialized (
    select set_config('crm.user_id', a.user_id::text, true) as user_id,
           set_config('crm.workspace_id', a.workspace_id::text, true) as workspace_id,
           set_config('crm.via', coalesce(p_via, 'api'), true) as via,
           set_config('crm.context_proof', encode(hmac(
             convert_to(a.user_id::text || '/' || a.workspace_id::text || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8'),
             (select s.value from crm.internal_secrets s where s.name = 'context_proof'),
             'sha256'), 'hex'), true) as proof
      from admitted a
  )
  select coalesce(k.failure, case when k.rate_count > p_rate_limit then 'rate_limited' end),
         case when x.proof is not null then a.user_id end,
         a.workspace_id, a.slug, a.token_id, a.kind, a.is_admin,
         k.rate_count,
         greatest(1, ceil(extract(epoch from (date_trunc('minute', now()) + interval '1 minute' - now())))::integer)
    from counted k
    left join admitted a on true
    left join context x on true
$$;

create or replace function crm.verified_context(out user_id uuid, out workspace_id uuid)
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
  if encode(hmac(
       convert_to(v_user || '/' || v_workspace || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8'),
       (select s.value from crm.internal_secrets s where s.name = 'context_proof'),
       'sha256'), 'hex') is distinct from v_proof then
    return;
  end if;
  user_id := v_user::uuid;
  workspace_id := v_workspace::uuid;
end
$$;

create or replace function crm.current_user_id() returns uuid
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
begin
  return (crm.verified_context()).user_id;
end
$$;

create or replace function crm.current_workspace_id() returns uuid
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
begin
  return (crm.verified_context()).workspace_id;
end
$$;

create or replace function crm.grant_scope(p_resource text, p_action text) returns text
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_context record := crm.verified_context();
begin
  if v_context.user_id is null then return null; end if;
  return (
    select g.scope
      from crm.memberships m
      join crm.role_grants g on g.workspace_id = m.workspace_id and g.role_id = m.role_id
     where m.workspace_id = v_context.workspace_id and m.user_id = v_context.user_id
       and m.suspended_at is null and g.resource = p_resource and g.action = p_action);
end
$$;

create or replace function crm.scope_owner_ids(p_resource text, p_action text) returns uuid[]
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_context record := crm.verified_context();
  v_scope text;
begin
  if v_context.user_id is null then return '{}'; end if;
  select g.scope into v_scope
    from crm.memberships m
    join crm.role_grants g on g.workspace_id = m.workspace_id and g.role_id = m.role_id
   where m.workspace_id = v_context.workspace_id and m.user_id = v_context.user_id
     and m.suspended_at is null and g.resource = p_resource and g.action = p_action;
  return case v_scope
           when 'own' then array[v_context.user_id]
           when 'team' then crm.team_user_ids(v_context.user_id, v_context.workspace_id)
           else '{}'::uuid[]
         end;
end
$$;

create or replace function crm.is_admin() returns boolean
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

create or replace function crm.current_team_user_ids() returns uuid[]
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

-- Every request rewrites its backend's counter row, and crm.authenticate sums the user's rows. At
-- the default fill factor a page collects a hundred dead versions before it is pruned and the sum
-- walks them all; with room kept free, PostgreSQL prunes the page as it goes (profiled: the sum's
-- cost fell by two thirds under 50 concurrent requests).
alter table crm.rate_limit_counters set (fillfactor = 10);

-- GET one now sends a plain SELECT as a named statement (planned once per connection), so the
-- PL/pgSQL readers that existed to cache that plan have no caller left.
drop function crm.read_contact(uuid);
drop function crm.read_company(uuid);
drop function crm.read_deal(uuid);
