-- The request context kept with the token that computed it, so a cached identity's request reads it
-- instead of computing it again (issue: the identity computed once, the policies only read it).
--
-- crm.put_context joined the membership, the role and its grants, narrowed them by the token's
-- scopes and built the context's text on every request: measured on PostgreSQL 18, about half of
-- crm.resume_identity's time (a GET one: 150 against 105 µs with the text at hand, one connection,
-- named statements, medians of five rounds). Everything in that text is fixed by the token (user,
-- scopes, OAuth app and grant, the token itself), the workspace, via, and what the membership's
-- access_version covers (its role, suspension, the role's admin flag and grants: every change to
-- them draws a new access_version), except the team, which changes with crm.team_members alone.
--
-- So crm.authenticate, which already writes (the rate limit, the last-used bookkeeping), stores the
-- text on the token's row with its key (workspace, access_version, via) unless the text names a
-- team; crm.resume_identity, whose caller already proves the access_version it cached, writes the
-- stored text when the key matches, and computes it as before otherwise (without storing: it runs
-- on standbys too). Nothing else reads or writes the two columns: crm_api has no privilege on them
-- (its privileges on crm.tokens are by column). The stored text is what crm.write_context takes,
-- before the keyed proof, which stays per transaction. A migration that changes the text's layout
-- clears them (update crm.tokens set context = null, context_key = null).
set local lock_timeout = '5s';
set local statement_timeout = '60s';

alter table crm.tokens add column context text, add column context_key text;
comment on column crm.tokens.context is
  'The request context crm.authenticate last wrote for this token, before any keyed proof; null when it names a team (a team changes without moving access_version). Read by crm.resume_identity when context_key matches. Owner only.';
comment on column crm.tokens.context_key is
  'What crm.tokens.context holds for: crm.context_cache_key(workspace, access_version, via). Owner only.';

create function crm.context_cache_key(p_workspace_id uuid, p_access_version bigint, p_via text) returns text
language sql immutable parallel safe
return p_workspace_id::text || ' ' || p_access_version::text || ' ' || coalesce(p_via, 'api');
comment on function crm.context_cache_key(uuid, bigint, text) is
  'The key under which a token keeps its request context: workspace, the membership''s access_version and via. Internal.';
revoke execute on function crm.context_cache_key(uuid, bigint, text) from public;

create function crm.put_stored_context(p_context text) returns boolean
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  perform crm.write_context(p_context);
  return true;
end
$$;
comment on function crm.put_stored_context(text) is
  'Writes a request context crm.authenticate stored on the token (crm.tokens.context) for the rest of the transaction. Internal: crm.resume_identity calls it once it has proven the token and the access_version.';
revoke execute on function crm.put_stored_context(text) from public;

-- The writer also stores the text for the token under p_cache_key, when given and the text names no
-- team; otherwise as in sql/000027.
drop function crm.put_context(uuid, uuid, text, text[], uuid, uuid, uuid);
create function crm.put_context(p_user_id uuid, p_workspace_id uuid, p_via text, p_scopes text[], p_oauth_app_id uuid,
                                 p_token_id uuid default null, p_oauth_grant_id uuid default null,
                                 p_cache_key text default null)
returns boolean
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_admin boolean;
  v_grants text;
  v_team boolean;
  v_team_ids text := '0';
  v_context text;
begin
  select r.is_admin,
         coalesce(',' || string_agg(g.resource || '_' || g.action || '_' || g.scope, ',') || ',', ','),
         coalesce(bool_or(g.scope = 'team'), false)
    into v_admin, v_grants, v_team
    from crm.memberships m
    join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
    left join crm.role_grants g on g.workspace_id = m.workspace_id and g.role_id = m.role_id
                               and crm.scopes_cover(p_scopes, g.resource, g.action)
   where m.workspace_id = p_workspace_id and m.user_id = p_user_id and m.suspended_at is null
   group by r.is_admin;
  if v_team then
    v_team_ids := array_to_string(array(select replace(t::text, '-', '') from unnest(crm.team_user_ids(p_user_id, p_workspace_id)) t), ',');
  end if;
  v_context := concat_ws(' ', 'crm_context', replace(p_user_id::text, '-', ''), replace(p_workspace_id::text, '-', ''),
    coalesce(replace(p_oauth_app_id::text, '-', ''), '0'), encode(convert_to(coalesce(p_via, 'api'), 'UTF8'), 'hex'),
    coalesce(encode(convert_to(p_scopes::text, 'UTF8'), 'hex'), 'n'), case when v_admin then '1' else '0' end,
    coalesce(v_grants, ','), v_team_ids, coalesce(replace(p_token_id::text, '-', ''), '0'),
    coalesce(replace(p_oauth_grant_id::text, '-', ''), '0'));
  perform crm.write_context(v_context);
  if p_cache_key is not null and p_token_id is not null then
    update crm.tokens t
       set context = case when coalesce(v_team, false) then null else v_context end,
           context_key = case when coalesce(v_team, false) then null else p_cache_key end
     where t.id = p_token_id and t.context_key is distinct from case when coalesce(v_team, false) then null else p_cache_key end;
  end if;
  return true;
end
$$;
comment on function crm.put_context(uuid, uuid, text, text[], uuid, uuid, uuid, text) is
  'Writes the request context: user, workspace, OAuth app, via, token scopes, the active membership''s admin flag, its role''s grants narrowed by the scopes, the team when a grant is team, the calling token and its OAuth grant. Grants hold for the transaction as of this call. With p_cache_key (crm.authenticate), also keeps the text on the token (crm.tokens.context) unless it names a team. Internal.';
revoke execute on function crm.put_context(uuid, uuid, text, text[], uuid, uuid, uuid, text) from public;

-- Authentication stores the context it computed; otherwise as in sql/000027.
create or replace function crm.authenticate(p_token_hash bytea, p_slug text, p_via text, p_rate_limit integer)
returns table (failure text, user_id uuid, workspace_id uuid, workspace_slug text, token_id uuid, token_kind text,
               is_admin boolean, rate_count integer, rate_reset_seconds integer, scopes text[], oauth_app_id uuid,
               access_version bigint)
language plpgsql security definer rows 1
set search_path = pg_catalog, crm, pg_temp
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
#variable_conflict use_column
begin
  return query
  with caller as (
    select t.id as token_id, t.kind, t.revoked_at, t.expires_at, t.last_used_at, t.scopes, t.oauth_app_id, t.oauth_grant_id,
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
    select c.token_id, c.kind, c.last_used_at, c.user_id, c.last_workspace_id, c.scopes, c.oauth_app_id, c.oauth_grant_id,
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
  -- own insert, so the new count comes from RETURNING). Counted per user, whatever the token.
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
  -- The context and the bookkeeping when it changes. A CTE with volatile calls is materialized,
  -- so it runs once, and only for an admitted caller.
  context as materialized (
    select crm.put_context(a.user_id, a.workspace_id, p_via, a.scopes, a.oauth_app_id,
                           a.token_id, a.oauth_grant_id,
                           crm.context_cache_key(a.workspace_id, a.access_version, p_via)) as written,
           case when a.last_workspace_id is distinct from a.workspace_id
                  or a.last_used_at is null or a.last_used_at < now() - interval '1 minute'
                then crm.touch_caller(a.user_id, a.workspace_id, a.last_workspace_id is distinct from a.workspace_id,
                                      a.token_id, a.last_used_at is null or a.last_used_at < now() - interval '1 minute')
                else true
           end as touched
      from admitted a
  )
  select coalesce(k.failure, case when k.rate_count > p_rate_limit then 'rate_limited' end),
         case when x.written and x.touched then a.user_id end,
         a.workspace_id, a.slug, a.token_id, a.kind, a.is_admin,
         k.rate_count,
         greatest(1, ceil(extract(epoch from (date_trunc('minute', now()) + interval '1 minute' - now())))::integer),
         a.scopes, a.oauth_app_id, a.access_version
    from counted k
    left join admitted a on true
    left join context x on true;
end
$$;

-- A cached identity writes the stored context when its key matches; otherwise as in sql/000027.
create or replace function crm.resume_identity(p_token_hash bytea, p_workspace_id uuid, p_access_version bigint, p_via text,
                                               p_follows_last_workspace boolean)
returns table (failure text, user_id uuid)
language plpgsql security definer rows 1
set search_path = pg_catalog, crm, pg_temp
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
#variable_conflict use_column
begin
  return query
  with admitted as materialized (
    select t.id as token_id, t.user_id, t.last_used_at, t.scopes, t.oauth_app_id, t.oauth_grant_id, u.last_workspace_id,
           t.context, t.context_key
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
  -- The context as crm.authenticate wrote it for this workspace, access version and via, when the
  -- token holds it; otherwise computed as crm.authenticate does (and not stored: a standby runs
  -- this too, and writes nothing). The same bookkeeping.
  context as materialized (
    select a.user_id,
           case when a.context_key = crm.context_cache_key(p_workspace_id, p_access_version, p_via)
                then crm.put_stored_context(a.context)
                else crm.put_context(a.user_id, p_workspace_id, p_via, a.scopes, a.oauth_app_id, a.token_id, a.oauth_grant_id)
           end as written,
           case when a.last_workspace_id is distinct from p_workspace_id
                  or a.last_used_at is null or a.last_used_at < now() - interval '1 minute'
                then crm.touch_caller(a.user_id, p_workspace_id, a.last_workspace_id is distinct from p_workspace_id,
                                      a.token_id, a.last_used_at is null or a.last_used_at < now() - interval '1 minute')
                else true
           end as touched
      from admitted a
  )
  select case when x.written and x.touched then null else 'stale' end,
         case when x.written and x.touched then x.user_id end
    from (select) as always_one_row
    left join context x on true;
end
$$;
