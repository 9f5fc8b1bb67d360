-- Outgoing webhooks: subscriptions, deliveries and their attempts, the fan-out from the outbox,
-- the state machine of a delivery, and worker heartbeats for kill safety. API.md sections 7 and 8
-- are the contract.
--
-- Who writes what: admins change subscriptions through RLS (crm_api); deliveries and attempts are
-- written only by the worker (the owner role) and by the SECURITY DEFINER functions below, which
-- check crm.is_admin() themselves. A delivery's state changes in one function call each
-- (crm.webhook_deliveries_to_send, crm.record_webhook_attempts, ...), so a retry job is added in the
-- same transaction as the state it belongs to.
--
-- graphile-worker's own migrations run after ours (src/db/migrate.ts), so every function that
-- touches graphile_worker.* is plpgsql: its body is resolved when it runs, not when it is created.
--
-- A delivery whose first attempt succeeds costs the database one row and one attempt:
-- fan_out_event (workers/fan_out_event.ts) makes the first attempts before their delivery rows
-- exist, then writes each row once, already in the state its attempt left it in, together with the
-- attempt (crm.record_webhook_attempts). The job owns these first attempts until it has
-- recorded them: run again after a kill it sends whatever is still unrecorded, and a delivery sent
-- twice this way carries the same X-Service-Delivery-Id both times, its id being derived from its
-- event and subscription (crm.webhook_delivery_id). Later attempts belong to deliver_webhook jobs.
-- The body is assembled in SQL around its delivered_at (crm.webhook_body_head/tail), from the text
-- PostgreSQL writes for the event anyway. The plan gate is evaluated once per workspace of a batch.
-- The worker's reads find events by primary-key probes whatever the statistics say.

-- Transaction-local limits, as in every migration: waiting long for a lock would hold up every
-- query queued behind the migration, and no statement here should run for long.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- ---------------------------------------------------------------------------------------------
-- Event names and patterns
-- ---------------------------------------------------------------------------------------------

create function crm.webhook_event_patterns_are_valid(patterns text[]) returns boolean
language sql immutable parallel safe
as $$
  select coalesce(bool_and(p ~ '^(\*|(contact|company|deal)\.(\*|created|updated|deleted))$'), false)
    from unnest(patterns) p
$$;
comment on function crm.webhook_event_patterns_are_valid(text[]) is 'CHECK for events: each entry an event name, contact.*, company.*, deal.* or *.';

create function crm.webhook_event_matches(patterns text[], event text) returns boolean
language sql immutable parallel safe
as $$
  select '*' = any (patterns) or event = any (patterns) or split_part(event, '.', 1) || '.*' = any (patterns)
$$;
comment on function crm.webhook_event_matches(text[], text) is 'Whether an event name matches any of a subscription''s patterns.';

-- The smallest UUIDv7 of a moment: "ids created since t" becomes an index range on time-ordered ids.
create function crm.uuid_v7_floor(t timestamptz) returns uuid
language sql immutable parallel safe
as $$
  select (lpad(to_hex((extract(epoch from t) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid
$$;
comment on function crm.uuid_v7_floor(timestamptz) is 'The lowest crm.uuid_v7() value of a millisecond (deliveries_24h counts by id range).';

-- The plan gate (API.md section 9): pro, or inside the trial.
create function crm.webhooks_enabled(p_workspace_id uuid) returns boolean
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
  select coalesce((select w.plan = 'pro' or coalesce(w.trial_ends_at > now(), false) from crm.workspaces w where w.id = p_workspace_id), false)
$$;
comment on function crm.webhooks_enabled(uuid) is 'Webhooks work on the pro plan or while the trial runs; otherwise no route answers and no delivery is created or sent.';

-- Every webhook route calls this first: admin-only (403), then the plan (402).
create function crm.require_webhook_access() returns void
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if not crm.is_admin() then
    raise exception 'webhooks are managed by workspace admins' using errcode = 'CR403', hint = 'forbidden';
  end if;
  if not crm.webhooks_enabled(crm.current_workspace_id()) then
    raise exception 'webhooks need the Pro plan or an active trial' using errcode = 'CR402', hint = 'plan_required';
  end if;
end
$$;
comment on function crm.require_webhook_access() is 'Raises CR403 forbidden unless the caller is an admin, then CR402 plan_required unless the workspace may use webhooks.';

grant execute on function crm.webhook_event_patterns_are_valid(text[]), crm.webhook_event_matches(text[], text),
  crm.webhooks_enabled(uuid), crm.require_webhook_access(), crm.uuid_v7_floor(timestamptz) to crm_api;

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
-- Subscriptions
-- ---------------------------------------------------------------------------------------------

create table crm.webhook_subscriptions (
  workspace_id uuid not null default crm.current_workspace_id() references crm.workspaces (id) on delete cascade,
  id uuid not null default crm.uuid_v7(),
  name text not null constraint webhook_subscriptions_name_length check (length(btrim(name)) between 1 and 255),
  url text not null constraint webhook_subscriptions_url_length check (length(url) between 1 and 2048),
  events text[] not null constraint webhook_subscriptions_events_valid
    check (cardinality(events) between 1 and 20 and crm.webhook_event_patterns_are_valid(events)),
  status text not null default 'active' constraint webhook_subscriptions_status_known check (status in ('active', 'paused')),
  paused_reason text constraint webhook_subscriptions_paused_reason_known check (paused_reason in ('manual', 'auto')),
  paused_at timestamptz,
  secret_encrypted bytea not null,
  secret_last4 text not null constraint webhook_subscriptions_secret_last4_length check (length(secret_last4) = 4),
  previous_secret_encrypted bytea,
  previous_secret_expires_at timestamptz,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  created_by uuid default crm.current_user_id(),
  primary key (workspace_id, id),
  constraint webhook_subscriptions_paused_consistent check (
    (status = 'paused') = (paused_reason is not null) and (status = 'paused') = (paused_at is not null)),
  constraint webhook_subscriptions_previous_secret_consistent check (
    (previous_secret_encrypted is null) = (previous_secret_expires_at is null))
);
alter table crm.webhook_subscriptions enable row level security;
-- The primary key (workspace_id, id) serves the policies, the list (keyset on id) and fan-out.
create trigger tg_webhook_subscriptions__touch_updated_at before update on crm.webhook_subscriptions
  for each row execute function crm.tg__touch_updated_at();

-- At most 100 per workspace, and none without the plan. The advisory lock makes two concurrent
-- creations count one after the other.
create function crm.tg_webhook_subscriptions__check_limits() returns trigger
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if not crm.webhooks_enabled(new.workspace_id) then
    raise exception 'webhooks need the Pro plan or an active trial' using errcode = 'CR402', hint = 'plan_required';
  end if;
  perform pg_advisory_xact_lock(hashtextextended('crm.webhook_subscriptions/' || new.workspace_id::text, 0));
  if (select count(*) from crm.webhook_subscriptions s where s.workspace_id = new.workspace_id) >= 100 then
    raise exception 'a workspace holds at most 100 webhook subscriptions' using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return new;
end
$$;
create trigger tg_webhook_subscriptions__check_limits before insert on crm.webhook_subscriptions
  for each row execute function crm.tg_webhook_subscriptions__check_limits();
comment on function crm.tg_webhook_subscriptions__check_limits() is 'Refuses a subscription without the plan (402) or beyond 100 per workspace (422).';

comment on table crm.webhook_subscriptions is 'Webhook endpoints of a workspace (API.md section 7). Admins only; the secret is AES-256-GCM encrypted by the service (APP_SECRET via HKDF).';
comment on column crm.webhook_subscriptions.secret_encrypted is 'iv | tag | ciphertext of the whsec_ secret, additional data = workspace id; never readable by crm_api.';
comment on column crm.webhook_subscriptions.previous_secret_encrypted is 'The secret before the last rotation; signs too until previous_secret_expires_at.';

create policy webhook_subscriptions_all_admin on crm.webhook_subscriptions for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy webhook_subscriptions_all_admin on crm.webhook_subscriptions is 'Admins of the current workspace see and manage its subscriptions; everyone else sees none.';

grant select (workspace_id, id, name, url, events, status, paused_reason, paused_at, secret_last4, previous_secret_expires_at, created_at, updated_at, created_by)
  on crm.webhook_subscriptions to crm_api;
grant insert (name, url, events, secret_encrypted, secret_last4) on crm.webhook_subscriptions to crm_api;
grant update (name, url, events, status, paused_reason, paused_at, secret_encrypted, secret_last4, previous_secret_encrypted, previous_secret_expires_at)
  on crm.webhook_subscriptions to crm_api;
grant delete on crm.webhook_subscriptions to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Deliveries and attempts
-- ---------------------------------------------------------------------------------------------

create table crm.webhook_deliveries (
  workspace_id uuid not null,
  id uuid not null default crm.uuid_v7(),
  subscription_id uuid not null,
  event_id uuid not null,
  event text not null,
  record_type text not null,
  record_id uuid not null,
  status text not null default 'pending'
    constraint webhook_deliveries_status_known check (status in ('pending', 'retrying', 'delivered', 'dead', 'held')),
  attempt_count integer not null default 0 constraint webhook_deliveries_attempt_count_check check (attempt_count >= 0),
  cycle_attempts integer not null default 0 constraint webhook_deliveries_cycle_attempts_check check (cycle_attempts >= 0),
  next_attempt_at timestamptz,
  generation integer not null default 1,
  in_release boolean not null default false,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  completed_at timestamptz,
  primary key (workspace_id, id),
  constraint webhook_deliveries_subscription_fkey foreign key (workspace_id, subscription_id)
    references crm.webhook_subscriptions (workspace_id, id) on delete cascade,
  constraint webhook_deliveries_completed_when_final check ((status in ('delivered', 'dead')) = (completed_at is not null))
);
alter table crm.webhook_deliveries enable row level security;
create unique index webhook_deliveries_subscription_event on crm.webhook_deliveries (workspace_id, subscription_id, event_id);
comment on index crm.webhook_deliveries_subscription_event is 'One delivery per subscription and event: a re-run fan-out creates nothing twice.';
create index webhook_deliveries_log on crm.webhook_deliveries (workspace_id, subscription_id, id desc);
comment on index crm.webhook_deliveries_log is 'The delivery log, newest first (ids are time-ordered), keyset cursor on id; the cascade on subscription delete.';
create index webhook_deliveries_completed on crm.webhook_deliveries (workspace_id, subscription_id, completed_at) where completed_at is not null;
comment on index crm.webhook_deliveries_completed is 'Stats and the auto-pause rule: final deliveries of the last 24 hours.';
create index webhook_deliveries_held on crm.webhook_deliveries (workspace_id, subscription_id, event_id) where status = 'held' or in_release;
comment on index crm.webhook_deliveries_held is 'Resume releases held deliveries in their original order: the order of their events (time-ordered ids written by the outbox).';
comment on index crm.webhook_deliveries_completed is 'Stats, the auto-pause rule (final deliveries of the last 24 hours) and housekeeping (final deliveries past the retention).';
-- The worker's set-wise writes set updated_at themselves; the WHEN clause (evaluated without
-- calling the function) keeps the trigger for every other update.
create trigger tg_webhook_deliveries__touch_updated_at before update on crm.webhook_deliveries
  for each row when (new.updated_at is not distinct from old.updated_at) execute function crm.tg__touch_updated_at();

create function crm.tg_webhook_deliveries__keep_identity() returns trigger
language plpgsql
as $$
begin
  if new.id <> old.id or new.workspace_id <> old.workspace_id or new.subscription_id <> old.subscription_id
     or new.event_id <> old.event_id or new.event <> old.event or new.created_at <> old.created_at then
    raise exception 'a delivery''s id, subscription and event never change' using errcode = 'CR422', hint = 'validation_failed';
  end if;
  if new.attempt_count < old.attempt_count then
    raise exception 'attempt_count only grows' using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return new;
end
$$;
-- The WHEN clause spares the function call on every update that changes none of these.
create trigger tg_webhook_deliveries__keep_identity before update on crm.webhook_deliveries
  for each row when (new.id <> old.id or new.workspace_id <> old.workspace_id or new.subscription_id <> old.subscription_id
                     or new.event_id <> old.event_id or new.event <> old.event or new.created_at <> old.created_at
                     or new.attempt_count < old.attempt_count)
  execute function crm.tg_webhook_deliveries__keep_identity();
comment on function crm.tg_webhook_deliveries__keep_identity() is 'delivery_id (and what it delivers) never changes; receivers deduplicate on it.';

comment on table crm.webhook_deliveries is
  'One event for one subscription (API.md section 7). status: pending (first attempt due), retrying, delivered, dead (every attempt of a cycle failed), held (paused subscription or lapsed plan).';
comment on column crm.webhook_deliveries.cycle_attempts is
  'Attempts in the current cycle (one more than crm.webhook_retry_delays() has delays); redeliver starts a new cycle, resume keeps it (the attempts left).';
comment on column crm.webhook_deliveries.in_release is 'Released by resume and not yet attempted: these go out one after the other in event order (crm.continue_webhook_release).';
comment on column crm.webhook_deliveries.generation is 'Bumped whenever a deliver_webhook job is added; a job whose generation differs is stale and ends quietly.';

create table crm.webhook_attempts (
  workspace_id uuid not null,
  delivery_id uuid not null,
  attempt integer not null constraint webhook_attempts_attempt_positive check (attempt >= 1),
  started_at timestamptz not null,
  duration_ms integer not null constraint webhook_attempts_duration_check check (duration_ms >= 0),
  response_status integer,
  error text constraint webhook_attempts_error_known
    check (error in ('timeout', 'connection_refused', 'dns_failed', 'address_refused', 'tls_error', 'redirect', 'http_status')),
  response_body_excerpt text constraint webhook_attempts_excerpt_length check (octet_length(response_body_excerpt) <= 8192),
  primary key (workspace_id, delivery_id, attempt),
  constraint webhook_attempts_delivery_fkey foreign key (workspace_id, delivery_id)
    references crm.webhook_deliveries (workspace_id, id) on delete cascade
);
alter table crm.webhook_attempts enable row level security;
-- The primary key serves "a delivery's attempts" and the cascade.

create function crm.tg_webhook_attempts__append_only() returns trigger
language plpgsql
as $$
begin
  raise exception 'webhook attempts are append-only' using errcode = 'CR422', hint = 'validation_failed';
end
$$;
create trigger tg_webhook_attempts__append_only before update on crm.webhook_attempts
  for each row execute function crm.tg_webhook_attempts__append_only();
comment on function crm.tg_webhook_attempts__append_only() is 'An attempt is a fact: never changed (rows leave only with their delivery).';
comment on table crm.webhook_attempts is 'Every HTTP attempt of a delivery: status, duration, error class and the first 2 KiB of the answer.';

create policy webhook_deliveries_select_admin on crm.webhook_deliveries for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy webhook_deliveries_select_admin on crm.webhook_deliveries is 'Admins of the workspace read its delivery log; writes go through SECURITY DEFINER functions only.';
create policy webhook_attempts_select_admin on crm.webhook_attempts for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy webhook_attempts_select_admin on crm.webhook_attempts is 'Admins of the workspace read the attempts of its deliveries.';
grant select on crm.webhook_deliveries, crm.webhook_attempts to crm_api;

-- ---------------------------------------------------------------------------------------------
-- A subscription as the API shows it
-- ---------------------------------------------------------------------------------------------

-- A webhook subscription as the API shows it, with its 24-hour stats, rendered in SQL as records
-- are by crm.<type>_json.
--
-- It takes the subscription's key rather than its row: crm_api may not read secret_encrypted, and
-- a whole-row reference needs every column. It runs as the caller, so row-level security decides
-- what it sees, of the subscription (admins only) and of its deliveries alike.

create function crm.webhook_subscription_json(p_workspace_id uuid, p_id uuid) returns json
language sql stable parallel safe
as $$
  select json_build_object(
      'id', s.id, 'name', s.name, 'url', s.url, 'events', s.events, 'status', s.status,
      'paused_reason', s.paused_reason,
      'paused_at', to_char(s.paused_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
      'secret_last4', s.secret_last4,
      'created_at', to_char(s.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
      'updated_at', to_char(s.updated_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
      'stats', json_build_object(
        'success_rate', (select round(count(*) filter (where d.status = 'delivered')::numeric / nullif(count(*), 0), 4)::float8
                           from crm.webhook_deliveries d
                          where d.workspace_id = s.workspace_id and d.subscription_id = s.id
                            and d.completed_at is not null and d.completed_at > now() - interval '24 hours'),
        'deliveries_24h', (select count(*) from crm.webhook_deliveries d
                            where d.workspace_id = s.workspace_id and d.subscription_id = s.id
                              and d.id >= crm.uuid_v7_floor(now() - interval '24 hours')),
        'last_delivery_at', (select to_char(d.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                               from crm.webhook_deliveries d
                              where d.workspace_id = s.workspace_id and d.subscription_id = s.id
                              order by d.id desc limit 1)))
    from crm.webhook_subscriptions s
   where s.workspace_id = p_workspace_id and s.id = p_id
$$;
comment on function crm.webhook_subscription_json(uuid, uuid) is
  'A webhook subscription exactly as the API shows it (times as crm.api_time writes them), with stats: success_rate = delivered / (delivered + dead) completed in the last 24 hours, deliveries_24h created in the last 24 hours, last_delivery_at; null when the caller cannot see it.';
grant execute on function crm.webhook_subscription_json(uuid, uuid) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Jobs: the delivery state machine (the outbox's hand-off, crm.enqueue_event_fan_out, is in
-- 000003_records.sql)
-- ---------------------------------------------------------------------------------------------

-- Deliveries go out in batches: one deliver_webhook job carries up to 100 deliveries of one
-- subscription (payload {w, s, d: [ids], g: [generations], o}), so graphile-worker's fetch and
-- completion, the read of what to send and the write of the attempts are paid once per batch.
-- A job per batch rather than per delivery keeps what jobs gave: a killed worker's job is
-- unlocked and runs again (src/worker-heartbeat.ts), retries wait for run_at.
create function crm.webhook_delivery_batch_size() returns integer
language sql immutable parallel safe
as $$ select 100 $$;
comment on function crm.webhook_delivery_batch_size() is 'The most deliveries one deliver_webhook job carries.';

-- Adds deliver_webhook jobs for the given deliveries: consecutive deliveries of one subscription
-- due at the same time share a job, at most crm.webhook_delivery_batch_size() each. Each job is due
-- at p_run_at (or, when null, its deliveries' next_attempt_at) plus a microsecond per job already
-- added: graphile-worker picks jobs by run_at, so batches start in the order given. p_ordered marks
-- resume's release (one delivery per job, one job at a time; see crm.continue_webhook_release).
create function crm.add_webhook_delivery_jobs(p_deliveries crm.webhook_deliveries[], p_run_at timestamptz, p_ordered boolean default false) returns void
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_deliveries is null or cardinality(p_deliveries) = 0 then
    return;
  end if;
  perform graphile_worker.add_jobs(array(
    select row('deliver_webhook',
               json_build_object('w', b.workspace_id, 's', b.subscription_id, 'd', b.ids, 'g', b.generations, 'o', p_ordered),
               null, b.run_at + (row_number() over (order by b.first) - 1) * interval '1 microsecond', 25, null, null, null)::graphile_worker.job_spec
      from (
        select g.workspace_id, g.subscription_id, g.run_at, min(g.i) as first,
               array_agg(g.id order by g.i) as ids, array_agg(g.generation order by g.i) as generations
          from (
            select d.workspace_id, d.subscription_id, d.id, d.generation, s.i, d.run_at,
                   (row_number() over (partition by d.workspace_id, d.subscription_id, d.run_at order by s.i) - 1)
                     / case when p_ordered then 1 else crm.webhook_delivery_batch_size() end as chunk
              from generate_subscripts(p_deliveries, 1) s(i)
             cross join lateral (
               select (p_deliveries[s.i]).workspace_id, (p_deliveries[s.i]).subscription_id, (p_deliveries[s.i]).id,
                      (p_deliveries[s.i]).generation, coalesce(p_run_at, (p_deliveries[s.i]).next_attempt_at, now()) as run_at
             ) d
          ) g
         group by g.workspace_id, g.subscription_id, g.run_at, g.chunk
      ) b
     order by b.first));
end
$$;
comment on function crm.add_webhook_delivery_jobs(crm.webhook_deliveries[], timestamptz, boolean) is
  'deliver_webhook jobs for some deliveries, batched per subscription and due time, payload {w, s, d: [ids], g: [generations], o}: workspace, subscription, deliveries with their generations, and whether they must keep their place (resume).';

-- The worker's webhook statements keep their primary-key probes when the statistics of the delivery
-- tables were taken while those were empty. After ANALYZE of an empty table (a fresh install, or
-- vacuumdb after a restore or an upgrade) the planner trusts "no rows" and picks a sequential scan,
-- and a connection keeps a plan made then until the next ANALYZE of the table: the foreign-key
-- check of every attempt against its delivery, and these functions' own probes, would then scan
-- every delivery once per delivery. Measured with the first attempts of 5,000 deliveries recorded
-- 100 at a time on one connection: 405 µs a delivery with the scans, 85 with them forbidden (and
-- about 60 when the tables were never analysed); test/webhooks/first-attempts.test.ts counts the
-- scans. So the functions below set enable_seqscan = off: set on the function, it covers the
-- statements it runs and the foreign-key checks fired by its writes, which are planned inside it.

-- What fan_out_event sends for some events: one row per event and matching active subscription,
-- with the delivery id it will have, the body around delivered_at, the endpoint and its secrets,
-- ordered by subscription. Nothing is written for these: the rows are created when their attempts
-- are recorded. A paused subscription's deliveries are created held here (nothing to send); none
-- is created while the plan has lapsed.
-- p_rerun (the job runs again after a kill or a failure): deliveries already recorded are left
-- out, and pending deliveries that no job owns and nothing attempted (generation 1, no attempt:
-- rows created ahead of their first attempt) are handed to deliver_webhook jobs.
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
set enable_seqscan = off
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

-- The state machine of a delivery in one function, and the retry schedule in one place.
--
-- Every attempt the worker makes, first or later, is recorded by crm.record_webhook_attempts: one
-- call per batch of one subscription, taking one array of crm.webhook_attempt_result. It alone
-- decides what an attempt leaves a delivery in (delivered, retrying, held, dead; pending for a first
-- attempt not made), when the next attempt is due, which deliver_webhook jobs to add, and whether
-- the subscription pauses itself (API.md section 8). The schedule is crm.webhook_retry_delays(); a
-- cycle has one attempt more than the schedule has delays.

-- The retry schedule
create function crm.webhook_retry_delays() returns interval[]
language sql immutable parallel safe
as $$ select '{30 seconds, 2 minutes, 10 minutes, 1 hour, 6 hours, 24 hours}'::interval[] $$;
comment on function crm.webhook_retry_delays() is
  'The delays before attempts 2, 3, ... of a cycle (API.md section 8); a cycle has one attempt more than there are delays. Tests pass a shorter schedule (WEBHOOK_RETRY_SCHEDULE) to crm.record_webhook_attempts.';

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

-- ---------------------------------------------------------------------------------------------
-- Admin actions that write deliveries (SECURITY DEFINER: they check the caller themselves)
-- ---------------------------------------------------------------------------------------------

create function crm.pause_webhook_subscription(p_subscription_id uuid) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform crm.require_webhook_access();
  update crm.webhook_subscriptions s set status = 'paused', paused_reason = 'manual', paused_at = now()
   where s.workspace_id = crm.current_workspace_id() and s.id = p_subscription_id and s.status = 'active';
  if not found and not exists (select 1 from crm.webhook_subscriptions s where s.workspace_id = crm.current_workspace_id() and s.id = p_subscription_id) then
    raise exception 'no such webhook subscription' using errcode = 'CR404', hint = 'not_found';
  end if;
end
$$;
comment on function crm.pause_webhook_subscription(uuid) is 'Pauses a subscription (manual): new events and due retries become held.';

-- The next step of a release: the earliest released delivery not yet attempted gets its job.
create function crm.continue_webhook_release(p_workspace_id uuid, p_subscription_id uuid) returns boolean
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
  v_next crm.webhook_deliveries;
begin
  select * into v_next from crm.webhook_deliveries d
   where d.workspace_id = p_workspace_id and d.subscription_id = p_subscription_id and d.in_release
   order by d.event_id limit 1;
  if not found then
    return false;
  end if;
  perform crm.add_webhook_delivery_jobs(array[v_next], now(), true);
  return true;
end
$$;
comment on function crm.continue_webhook_release(uuid, uuid) is 'Adds the job of the next delivery a resume released (event order); false when the release is done.';

-- Resume: held deliveries go out again in their original order with the attempts they had left.
create function crm.resume_webhook_subscription(p_subscription_id uuid) returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_released crm.webhook_deliveries[];
begin
  perform crm.require_webhook_access();
  -- The row lock orders resume against a delivery that is being recorded as held right now.
  perform 1 from crm.webhook_subscriptions s where s.workspace_id = v_workspace and s.id = p_subscription_id for update;
  if not found then
    raise exception 'no such webhook subscription' using errcode = 'CR404', hint = 'not_found';
  end if;
  update crm.webhook_subscriptions s set status = 'active', paused_reason = null, paused_at = null
   where s.workspace_id = v_workspace and s.id = p_subscription_id and s.status = 'paused';
  -- Released deliveries go out one after the other in event order: the first job is added here,
  -- and each deliver_webhook of the release adds the next (crm.continue_webhook_release).
  with released as (
    update crm.webhook_deliveries d
       set status = case when d.cycle_attempts = 0 then 'pending' else 'retrying' end,
           generation = d.generation + 1, next_attempt_at = now(), in_release = true
     where d.workspace_id = v_workspace and d.subscription_id = p_subscription_id and d.status = 'held'
    returning d.*
  )
  select array_agg(r order by r.event_id) into v_released from released r;
  if v_released is not null then
    perform crm.continue_webhook_release(v_workspace, p_subscription_id);
  end if;
  return coalesce(cardinality(v_released), 0);
end
$$;
comment on function crm.resume_webhook_subscription(uuid) is 'Resumes a subscription and releases its held deliveries in their original order; returns how many.';

create function crm.redeliver_webhook(p_subscription_id uuid, p_delivery_id uuid) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_delivery crm.webhook_deliveries;
begin
  perform crm.require_webhook_access();
  update crm.webhook_deliveries d
     set status = case when s.status = 'active' then 'pending' else 'held' end,
         cycle_attempts = 0, generation = d.generation + 1, completed_at = null, in_release = false,
         next_attempt_at = case when s.status = 'active' then now() end
    from crm.webhook_subscriptions s
   where d.workspace_id = v_workspace and d.subscription_id = p_subscription_id and d.id = p_delivery_id
     and s.workspace_id = d.workspace_id and s.id = d.subscription_id
  returning d.* into v_delivery;
  if not found then
    raise exception 'no such delivery' using errcode = 'CR404', hint = 'not_found';
  end if;
  if v_delivery.status = 'pending' then
    perform crm.add_webhook_delivery_jobs(array[v_delivery], now());
  end if;
end
$$;
comment on function crm.redeliver_webhook(uuid, uuid) is 'A fresh cycle of 7 attempts for a delivery, same delivery_id, the first at once (held when the subscription is paused).';

-- Rotation reads the current secret into previous_secret_encrypted, a column crm_api cannot read.
create function crm.rotate_webhook_secret(p_subscription_id uuid, p_secret_encrypted bytea, p_secret_last4 text, p_grace_period_seconds integer)
returns timestamptz
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_expires timestamptz;
begin
  perform crm.require_webhook_access();
  if p_grace_period_seconds not between 0 and 604800 then
    raise exception 'grace_period_seconds must be 0 to 604800' using errcode = 'CR422', hint = 'validation_failed', detail = '/grace_period_seconds';
  end if;
  update crm.webhook_subscriptions s
     set previous_secret_encrypted = case when p_grace_period_seconds > 0 then s.secret_encrypted end,
         previous_secret_expires_at = case when p_grace_period_seconds > 0 then now() + make_interval(secs => p_grace_period_seconds) end,
         secret_encrypted = p_secret_encrypted, secret_last4 = p_secret_last4
   where s.workspace_id = crm.current_workspace_id() and s.id = p_subscription_id
  returning s.previous_secret_expires_at into v_expires;
  if not found then
    raise exception 'no such webhook subscription' using errcode = 'CR404', hint = 'not_found';
  end if;
  return v_expires;
end
$$;
comment on function crm.rotate_webhook_secret(uuid, bytea, text, integer) is 'Replaces the secret; the old one keeps signing (second v1) for the grace period, none when it is 0.';

grant execute on function crm.pause_webhook_subscription(uuid), crm.resume_webhook_subscription(uuid), crm.redeliver_webhook(uuid, uuid),
  crm.rotate_webhook_secret(uuid, bytea, text, integer) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Worker heartbeats: kill safety
-- ---------------------------------------------------------------------------------------------
-- graphile-worker keeps the jobs of a worker that died without shutting down (kill -9, lost
-- machine) locked for 4 hours. Every worker pool of this service beats here every few seconds;
-- each beat also frees the jobs of pools that stopped beating, and of pools that never beat
-- whose locks are older than the staleness limit.

create table crm.worker_heartbeats (
  worker_id text primary key,
  started_at timestamptz not null default now(),
  beat_at timestamptz not null default now(),
  host text
);
alter table crm.worker_heartbeats enable row level security;
comment on table crm.worker_heartbeats is 'One row per live graphile-worker pool (its locked_by id); the owner role only.';

create function crm.worker_heartbeat(p_worker_id text, p_host text, p_stale_after interval) returns text[]
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
  v_dead text[];
begin
  insert into crm.worker_heartbeats as h (worker_id, host) values (p_worker_id, p_host)
  on conflict (worker_id) do update set beat_at = now();
  with stale as (
    delete from crm.worker_heartbeats h where h.beat_at < now() - p_stale_after returning h.worker_id
  )
  select array_agg(worker_id) into v_dead from (
    select worker_id from stale
    union
    select j.locked_by from graphile_worker._private_jobs j
     where j.locked_by is not null and j.locked_at < now() - p_stale_after
       and not exists (select 1 from crm.worker_heartbeats h where h.worker_id = j.locked_by)
    union
    select q.locked_by from graphile_worker._private_job_queues q
     where q.locked_by is not null and q.locked_at < now() - p_stale_after
       and not exists (select 1 from crm.worker_heartbeats h where h.worker_id = q.locked_by)
  ) dead;
  if v_dead is not null then
    perform graphile_worker.force_unlock_workers(v_dead);
  end if;
  return coalesce(v_dead, '{}');
end
$$;
comment on function crm.worker_heartbeat(text, text, interval) is
  'Records a beat of one worker pool and force-unlocks the jobs of pools silent for longer than p_stale_after; returns the ids it unlocked.';

create function crm.worker_stopped(p_worker_id text) returns void
language sql volatile
as $$
  delete from crm.worker_heartbeats where worker_id = p_worker_id
$$;
comment on function crm.worker_stopped(text) is 'A pool that shut down cleanly (its jobs already released) leaves the heartbeat table.';

-- ---------------------------------------------------------------------------------------------
-- Housekeeping (crm.housekeeping runs every crm.prune_* function)
-- ---------------------------------------------------------------------------------------------

-- Every delivery belongs to a subscription (its foreign key cascades), so visiting each
-- subscription's range of webhook_deliveries_completed finds all of them.
create function crm.prune_webhook_deliveries(log_retention_days integer) returns bigint
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
