-- The per-user rate limit counted in each API process and settled here in batches
-- (src/auth/rate-limit.ts). A process admits a user's requests against the total this function
-- last answered plus its own unsettled count, and settles its counts every few hundred
-- milliseconds, or at once when a user's unsettled count reaches the batch size. Its counts go
-- into crm.rate_limit_counters under its own counter id, a negative number, beside the rows
-- crm.authenticate writes under positive backend pids; every total sums both.
--
-- Settlements of one user are serialised (a transaction-scoped advisory lock per user, taken
-- before the upsert, whose statements then read with a fresh snapshot): each answers a total that
-- includes every settlement before it. That order is what the overshoot bound rests on
-- (docs/decisions.md, "The rate limit counted in the process"): two concurrent settlements that
-- could each miss the other's count would let both processes admit another batch.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

comment on column crm.rate_limit_counters.backend_pid is
  'Whose count the row holds: a positive PostgreSQL backend pid (crm.authenticate and crm.count_request count a request in the backend that ran it), or a negative API process counter id (crm.settle_request_counts: each process picks a random negative integer at start, so it never meets a backend pid; two processes drawing the same one would only share a row, and the totals stay right).';

create function crm.settle_request_counts(p_source integer, p_window_start timestamptz, p_user_ids uuid[], p_counts integer[])
returns table (user_id uuid, total integer)
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
  -- table (a few minutes of rows) for many.
  return query
    select u.user_id, coalesce(sum(c.count), 0)::integer
      from (select distinct x.user_id from unnest(p_user_ids) as x (user_id)) u
      left join crm.rate_limit_counters c on c.user_id = u.user_id and c.window_start = p_window_start
     group by u.user_id;
end
$$;
comment on function crm.settle_request_counts(integer, timestamptz, uuid[], integer[]) is
  'Rate limit (crm_runtime): adds an API process''s request counts (p_counts, 0 or more) for the users p_user_ids in the clock minute p_window_start under its counter id p_source (a negative integer chosen per process, never a backend pid), and answers each user''s total in that window over every process and backend. Settlements of one user are serialised, so each total includes every earlier settlement. Run it as its own statement, outside a request transaction (the locks last until commit).';
revoke execute on function crm.settle_request_counts(integer, timestamptz, uuid[], integer[]) from public;
grant execute on function crm.settle_request_counts(integer, timestamptz, uuid[], integer[]) to crm_runtime;
