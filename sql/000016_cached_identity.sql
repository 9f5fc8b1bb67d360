-- What a token grants may be cached by the API process (DESIGN.md), as long as every statement that
-- relies on the cache proves it current. The token's and the user's own state (revocation, expiry,
-- suspension, API access, the last used workspace) is read live from their rows, by the same
-- lookups that prove the token; what the cache keeps from other tables (the membership, its role,
-- the role's admin flag and grants) carries a version, memberships.access_version, that every
-- change to them bumps in the same transaction. crm.resume_identity sets the proven context only
-- while that version is the one the process cached; otherwise it answers 'stale' and sets nothing,
-- and the process authenticates again with crm.authenticate.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- Versions come from one sequence, so a membership never gets back a version it had: not after a
-- change, not when it is removed and created again.
create sequence crm.access_versions as bigint;
comment on sequence crm.access_versions is 'The values of memberships.access_version.';

-- A constant default: PostgreSQL 11 and later add the column without rewriting the table. Every
-- membership created from here on takes its version from the sequence (the trigger below).
alter table crm.memberships add column access_version bigint not null default 0;
comment on column crm.memberships.access_version is
  'A new value from crm.access_versions in the transaction that changes what the membership grants (its role or suspension, the role''s admin flag or grants) or creates it; a cached identity is refused once it moved (crm.resume_identity). Never set by hand: any write to it draws the next value.';

-- SECURITY DEFINER: the sequence is the owner's, and the version moves whoever changes the row.
create function crm.tg_memberships__next_access_version() returns trigger
language plpgsql security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  new.access_version := nextval('crm.access_versions');
  return new;
end
$$;
comment on function crm.tg_memberships__next_access_version() is
  'A membership created, or its role, suspension or version written: it takes the next access version, and cached identities of it are stale.';
revoke execute on function crm.tg_memberships__next_access_version() from public;

create trigger tg_memberships__next_access_version_insert before insert on crm.memberships
  for each row execute function crm.tg_memberships__next_access_version();
create trigger tg_memberships__next_access_version_update before update of role_id, suspended_at, access_version on crm.memberships
  for each row
  when ((old.role_id, old.suspended_at, old.access_version) is distinct from (new.role_id, new.suspended_at, new.access_version))
  execute function crm.tg_memberships__next_access_version();

-- The role's triggers reach memberships the changing admin may not update (another member's row):
-- SECURITY DEFINER, and they write nothing but the version (which the trigger above draws).
create function crm.tg_roles__bump_access_versions() returns trigger
language plpgsql security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  update crm.memberships m set access_version = m.access_version + 1
    from new_rows n join old_rows o on o.workspace_id = n.workspace_id and o.id = n.id
   where n.is_admin is distinct from o.is_admin and m.workspace_id = n.workspace_id and m.role_id = n.id;
  return null;
end
$$;
comment on function crm.tg_roles__bump_access_versions() is 'A role''s admin flag changed: its members'' cached identities are stale.';
revoke execute on function crm.tg_roles__bump_access_versions() from public;

create trigger tg_roles__bump_access_versions after update on crm.roles
  referencing old table as old_rows new table as new_rows
  for each statement execute function crm.tg_roles__bump_access_versions();

create function crm.tg_role_grants__bump_access_versions() returns trigger
language plpgsql security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  -- One function for the three events: each branch reads only the transition tables its event has.
  if tg_op = 'INSERT' then
    update crm.memberships m set access_version = m.access_version + 1
      from (select distinct n.workspace_id, n.role_id from new_rows n) r
     where m.workspace_id = r.workspace_id and m.role_id = r.role_id;
  elsif tg_op = 'DELETE' then
    update crm.memberships m set access_version = m.access_version + 1
      from (select distinct o.workspace_id, o.role_id from old_rows o) r
     where m.workspace_id = r.workspace_id and m.role_id = r.role_id;
  else
    update crm.memberships m set access_version = m.access_version + 1
      from (select n.workspace_id, n.role_id from new_rows n union select o.workspace_id, o.role_id from old_rows o) r
     where m.workspace_id = r.workspace_id and m.role_id = r.role_id;
  end if;
  return null;
end
$$;
comment on function crm.tg_role_grants__bump_access_versions() is 'A role''s grants changed: its members'' cached identities are stale.';
revoke execute on function crm.tg_role_grants__bump_access_versions() from public;

create trigger tg_role_grants__bump_access_versions_insert after insert on crm.role_grants
  referencing new table as new_rows
  for each statement execute function crm.tg_role_grants__bump_access_versions();
create trigger tg_role_grants__bump_access_versions_update after update on crm.role_grants
  referencing old table as old_rows new table as new_rows
  for each statement execute function crm.tg_role_grants__bump_access_versions();
create trigger tg_role_grants__bump_access_versions_delete after delete on crm.role_grants
  referencing old table as old_rows
  for each statement execute function crm.tg_role_grants__bump_access_versions();

-- crm.authenticate also answers the version it admitted the caller at, for the process to cache.
-- Its body is 000011's with access_version carried from the membership to the answer.
drop function crm.authenticate(bytea, text, text, integer);
create function crm.authenticate(p_token_hash bytea, p_slug text, p_via text, p_rate_limit integer)
returns table (failure text, user_id uuid, workspace_id uuid, workspace_slug text, token_id uuid, token_kind text,
               is_admin boolean, rate_count integer, rate_reset_seconds integer, scopes text[], oauth_app_id uuid,
               access_version bigint)
language sql security definer rows 1
set search_path = pg_catalog, crm, pg_temp
-- A generic plan over the index lookups: planned once per connection, never per request.
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
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
    select m.workspace_id, m.suspended_at, m.access_version, w.slug, r.is_admin
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
           m.workspace_id, m.slug, m.is_admin, m.access_version,
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
  -- counters for the same user and minute are added (this statement's snapshot does not see its
  -- own insert, so the new count comes from RETURNING). Counted per user, whatever the token: a
  -- scoped token or an app's access token shares its user's limit.
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
         a.scopes, a.oauth_app_id, a.access_version
    from counted k
    left join admitted a on true
    left join context x on true
$$;
comment on function crm.authenticate(bytea, text, text, integer) is
  'Per-request authentication in one call: token (expiry, revocation, bound workspace), user (suspension, API access), workspace choice (slug, else last used, else oldest joined), membership suspension, the rate-limit counter, last-used bookkeeping, and the proven request context with the token''s scopes and OAuth app. Returns failure = the API error code when refused, and the membership''s access_version for a cached identity (crm.resume_identity).';
revoke execute on function crm.authenticate(bytea, text, text, integer) from public;
grant execute on function crm.authenticate(bytea, text, text, integer) to crm_api;

-- A cached identity's request: the token proven again by its hash (a caller who does not hold the
-- token cannot resume anyone), the token's and the user's state read live, the membership found by
-- its key with the version the process cached. No rate-limit counter: the process counts (the
-- README states the bound). p_follows_last_workspace: the request named no workspace and the cache
-- chose the last used one, which must still be it.
create function crm.resume_identity(p_token_hash bytea, p_workspace_id uuid, p_access_version bigint, p_via text,
                                    p_follows_last_workspace boolean)
returns table (failure text, user_id uuid)
language sql security definer rows 1
set search_path = pg_catalog, crm, pg_temp
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
  with admitted as materialized (
    select t.id as token_id, t.user_id, t.last_used_at, t.scopes, t.oauth_app_id, u.last_workspace_id
      from crm.tokens t
      join crm.users u on u.id = t.user_id
      join crm.memberships m on m.workspace_id = p_workspace_id and m.user_id = t.user_id
     where t.token_hash = p_token_hash
       and t.revoked_at is null and t.expires_at > now()
       and (t.kind <> 'session' or p_via = 'ui')
       and (t.workspace_id is null or t.workspace_id = p_workspace_id)
       and u.suspended_at is null
       and (t.kind = 'session' or u.api_access)
       and m.access_version = p_access_version
       and (not p_follows_last_workspace or u.last_workspace_id = p_workspace_id)
  ),
  -- The proven context as crm.authenticate sets it, and the same bookkeeping.
  context as materialized (
    select set_config('crm.user_id', a.user_id::text, true) as user_id,
           set_config('crm.workspace_id', p_workspace_id::text, true) as workspace_id,
           set_config('crm.via', coalesce(p_via, 'api'), true) as via,
           set_config('crm.scopes', coalesce(a.scopes::text, ''), true) as scopes,
           set_config('crm.oauth_app_id', coalesce(a.oauth_app_id::text, ''), true) as oauth_app_id,
           set_config('crm.context_proof', encode(public.hmac(
             crm.context_message(a.user_id::text, p_workspace_id::text, coalesce(a.scopes::text, ''), coalesce(a.oauth_app_id::text, '')),
             (select s.value from crm.internal_secrets s where s.name = 'context_proof'),
             'sha256'), 'hex'), true) as proof,
           case when a.last_workspace_id is distinct from p_workspace_id
                  or a.last_used_at is null or a.last_used_at < now() - interval '1 minute'
                then crm.touch_caller(a.user_id, p_workspace_id, a.last_workspace_id is distinct from p_workspace_id,
                                      a.token_id, a.last_used_at is null or a.last_used_at < now() - interval '1 minute')
                else true
           end as touched
      from admitted a
  )
  select case when x.proof is not null and x.touched then null else 'stale' end,
         case when x.proof is not null and x.touched then x.user_id::uuid end
    from (select) as always_one_row
    left join context x on true
$$;
comment on function crm.resume_identity(bytea, uuid, bigint, text, boolean) is
  'A cached identity''s authentication: sets the proven context when the token is still valid and the membership''s access_version is the cached one; user_id is the token''s user. Otherwise failure = ''stale'', nothing is set, and the caller authenticates with crm.authenticate.';
revoke execute on function crm.resume_identity(bytea, uuid, bigint, text, boolean) from public;
grant execute on function crm.resume_identity(bytea, uuid, bigint, text, boolean) to crm_api;

-- The context's proof check and the helpers that only read it, as SQL rather than PL/pgSQL: the same
-- check, about a quarter cheaper per statement (docs/performance.md). Same meaning as 000011's; a
-- value the proof does not cover never reaches a cast.
create or replace function crm.verified_context(out user_id uuid, out workspace_id uuid, out scopes text[], out oauth_app_id uuid)
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  -- One row always (PL/pgSQL callers assign it to a record); offset 0 keeps the check one
  -- computation rather than one per column.
  select case when v.proven then c.u::uuid end, case when v.proven then c.w::uuid end,
         case when v.proven then nullif(c.s, '')::text[] end, case when v.proven then nullif(c.a, '')::uuid end
    from (select current_setting('crm.user_id', true) as u, current_setting('crm.workspace_id', true) as w,
                 coalesce(current_setting('crm.scopes', true), '') as s,
                 coalesce(current_setting('crm.oauth_app_id', true), '') as a,
                 current_setting('crm.context_proof', true) as p) c,
         lateral (select encode(public.hmac(crm.context_message(c.u, c.w, c.s, c.a),
                                            (select k.value from crm.internal_secrets k where k.name = 'context_proof'),
                                            'sha256'), 'hex') = c.p as proven
                  offset 0) v
$$;

create or replace function crm.current_user_id() returns uuid
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select (crm.verified_context()).user_id
$$;

create or replace function crm.current_workspace_id() returns uuid
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select (crm.verified_context()).workspace_id
$$;

create or replace function crm.current_oauth_app_id() returns uuid
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select (crm.verified_context()).oauth_app_id
$$;
