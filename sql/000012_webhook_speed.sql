-- Webhook delivery, cheaper per delivery (API.md sections 7 and 8 are unchanged).
--
-- Measured on the benchmark's path (bench/webhooks.ts), a delivery whose first attempt succeeds
-- used to cost the database a pending row written by fan-out, a row lock, a second version of the
-- row with five index entries, and a call of crm.webhooks_enabled per event. Now:
--
-- * A first attempt is made before its delivery row exists, and the row is written once, already
--   in the state the attempt left it in, together with the attempt (crm.record_first_webhook_attempts).
--   The fan_out_event job owns these first attempts until it has recorded them: run again after a
--   kill it sends whatever is still unrecorded. So that a delivery sent twice this way carries the
--   same X-Service-Delivery-Id both times, its id is derived from its event and subscription
--   (crm.webhook_delivery_id) instead of drawn at random.
-- * The body is assembled in SQL around its delivered_at (crm.webhook_body_head/tail), from the
--   text PostgreSQL writes for the event anyway; the worker no longer parses and re-serialises it.
-- * The plan gate is evaluated once per workspace of a batch, not once per event.
-- * Housekeeping finds old deliveries through the index the stats already use, so the index it had
--   of its own (one more entry for every delivery that completes) is gone.
-- * The worker's reads find events by primary-key probes whatever the statistics say, and keep one
--   generic plan per connection instead of planning every call.

-- ---------------------------------------------------------------------------------------------
-- Housekeeping without an index of its own
-- ---------------------------------------------------------------------------------------------

drop index crm.webhook_deliveries_prune;

-- Every delivery belongs to a subscription (its foreign key cascades), so visiting each
-- subscription's range of webhook_deliveries_completed finds all of them.
create or replace function crm.prune_webhook_deliveries(log_retention_days integer) returns bigint
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
  v_subscription record;
  v_removed bigint;
  v_total bigint := 0;
begin
  for v_subscription in select s.workspace_id, s.id from crm.webhook_subscriptions s loop
    delete from crm.webhook_deliveries d
     where d.workspace_id = v_subscription.workspace_id and d.subscription_id = v_subscription.id
       and d.completed_at is not null and d.completed_at < now() - make_interval(days => log_retention_days);
    get diagnostics v_removed = row_count;
    v_total := v_total + v_removed;
  end loop;
  return v_total;
end
$$;
comment on function crm.prune_webhook_deliveries(integer) is
  'Removes delivered and dead deliveries (their attempts cascade) older than the log retention, subscription by subscription through webhook_deliveries_completed; held and pending ones stay (nothing is dropped).';
comment on index crm.webhook_deliveries_completed is 'Stats, the auto-pause rule (final deliveries of the last 24 hours) and housekeeping (final deliveries past the retention).';

-- ---------------------------------------------------------------------------------------------
-- Delivery ids and bodies
-- ---------------------------------------------------------------------------------------------

-- A UUIDv7 whose time is the event's (ids stay time-ordered: the log, its cursor and
-- deliveries_24h read them so) and whose other 74 bits are a hash of event and subscription.
create function crm.webhook_delivery_id(p_event_id uuid, p_subscription_id uuid) returns uuid
language sql immutable parallel safe
-- One expression (no FROM), so that PostgreSQL inlines it into the query that calls it. set_bit
-- counts from the least significant bit of the first byte: bits 52-55 are the high half of byte 6
-- (the version, 0111), bits 70-71 the top of byte 8 (the variant, 10).
as $$
  select encode(set_bit(set_bit(set_bit(set_bit(set_bit(set_bit(
           substring(uuid_send(p_event_id) from 1 for 6) || substring(sha256(uuid_send(p_event_id) || uuid_send(p_subscription_id)) from 1 for 10),
           52, 1), 53, 1), 54, 1), 55, 0), 70, 0), 71, 1), 'hex')::uuid
$$;
comment on function crm.webhook_delivery_id(uuid, uuid) is
  'The delivery_id of an event for a subscription, the same every time it is computed: a first attempt re-sent after a crash carries the id the receiver already saw.';

-- The body of an attempt (API.md section 8) is head || delivered_at || tail. Keys in the documented
-- order; data and actor as PostgreSQL writes jsonb. Non-ASCII characters are escaped by the worker
-- (src/webhooks/delivery-body.ts), the one place that knows the body must be pure ASCII.
create function crm.webhook_body_head(p_event_id uuid, p_event text, p_occurred_at timestamptz) returns text
language sql stable parallel safe
as $$
  select '{"id":"' || p_event_id || '","event":"' || p_event
         || '","occurred_at":"' || to_char(p_occurred_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
         || '","delivered_at":"'
$$;
comment on function crm.webhook_body_head(uuid, text, timestamptz) is 'A delivery body up to the value of delivered_at, which each attempt writes.';

create function crm.webhook_body_tail(p_delivery_id uuid, p_workspace_id uuid, p_workspace_slug text, p_data jsonb, p_actor jsonb) returns text
language sql stable parallel safe
as $$
  select '","delivery_id":"' || p_delivery_id || '","workspace":{"id":"' || p_workspace_id || '","slug":' || to_json(p_workspace_slug)::text
         || '},"data":' || p_data::text || ',"actor":' || p_actor::text || '}'
$$;
comment on function crm.webhook_body_tail(uuid, uuid, text, jsonb, jsonb) is 'A delivery body after the value of delivered_at.';

-- ---------------------------------------------------------------------------------------------
-- First attempts: fan_out_event sends them before their delivery rows exist
-- ---------------------------------------------------------------------------------------------

drop function crm.fan_out_webhook_events(uuid[], boolean);
drop function crm.defer_webhook_deliveries(uuid, uuid, uuid[], integer[]);
drop function crm.fan_out_events(uuid[]);

-- What fan_out_event sends for some events: one row per event and matching active subscription,
-- with the delivery id it will have, the body around delivered_at, the endpoint and its secrets,
-- ordered by subscription. Nothing is written for these: the rows are created when their attempts
-- are recorded. A paused subscription's deliveries are created held here (nothing to send); none
-- is created while the plan has lapsed.
-- p_rerun (the job runs again after a kill or a failure): deliveries already recorded are left
-- out, and deliveries an earlier version of this job created and never attempted (pending,
-- generation 1, no attempt) are handed to deliver_webhook jobs, as that version did with the
-- attempts it could not make at once.
create function crm.webhook_first_attempts_to_send(p_event_ids uuid[], p_rerun boolean default false)
returns table (
  workspace_id uuid, subscription_id uuid, delivery_id uuid, event_id uuid, event text, body_head text, body_tail text,
  url text, secret_encrypted bytea, previous_secret_encrypted bytea
)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
-- Index probes only (see crm.webhook_deliveries_to_send). Without statistics that know event ids are
-- unique (a table that grew by a bulk import since its last ANALYZE), "id = any ($1)" is estimated
-- to match so many rows that scanning all events, or a workspace's whole range of events_record,
-- looks cheaper than probing; measured on the benchmark, 15 ms a call instead of 0.2.
set enable_hashjoin = off
set enable_mergejoin = off
set enable_bitmapscan = off
set enable_seqscan = off
-- Every access path above is a probe whatever the arrays hold, so one generic plan per connection
-- serves every call: planning these statements anew (a worker holds many connections, each making
-- a few calls of each) cost more than running them.
set plan_cache_mode = force_generic_plan
as $$
#variable_conflict use_column
declare
  v_stranded crm.webhook_deliveries[];
  v_workspaces uuid[];
begin
  if p_rerun then
    with stranded as (
      update crm.webhook_deliveries d set generation = d.generation + 1, next_attempt_at = now()
        from crm.events e
        join crm.webhook_subscriptions s on s.workspace_id = e.workspace_id
       where e.id = any (p_event_ids) and d.workspace_id = e.workspace_id and d.subscription_id = s.id and d.event_id = e.id
         and d.status = 'pending' and d.generation = 1 and d.attempt_count = 0
      returning d.*
    )
    select array_agg(s order by s.event_id) into v_stranded from stranded s;
    perform crm.add_webhook_delivery_jobs(v_stranded, now());
  end if;

  -- The plan gate once per workspace (a job's events usually share one).
  select array_agg(w.id) into v_workspaces
    from crm.workspaces w
   where w.id = any (array(select distinct e.workspace_id from crm.events e where e.id = any (p_event_ids))) and crm.webhooks_enabled(w.id);
  if v_workspaces is null then
    return;
  end if;

  -- One statement, so that one snapshot decides between held and sent for every subscription: a
  -- paused subscription's deliveries are created held at once (there is nothing to send).
  return query
    -- Events are found by primary-key probes, one per id and workspace.
    with held as (
      insert into crm.webhook_deliveries (workspace_id, id, subscription_id, event_id, event, record_type, record_id, status, created_at)
      select e.workspace_id, crm.webhook_delivery_id(e.id, s.id), s.id, e.id, e.event, e.record_type, e.record_id, 'held', now()
        from crm.webhook_subscriptions s
       cross join unnest(p_event_ids) as x(id)
       cross join lateral (select e.* from crm.events e where e.workspace_id = s.workspace_id and e.id = x.id limit 1) e
       where s.workspace_id = any (v_workspaces) and s.status <> 'active' and crm.webhook_event_matches(s.events, e.event)
       order by e.id, s.id
      on conflict (workspace_id, subscription_id, event_id) do nothing
    )
    select e.workspace_id, s.id, d.id, e.id, e.event,
           crm.webhook_body_head(e.id, e.event, e.occurred_at), crm.webhook_body_tail(d.id, e.workspace_id, w.slug, e.data, e.actor),
           s.url, s.secret_encrypted, case when s.previous_secret_expires_at > now() then s.previous_secret_encrypted end
      from crm.workspaces w
     cross join unnest(p_event_ids) as x(id)
     cross join lateral (select e.* from crm.events e where e.workspace_id = w.id and e.id = x.id limit 1) e
      join crm.webhook_subscriptions s on s.workspace_id = e.workspace_id and s.status = 'active' and crm.webhook_event_matches(s.events, e.event)
     cross join lateral (select crm.webhook_delivery_id(e.id, s.id) as id offset 0) d -- computed once (offset 0: not pulled up)
     where w.id = any (v_workspaces)
       and not (p_rerun and exists (select 1 from crm.webhook_deliveries x
                                      where x.workspace_id = e.workspace_id and x.subscription_id = s.id and x.event_id = e.id))
     order by e.workspace_id, s.id, e.id;
end
$$;
comment on function crm.webhook_first_attempts_to_send(uuid[], boolean) is
  'fan_out_event''s read: the first attempts to make for some events (delivery id, body, endpoint, secrets), by subscription; creates the held deliveries of paused subscriptions.';

-- After fan_out_event's attempts of one subscription (made outside any transaction): each delivery
-- is created in the state its first attempt left it in, with that attempt, in one call.
-- Arrays are parallel, one entry per delivery; p_started_at is null for a delivery that was not
-- attempted (its subscription at the in-flight cap), which is created pending and handed to a
-- deliver_webhook job. Outcomes: delivered; retrying (job due after the first delay); held (the
-- subscription was paused meanwhile); pending (not attempted). A first attempt never kills a
-- delivery, so the auto-pause rule has nothing to check here.
-- Locks: as crm.record_webhook_attempts, a batch with a failure locks the subscription row first
-- (the order resume and delete use), so a resume cannot miss a delivery being held; any other batch
-- takes a key-share lock, which keeps the subscription from being deleted until this commits.
-- A delivery that exists already (this job ran twice at once after a worker stalled past the
-- heartbeat limit) keeps its state; the attempt is logged on it all the same.
-- Returns how many deliveries took each outcome, e.g. {"delivered": 100}.
create function crm.record_first_webhook_attempts(
  p_workspace_id uuid, p_subscription_id uuid, p_delivery_ids uuid[], p_event_ids uuid[], p_started_at timestamptz[],
  p_duration_ms integer[], p_response_status integer[], p_error text[], p_excerpt text[], p_retry_delays_ms integer[]
) returns jsonb
language plpgsql volatile
set search_path = pg_catalog, pg_temp
-- Index probes only (see crm.webhook_deliveries_to_send), one generic plan per connection (see
-- crm.webhook_first_attempts_to_send).
set enable_hashjoin = off
set enable_mergejoin = off
set enable_bitmapscan = off
set plan_cache_mode = force_generic_plan
as $$
declare
  v_subscription_status text;
  v_created crm.webhook_deliveries[];
  v_outcomes jsonb;
  v_jobs crm.webhook_deliveries[];
  v_existing uuid[];
  v_zero integer[];
  v_started_at timestamptz[];
  v_duration_ms integer[];
  v_response_status integer[];
  v_error text[];
  v_excerpt text[];
begin
  if p_delivery_ids is null or cardinality(p_delivery_ids) = 0 then
    return '{}';
  end if;
  if exists (select 1 from unnest(p_error) e where e is not null) then
    select s.status into v_subscription_status from crm.webhook_subscriptions s
     where s.workspace_id = p_workspace_id and s.id = p_subscription_id for update;
  else
    select s.status into v_subscription_status from crm.webhook_subscriptions s
     where s.workspace_id = p_workspace_id and s.id = p_subscription_id for key share;
  end if;
  if not found then
    return '{}'; -- deleted meanwhile: there is nothing to record the attempts on
  end if;

  with created as (
    insert into crm.webhook_deliveries as d (workspace_id, id, subscription_id, event_id, event, record_type, record_id, status,
                                             attempt_count, cycle_attempts, next_attempt_at, generation, created_at, completed_at)
    select p_workspace_id, j.id, p_subscription_id, e.id, e.event, e.record_type, e.record_id, o.status,
           o.attempts, o.attempts,
           case o.status
             when 'retrying' then now() + make_interval(secs => p_retry_delays_ms[1] / 1000.0)
             when 'pending' then now()
           end,
           -- Handed to a job: the generation a job carries starts at 2, as after crm.add_webhook_delivery_jobs elsewhere.
           case when o.status in ('retrying', 'pending') then 2 else 1 end,
           least(now(), coalesce(j.started_at, now())),
           case when o.status = 'delivered' then now() end
      from unnest(p_delivery_ids, p_event_ids, p_started_at, p_error) as j(id, event_id, started_at, error)
     cross join lateral (
       select case
                when j.started_at is null then 'pending'
                when j.error is null then 'delivered'
                when v_subscription_status = 'active' then 'retrying'
                else 'held'
              end as status,
              case when j.started_at is null then 0 else 1 end as attempts
     ) o
     cross join lateral (select e.* from crm.events e where e.workspace_id = p_workspace_id and e.id = j.event_id limit 1) e
     order by j.id
    on conflict (workspace_id, subscription_id, event_id) do nothing
    returning d.*
  )
  select array_agg(c order by c.event_id) into v_created from created c;

  -- The attempts of the deliveries just created, found by position in the arrays (at most a few
  -- hundred entries: cheaper than a join).
  insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, response_status, error, response_body_excerpt)
  select p_workspace_id, c.id, 1, p_started_at[x.i], p_duration_ms[x.i], p_response_status[x.i], p_error[x.i], p_excerpt[x.i]
    from unnest(v_created) c
   cross join lateral (select array_position(p_delivery_ids, c.id) as i) x
   where c.attempt_count = 1;

  select (select jsonb_object_agg(o.status, o.n) from (select c.status, count(*) as n from unnest(v_created) c group by c.status) o),
         array_agg(c order by c.event_id) filter (where c.status in ('retrying', 'pending'))
    into v_outcomes, v_jobs
    from unnest(v_created) c;
  perform crm.add_webhook_delivery_jobs(v_jobs, null);

  -- Attempts whose delivery existed already: logged on it (as stale, so its state stays as it is).
  if (select count(*) from unnest(v_created) c where c.attempt_count = 1) < (select count(*) from unnest(p_started_at) t where t is not null) then
    select array_agg(d.id order by j.i), array_agg(0 order by j.i), array_agg(p_started_at[j.i] order by j.i),
           array_agg(p_duration_ms[j.i] order by j.i), array_agg(p_response_status[j.i] order by j.i),
           array_agg(p_error[j.i] order by j.i), array_agg(p_excerpt[j.i] order by j.i)
      into v_existing, v_zero, v_started_at, v_duration_ms, v_response_status, v_error, v_excerpt
      from generate_subscripts(p_delivery_ids, 1) as j(i)
     cross join lateral (select d.id from crm.webhook_deliveries d
                          where d.workspace_id = p_workspace_id and d.subscription_id = p_subscription_id and d.event_id = p_event_ids[j.i]
                          limit 1) d
     where p_started_at[j.i] is not null
       and not (p_delivery_ids[j.i] = any (coalesce((select array_agg(c.id) from unnest(v_created) c where c.attempt_count = 1), '{}')));
    perform crm.record_webhook_attempts(p_workspace_id, p_subscription_id, v_existing, v_zero, v_started_at, v_duration_ms,
                                       v_response_status, v_error, v_excerpt, p_retry_delays_ms);
    v_outcomes := coalesce(v_outcomes, '{}') || jsonb_build_object('existing', coalesce(cardinality(v_existing), 0));
  end if;
  return coalesce(v_outcomes, '{}');
end
$$;
comment on function crm.record_first_webhook_attempts(uuid, uuid, uuid[], uuid[], timestamptz[], integer[], integer[], text[], text[], integer[]) is
  'Creates the deliveries fan_out_event attempted (or could not attempt yet) with their first attempts: delivered, retrying (job added), held, or pending (job added).';

-- ---------------------------------------------------------------------------------------------
-- deliver_webhook's read, with the body in the same shape as the first attempts'
-- ---------------------------------------------------------------------------------------------

drop function crm.webhook_deliveries_to_send(uuid, uuid, uuid[], integer[]);

-- What deliver_webhook needs for one batch: a row per delivery that is still due under the
-- generation its job carries (stale and final ones are left out), with the body around
-- delivered_at, the endpoint and its secrets. A paused subscription or a lapsed plan turns the
-- batch's deliveries held instead, and no row comes back (resume releases them).
create function crm.webhook_deliveries_to_send(p_workspace_id uuid, p_subscription_id uuid, p_delivery_ids uuid[], p_generations integer[])
returns table (
  delivery_id uuid, generation integer, event_id uuid, event text, body_head text, body_tail text,
  url text, secret_encrypted bytea, previous_secret_encrypted bytea
)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
-- A batch is at most 100 primary-key probes: never a hash, merge or bitmap plan over a whole
-- workspace, which the statistics of a table that grew fast since its last ANALYZE can suggest.
set enable_hashjoin = off
set enable_mergejoin = off
set enable_bitmapscan = off
as $$
declare
  v_subscription crm.webhook_subscriptions;
  v_slug text;
begin
  select * into v_subscription from crm.webhook_subscriptions s where s.workspace_id = p_workspace_id and s.id = p_subscription_id;
  if not found then
    return; -- deleted, and its deliveries with it
  end if;
  if v_subscription.status <> 'active' or not crm.webhooks_enabled(p_workspace_id) then
    update crm.webhook_deliveries d set status = 'held', next_attempt_at = null, in_release = false
     where d.ctid = any (array(
             select x.ctid from unnest(p_delivery_ids, p_generations) as j(id, generation)
              cross join lateral (select d2.ctid, d2.subscription_id, d2.generation from crm.webhook_deliveries d2
                                   where d2.workspace_id = p_workspace_id and d2.id = j.id limit 1) x
              where x.subscription_id = p_subscription_id and x.generation = j.generation))
       and d.status in ('pending', 'retrying');
    return;
  end if;
  select w.slug into v_slug from crm.workspaces w where w.id = p_workspace_id;
  return query
    select d.id, d.generation, e.id, e.event, crm.webhook_body_head(e.id, e.event, e.occurred_at), crm.webhook_body_tail(d.id, p_workspace_id, v_slug, e.data, e.actor),
           v_subscription.url, v_subscription.secret_encrypted,
           case when v_subscription.previous_secret_expires_at > now() then v_subscription.previous_secret_encrypted end
      from unnest(p_delivery_ids, p_generations) with ordinality as j(id, generation, i)
     cross join lateral (select d.* from crm.webhook_deliveries d where d.workspace_id = p_workspace_id and d.id = j.id limit 1) d
     cross join lateral (select e.* from crm.events e where e.workspace_id = p_workspace_id and e.id = d.event_id limit 1) e
     where d.subscription_id = p_subscription_id and d.generation = j.generation and d.status in ('pending', 'retrying')
     order by j.i;
end
$$;
comment on function crm.webhook_deliveries_to_send(uuid, uuid, uuid[], integer[]) is
  'deliver_webhook''s read for a batch: the body around delivered_at, the endpoint and its secrets per delivery still due; none for stale or final ones; holds them when paused or the plan lapsed.';
