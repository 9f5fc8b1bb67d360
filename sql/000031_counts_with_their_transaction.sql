-- A settlement's total no longer loses a request whose count is not yet committed.
--
-- A request that authenticates in full (a token's first request, another X-Tenant-Slug, a stale
-- cached identity) is counted by crm.authenticate inside the request's transaction, and the API
-- process admits it at once, counting it in its own view of the user's total. A settlement that
-- reads the total before that transaction commits does not see the count, and the process, taking
-- the settlement's larger total as its view, lost the request until a later total held it: an
-- export the client reads slowly held its count out of every total for as long as it streamed, and
-- one process admitted limit + 1 (a loaded run of the test suite found it; the test that holds an
-- export open reproduces it every time).
--
-- So crm.authenticate answers the transaction that holds the count (counted_in), and
-- crm.settle_request_counts the snapshot its total was read with: the process adds to a total the
-- requests it admitted whose transactions that snapshot had not seen end (src/auth/rate-limit.ts).
-- Both functions otherwise as before (sql/000029 and sql/000017); a new column in a function's
-- answer means dropping and creating it again, with its grants.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

drop function crm.authenticate(bytea, text, text, integer);
create function crm.authenticate(p_token_hash bytea, p_slug text, p_via text, p_rate_limit integer)
returns table (failure text, user_id uuid, workspace_id uuid, workspace_slug text, token_id uuid, token_kind text,
               is_admin boolean, rate_count integer, rate_reset_seconds integer, scopes text[], oauth_app_id uuid,
               access_version bigint, counted_in xid8)
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
         a.scopes, a.oauth_app_id, a.access_version,
         -- The transaction holding this request's count: the process asks a settlement's snapshot
         -- whether it had ended by then (src/auth/rate-limit.ts).
         case when a.user_id is not null then pg_current_xact_id() end
    from counted k
    left join admitted a on true
    left join context x on true;
end
$$;
comment on function crm.authenticate(bytea, text, text, integer) is
  'Per-request authentication in one call: token (expiry, revocation, bound workspace), user (suspension, API access), workspace choice (slug, else last used, else oldest joined), membership suspension, the rate-limit counter, last-used bookkeeping, and the proven request context with the token''s scopes and OAuth app. Returns failure = the API error code when refused, the membership''s access_version for a cached identity (crm.resume_identity), and counted_in, the transaction that holds the request''s count.';
revoke execute on function crm.authenticate(bytea, text, text, integer) from public;
grant execute on function crm.authenticate(bytea, text, text, integer) to crm_api;

drop function crm.settle_request_counts(integer, timestamptz, uuid[], integer[]);
create function crm.settle_request_counts(p_source integer, p_window_start timestamptz, p_user_ids uuid[], p_counts integer[])
returns table (user_id uuid, total integer, snapshot pg_snapshot)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_now_window constant timestamptz := date_trunc('minute', now());
  v_lock_class constant integer := hashtext('crm.settle_request_counts');
  v_key integer;
begin
  if p_source is null or p_source >= 0 then
    raise exception 'crm.settle_request_counts: the counter id must be a negative integer (positive ones are backend pids), got %', p_source
      using errcode = '22023';
  end if;
  if p_window_start is null or p_window_start <> date_trunc('minute', p_window_start) then
    raise exception 'crm.settle_request_counts: the window must start on a whole minute, got %', p_window_start
      using errcode = '22023';
  end if;
  -- The window that just ended (its last counts settle after the minute turns), the current one,
  -- or the next (the process's clock a little ahead of the database's); anything else is a clock
  -- that is wrong.
  if p_window_start < v_now_window - interval '1 minute' or p_window_start > v_now_window + interval '1 minute' then
    raise exception 'crm.settle_request_counts: the window % is more than a minute from the database''s current window %; check the clocks',
      p_window_start, v_now_window
      using errcode = '22023';
  end if;
  if p_user_ids is null or p_counts is null
     or coalesce(array_length(p_user_ids, 1), 0) <> coalesce(array_length(p_counts, 1), 0) then
    raise exception 'crm.settle_request_counts: p_user_ids and p_counts must be arrays of equal length, got % and %',
      array_length(p_user_ids, 1), array_length(p_counts, 1)
      using errcode = '22023';
  end if;
  if array_position(p_user_ids, null) is not null or array_position(p_counts, null) is not null
     or exists (select from unnest(p_counts) c where c < 0) then
    raise exception 'crm.settle_request_counts: user ids must not be null and counts must be 0 or more'
      using errcode = '22023';
  end if;

  -- One user at a time across every process, in one order (the lock keys sorted), so two
  -- settlements of overlapping users cannot deadlock.
  for v_key in select distinct hashtext(u::text) as k from unnest(p_user_ids) u order by k loop
    perform pg_advisory_xact_lock(v_lock_class, v_key);
  end loop;

  -- A user named twice gets the sum of their counts; 0 asks only for the total.
  insert into crm.rate_limit_counters as rc (user_id, window_start, backend_pid, count)
  select g.user_id, p_window_start, p_source, g.count
    from (select u.user_id, sum(u.count)::integer as count
            from unnest(p_user_ids, p_counts) as u (user_id, count)
           group by u.user_id) g
   where g.count > 0
  on conflict on constraint rate_limit_counters_pkey do update set count = rc.count + excluded.count;

  -- One join for every user: the planner picks index probes for a few users, one pass over the
  -- table (a few minutes of rows) for many. The snapshot is the one this read counted with: which
  -- transactions it saw the end of.
  return query
    select u.user_id, coalesce(sum(c.count), 0)::integer, pg_current_snapshot()
      from (select distinct x.user_id from unnest(p_user_ids) as x (user_id)) u
      left join crm.rate_limit_counters c on c.user_id = u.user_id and c.window_start = p_window_start
     group by u.user_id;
end
$$;
comment on function crm.settle_request_counts(integer, timestamptz, uuid[], integer[]) is
  'Rate limit (crm_runtime): adds an API process''s request counts (p_counts, 0 or more) for the users p_user_ids in the clock minute p_window_start under its counter id p_source (a negative integer chosen per process, never a backend pid), and answers each user''s total in that window over every process and backend, with the snapshot the totals were read with. Settlements of one user are serialised, so each total includes every earlier settlement. Run it as its own statement, outside a request transaction (the locks last until commit).';
revoke execute on function crm.settle_request_counts(integer, timestamptz, uuid[], integer[]) from public;
grant execute on function crm.settle_request_counts(integer, timestamptz, uuid[], integer[]) to crm_runtime;
