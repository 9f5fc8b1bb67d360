-- The state machine of a delivery in one function, and the retry schedule in one place.
--
-- Every attempt the worker makes, first or later, is recorded by crm.record_webhook_attempts: one
-- call per batch of one subscription, taking one array of crm.webhook_attempt_result. It alone
-- decides what an attempt leaves a delivery in (delivered, retrying, held, dead; pending for a first
-- attempt not made), when the next attempt is due, which deliver_webhook jobs to add, and whether
-- the subscription pauses itself (API.md section 8). The schedule is crm.webhook_retry_delays(); a
-- cycle has one attempt more than the schedule has delays.

-- ---------------------------------------------------------------------------------------------
-- The retry schedule
-- ---------------------------------------------------------------------------------------------

create function crm.webhook_retry_delays() returns interval[]
language sql immutable parallel safe
as $$ select '{30 seconds, 2 minutes, 10 minutes, 1 hour, 6 hours, 24 hours}'::interval[] $$;
comment on function crm.webhook_retry_delays() is
  'The delays before attempts 2, 3, ... of a cycle (API.md section 8); a cycle has one attempt more than there are delays. Tests pass a shorter schedule (WEBHOOK_RETRY_SCHEDULE) to crm.record_webhook_attempts.';

-- The length of a cycle comes from the schedule alone: the table bounds cycle_attempts only from below.
alter table crm.webhook_deliveries
  drop constraint webhook_deliveries_cycle_attempts_check,
  add constraint webhook_deliveries_cycle_attempts_check check (cycle_attempts >= 0);

comment on table crm.webhook_deliveries is
  'One event for one subscription (API.md section 7). status: pending (first attempt due), retrying, delivered, dead (every attempt of a cycle failed), held (paused subscription or lapsed plan).';
comment on column crm.webhook_deliveries.cycle_attempts is
  'Attempts in the current cycle (one more than crm.webhook_retry_delays() has delays); redeliver starts a new cycle, resume keeps it (the attempts left).';

-- ---------------------------------------------------------------------------------------------
-- The state machine
-- ---------------------------------------------------------------------------------------------

drop function crm.record_first_webhook_attempts(uuid, uuid, uuid[], uuid[], timestamptz[], integer[], integer[], text[], text[], integer[]);
drop function crm.record_webhook_attempts(uuid, uuid, uuid[], integer[], timestamptz[], integer[], integer[], text[], text[], integer[]);

create type crm.webhook_attempt_result as (
  delivery_id uuid,
  -- A first attempt (made by fan_out_event before its delivery row exists) has no generation: its
  -- delivery is created from this event. A later attempt carries the generation of its job.
  event_id uuid,
  generation integer,
  -- Null for a first attempt not made (its subscription at the cap): created pending, with a job.
  started_at timestamptz,
  duration_ms integer,
  response_status integer,
  error text,
  response_body_excerpt text
);
comment on type crm.webhook_attempt_result is
  'One attempt for crm.record_webhook_attempts: a first attempt (generation null, event_id set) or a later one (the generation its job carried).';

-- The transition itself: what an attempt leaves a delivery in, given the attempts its cycle had
-- before. A failure of the last attempt of a cycle is dead even while the subscription is paused.
-- A table function of one SELECT, stable and not strict, so that PostgreSQL inlines it into the
-- statements of crm.record_webhook_attempts instead of calling it per row.
create function crm.webhook_attempt_next_state(
  p_started_at timestamptz, p_error text, p_cycle_attempts integer, p_subscription_status text, p_retry_delays interval[]
) returns table (status text, cycle_attempts integer, next_attempt_at timestamptz)
language sql stable
as $$
  select o.status,
         case when o.status = 'pending' then p_cycle_attempts else p_cycle_attempts + 1 end,
         case o.status when 'retrying' then now() + p_retry_delays[p_cycle_attempts + 1] when 'pending' then now() end
    from (select case
                   when p_started_at is null then 'pending'
                   when p_error is null then 'delivered'
                   when p_cycle_attempts + 1 >= cardinality(p_retry_delays) + 1 then 'dead'
                   when p_subscription_status <> 'active' then 'held'
                   else 'retrying'
                 end as status) o
$$;
comment on function crm.webhook_attempt_next_state(timestamptz, text, integer, text, interval[]) is
  'A delivery''s state after an attempt (null started_at: not attempted, pending): delivered; dead after the last attempt of a cycle; held while paused; retrying, due after the next delay of the schedule.';

-- After a batch of attempts of one subscription (made outside any transaction): every attempt is
-- logged and every delivery moved on, in one transaction and a few set-wise statements.
--
-- First attempts (generation null): each delivery is created in the state its attempt left it in,
-- with that attempt; one not attempted is created pending and handed to a job. A delivery that
-- exists already (the fan_out_event job ran twice at once after a worker stalled past the heartbeat
-- limit) keeps its state; the attempt is logged on it all the same (counted as "existing").
-- Later attempts: per delivery, as one attempt at a time would: stale (a redeliver or resume
-- superseded the job: the attempt is logged, nothing else), or the next state.
-- Retrying and pending deliveries get their deliver_webhook jobs (run_at = next_attempt_at).
--
-- Locks: a batch with a failure locks the subscription row first (the order resume and delete
-- use), so deaths of one subscription are counted one batch after the other and a resume cannot
-- miss a delivery being held; a batch with first attempts and no failure takes a key-share lock,
-- which keeps the subscription from being deleted until this commits; a batch of later successes
-- locks only its delivery rows (in id order). A subscription deleted meanwhile leaves nothing to
-- record. The auto-pause rule runs once per batch that killed a delivery, after the whole batch is
-- written: as if its deaths came after its successes, one valid order of the same attempts.
--
-- p_retry_delays replaces crm.webhook_retry_delays() (tests shorten the schedule); null keeps it.
-- Returns how many deliveries took each outcome, e.g. {"delivered": 98, "retrying": 2}.
create function crm.record_webhook_attempts(
  p_workspace_id uuid, p_subscription_id uuid, p_results crm.webhook_attempt_result[], p_retry_delays interval[] default null
) returns jsonb
language plpgsql volatile
set search_path = pg_catalog, pg_temp
-- Primary-key probes only (see crm.webhook_deliveries_to_send), even when the delivery tables were
-- analysed empty: set on the function, enable_seqscan also covers the foreign-key checks its writes
-- fire, which are planned inside it (otherwise each attempt's check scans every delivery;
-- test/webhooks/first-attempts.test.ts counts the scans).
set enable_hashjoin = off
set enable_mergejoin = off
set enable_bitmapscan = off
set enable_seqscan = off
-- One generic plan per connection (see crm.webhook_first_attempts_to_send).
set plan_cache_mode = force_generic_plan
as $$
declare
  v_retry_delays interval[] := coalesce(p_retry_delays, crm.webhook_retry_delays());
  v_has_first boolean;
  v_has_failure boolean;
  v_subscription_status text;
  v_created crm.webhook_deliveries[];
  v_later crm.webhook_attempt_result[];
  v_moved_outcomes text[];
  v_retrying crm.webhook_deliveries[];
  v_outcomes jsonb;
  v_final_total bigint;
  v_final_dead bigint;
begin
  if p_results is null or cardinality(p_results) = 0 then
    return '{}';
  end if;
  select bool_or(r.generation is null), bool_or(r.error is not null) into v_has_first, v_has_failure from unnest(p_results) r;
  if v_has_failure then
    select s.status into v_subscription_status from crm.webhook_subscriptions s
     where s.workspace_id = p_workspace_id and s.id = p_subscription_id for update;
    if not found then
      return '{}'; -- deleted meanwhile, and its deliveries with it
    end if;
  elsif v_has_first then
    select s.status into v_subscription_status from crm.webhook_subscriptions s
     where s.workspace_id = p_workspace_id and s.id = p_subscription_id for key share;
    if not found then
      return '{}';
    end if;
  end if;

  -- First attempts: each delivery created once, already in its next state, with its attempt.
  if v_has_first then
    with created as (
      insert into crm.webhook_deliveries as d (workspace_id, id, subscription_id, event_id, event, record_type, record_id, status,
                                               attempt_count, cycle_attempts, next_attempt_at, generation, created_at, completed_at)
      select p_workspace_id, r.delivery_id, p_subscription_id, e.id, e.event, e.record_type, e.record_id, n.status,
             n.cycle_attempts, n.cycle_attempts, n.next_attempt_at,
             -- Handed to a job: the generation a job carries starts at 2, as after crm.add_webhook_delivery_jobs elsewhere.
             case when n.status in ('retrying', 'pending') then 2 else 1 end,
             least(now(), coalesce(r.started_at, now())),
             case when n.status in ('delivered', 'dead') then now() end
        from unnest(p_results) r
       cross join lateral crm.webhook_attempt_next_state(r.started_at, r.error, 0, v_subscription_status, v_retry_delays) n
       cross join lateral (select e.* from crm.events e where e.workspace_id = p_workspace_id and e.id = r.event_id limit 1) e
       where r.generation is null
       order by r.delivery_id
      on conflict (workspace_id, subscription_id, event_id) do nothing
      returning d.*
    ), logged as (
      -- The foreign-key checks of these rows run at the end of the statement, when the deliveries exist.
      insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, response_status, error, response_body_excerpt)
      select p_workspace_id, c.id, 1, r.started_at, r.duration_ms, r.response_status, r.error, r.response_body_excerpt
        from created c
        join unnest(p_results) r on r.delivery_id = c.id
       where c.attempt_count = 1 and r.generation is null
    )
    select array_agg(c order by c.event_id) into v_created from created c;
  end if;

  -- Later attempts, and first attempts whose delivery existed already: these become attempts on
  -- the existing row with generation 0, which no job carries (stale: logged, the state stays).
  if not v_has_first then
    v_later := p_results;
  else
    select array_agg(r) into v_later from unnest(p_results) r where r.generation is not null;
  end if;
  if v_has_first and (select count(*) from unnest(v_created) c where c.attempt_count = 1)
                     < (select count(*) from unnest(p_results) r where r.generation is null and r.started_at is not null) then
    v_later := v_later || array(
      select row(d.id, r.event_id, 0, r.started_at, r.duration_ms, r.response_status, r.error, r.response_body_excerpt)::crm.webhook_attempt_result
        from unnest(p_results) r
       cross join lateral (select d.id from crm.webhook_deliveries d
                            where d.workspace_id = p_workspace_id and d.subscription_id = p_subscription_id and d.event_id = r.event_id
                            limit 1) d
       where r.generation is null and r.started_at is not null
         and not (r.delivery_id = any (array(select c.id from unnest(v_created) c where c.attempt_count = 1))));
  end if;

  if v_later is not null then
    -- Delivery rows are locked in id order.
    with attempts as materialized (
      select r.*, d.row_ctid, d.attempt_count,
             case when d.generation <> r.generation or d.status not in ('pending', 'retrying') then 'stale' else n.status end as outcome,
             n.cycle_attempts, n.next_attempt_at
        from (select u.* from unnest(v_later) u order by u.delivery_id) r
       cross join lateral (
         select d.ctid as row_ctid, d.generation, d.status, d.attempt_count, d.cycle_attempts from crm.webhook_deliveries d
          where d.workspace_id = p_workspace_id and d.id = r.delivery_id
            for update) d
       cross join lateral crm.webhook_attempt_next_state(r.started_at, r.error, d.cycle_attempts, v_subscription_status, v_retry_delays) n
    ), logged as (
      insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, response_status, error, response_body_excerpt)
      select p_workspace_id, a.delivery_id, a.attempt_count + 1, a.started_at, a.duration_ms, a.response_status, a.error, a.response_body_excerpt
        from attempts a
    ), moved as (
      update crm.webhook_deliveries d
         set attempt_count = d.attempt_count + 1,
             in_release = false,
             updated_at = now(),
             cycle_attempts = case a.outcome when 'stale' then d.cycle_attempts else a.cycle_attempts end,
             status = case a.outcome when 'stale' then d.status else a.outcome end,
             next_attempt_at = case a.outcome when 'stale' then d.next_attempt_at else a.next_attempt_at end,
             completed_at = case when a.outcome in ('delivered', 'dead') then now() else d.completed_at end,
             generation = case a.outcome when 'retrying' then d.generation + 1 else d.generation end
        from attempts a
       where d.ctid = a.row_ctid -- the row locked above, which nobody else can move meanwhile
      returning d as delivery, case when a.generation = 0 then 'existing' else a.outcome end as outcome
    )
    select array_agg(m.outcome), array_agg(m.delivery order by (m.delivery).event_id) filter (where m.outcome = 'retrying')
      into v_moved_outcomes, v_retrying
      from moved m;
  end if;

  select jsonb_object_agg(o.outcome, o.n) into v_outcomes
    from (select x.outcome, count(*) as n
            from (select c.status as outcome from unnest(v_created) c union all select unnest(v_moved_outcomes)) x
           group by x.outcome) o;

  -- Jobs: one per batch of deliveries due at the same moment.
  perform crm.add_webhook_delivery_jobs(
    array(select c from unnest(v_created) c where c.status in ('retrying', 'pending') order by c.event_id) || v_retrying, null);

  -- Auto-pause (API.md section 8); the subscription row is locked since the batch had failures.
  if v_outcomes ? 'dead' then
    select count(*), count(*) filter (where d.status = 'dead') into v_final_total, v_final_dead
      from crm.webhook_deliveries d
     where d.workspace_id = p_workspace_id and d.subscription_id = p_subscription_id
       and d.completed_at is not null and d.completed_at > now() - interval '24 hours';
    if v_subscription_status = 'active' and v_final_total >= 10 and v_final_dead * 2 >= v_final_total then
      update crm.webhook_subscriptions s set status = 'paused', paused_reason = 'auto', paused_at = now()
       where s.workspace_id = p_workspace_id and s.id = p_subscription_id;
      v_outcomes := v_outcomes || '{"paused": true}';
    end if;
  end if;
  return coalesce(v_outcomes, '{}');
end
$$;
comment on function crm.record_webhook_attempts(uuid, uuid, crm.webhook_attempt_result[], interval[]) is
  'Logs a batch of first or later attempts of one subscription and moves each delivery on (created by its first attempt): delivered; retrying or pending (jobs added); held (paused); dead after the last attempt of a cycle, with the auto-pause rule in the same transaction.';

-- The worker (the owner role) alone records attempts.
revoke execute on function crm.record_webhook_attempts(uuid, uuid, crm.webhook_attempt_result[], interval[]) from public;
