-- Webhook operations for integrators (API.md section 7): test events, recovery of dead deliveries,
-- and what the delivery log shows of each attempt (its signature, and the body as sent).
--
-- Test events: a test delivery is a delivery row like any other (same id scheme, same jobs, same
-- state machine, same attempts), marked is_test, whose event lives in the row itself (test_event)
-- instead of the outbox: nothing happened to a record, so crm.events holds nothing for it. Its body
-- is assembled by the same functions as a real event's (crm.webhook_body_head/tail) around a sample
-- record rendered by the outbox's own renderers (crm.<type>_jsonb), plus "test": true at the end.
-- A test delivery is sent even while its subscription is paused (every attempt of its cycle) and is
-- left out of the statistics, the auto-pause rule and recovery.
--
-- Recovery: every dead delivery of a subscription created in a window gets a fresh cycle in one
-- UPDATE, and its deliver_webhook jobs (batches of 100, oldest first) are added in the same call,
-- so any number of deliveries is queued at once and then sent at the worker's usual rate.
--
-- Every function here that a request calls is granted to crm_api by name; the worker's functions
-- redefined here (crm.webhook_deliveries_to_send, crm.record_webhook_attempts) keep the privileges
-- their first definition gave them (create or replace keeps them): worker only.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- ---------------------------------------------------------------------------------------------
-- Columns
-- ---------------------------------------------------------------------------------------------

-- A constant default: PostgreSQL 11 and later add the column without rewriting the table.
alter table crm.webhook_deliveries add column is_test boolean not null default false;
alter table crm.webhook_deliveries add column test_event jsonb;
-- Checked for every row written from now on. Every existing row holds the two defaults (false,
-- null), which pass, so the constraint stays NOT VALID: validating it would read the whole
-- delivery log under the exclusive lock this migration holds, to learn nothing.
alter table crm.webhook_deliveries add constraint webhook_deliveries_test_event_consistent
  check ((test_event is not null) = is_test and (test_event is null or (jsonb_typeof(test_event -> 'data' -> 'object') = 'object'
                                                                      and jsonb_typeof(test_event -> 'actor') = 'object'))) not valid;
comment on column crm.webhook_deliveries.is_test is
  'A test event (POST .../test): sent even while the subscription is paused; never counted in the stats or the auto-pause rule, never recovered.';
comment on column crm.webhook_deliveries.test_event is
  'The event of a test delivery, {data: {object, previous_attributes?}, actor}, as crm.events would hold it (a test event is not in the outbox); null for real deliveries.';

alter table crm.webhook_attempts add column signature text;
comment on column crm.webhook_attempts.signature is
  'The X-Service-Signature header the attempt carried (t=...,v1=...[,v1=...]); null when no request was sent (the address was refused).';

-- The worker's batch of attempts carries each attempt's signature too (added last: the record
-- syntax of src/webhooks/batch-sender.ts lists the fields in this order).
alter type crm.webhook_attempt_result add attribute signature text;

-- ---------------------------------------------------------------------------------------------
-- Sample events: the same renderers as the outbox
-- ---------------------------------------------------------------------------------------------

-- A realistic record of each type, rendered by crm.<type>_jsonb from a row value of its table (not
-- inserted anywhere), and for an update the diff crm.json_changes computes for real updates. The
-- rows are built with jsonb_populate_record, so a column added later is simply null here.
create function crm.webhook_sample_event_data(p_workspace_id uuid, p_event text) returns jsonb
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
  v_type text := split_part(p_event, '.', 1);
  v_action text := split_part(p_event, '.', 2);
  v_user uuid := crm.current_user_id();
  v_created timestamptz := date_trunc('second', now() - interval '41 days');
  v_updated timestamptz := date_trunc('milliseconds', now());
  v_common jsonb;
  v_before jsonb;
  v_after jsonb;
  v_object jsonb;
  v_previous jsonb;
  v_stages text[];
begin
  if p_event is null or p_event !~ '^(contact|company|deal)\.(created|updated|deleted)$' then
    raise exception 'event must be an event name such as deal.updated' using errcode = 'CR422', hint = 'validation_failed', detail = '/event';
  end if;
  v_common := jsonb_build_object('workspace_id', p_workspace_id, 'id', crm.uuid_v7(), 'owner_id', v_user,
                                 'created_at', v_created, 'updated_at', v_created, 'created_by', v_user, 'updated_by', v_user);
  if v_type = 'contact' then
    v_before := v_common || jsonb_build_object(
      'first_name', 'Ada', 'last_name', 'Lovelace', 'email', 'ada.lovelace@example.com', 'phone', '+44 20 7946 0018',
      'job_title', 'Analyst', 'city', 'London', 'country', 'United Kingdom', 'company_id', crm.uuid_v7(),
      'custom_fields', jsonb_build_object('lead_source', 'webinar', 'newsletter', true));
    v_after := v_before || jsonb_build_object('job_title', 'Head of Analytics', 'updated_at', v_updated);
    v_object := crm.contact_jsonb(jsonb_populate_record(null::crm.contacts, case v_action when 'updated' then v_after else v_before end));
    v_previous := crm.json_changes(crm.contact_jsonb(jsonb_populate_record(null::crm.contacts, v_before)), v_object);
  elsif v_type = 'company' then
    v_before := v_common || jsonb_build_object(
      'name', 'Analytical Engines Ltd', 'domain', 'analytical-engines.example', 'website', 'https://analytical-engines.example',
      'industry', 'Computer hardware', 'phone', '+44 20 7946 0410', 'city', 'London', 'country', 'United Kingdom',
      'employee_count', 95, 'annual_revenue', 4800000.00, 'description', 'Difference and analytical engines, built to order.',
      'custom_fields', jsonb_build_object('tier', 'enterprise'));
    v_after := v_before || jsonb_build_object('employee_count', 120, 'updated_at', v_updated);
    v_object := crm.company_jsonb(jsonb_populate_record(null::crm.companies, case v_action when 'updated' then v_after else v_before end));
    v_previous := crm.json_changes(crm.company_jsonb(jsonb_populate_record(null::crm.companies, v_before)), v_object);
  else
    -- A stage change, the update integrators watch for most: from the workspace's second stage to
    -- its third (qualified to proposal in the default pipeline).
    select array_agg(s.key order by s.position) into v_stages from crm.deal_stages s where s.workspace_id = p_workspace_id;
    v_before := v_common || jsonb_build_object(
      'name', 'Analytical Engines: annual licence', 'amount', 24000.00, 'currency', 'GBP',
      'stage', coalesce(v_stages[2], v_stages[1], 'qualified'), 'stage_changed_at', v_created,
      'close_date', (current_date + 30)::text, 'company_id', crm.uuid_v7(),
      'custom_fields', jsonb_build_object('seats', 40));
    v_after := v_before || jsonb_build_object('stage', coalesce(v_stages[3], v_stages[2], v_stages[1], 'proposal'),
                                              'stage_changed_at', v_updated, 'updated_at', v_updated);
    v_object := crm.deal_jsonb(jsonb_populate_record(null::crm.deals, case v_action when 'updated' then v_after else v_before end));
    v_previous := crm.json_changes(crm.deal_jsonb(jsonb_populate_record(null::crm.deals, v_before)), v_object);
  end if;
  return case v_action when 'updated' then jsonb_build_object('object', v_object, 'previous_attributes', v_previous)
                       else jsonb_build_object('object', v_object) end;
end
$$;
comment on function crm.webhook_sample_event_data(uuid, text) is
  'The data of a sample event ({object, previous_attributes?}) as the outbox triggers would write it, for a realistic record that exists nowhere; 422 for an unknown event name.';
revoke execute on function crm.webhook_sample_event_data(uuid, text) from public;
grant execute on function crm.webhook_sample_event_data(uuid, text) to crm_api;

-- A test body ends with "test": true: the same tail as a real event's, one key more.
create function crm.webhook_test_body_tail(p_delivery_id uuid, p_workspace_id uuid, p_workspace_slug text, p_data jsonb, p_actor jsonb)
returns text
language sql stable parallel safe
as $$
  select left(crm.webhook_body_tail(p_delivery_id, p_workspace_id, p_workspace_slug, p_data, p_actor), -1) || ',"test":true}'
$$;
comment on function crm.webhook_test_body_tail(uuid, uuid, text, jsonb, jsonb) is 'crm.webhook_body_tail of a test event: the same keys, then "test": true.';
revoke execute on function crm.webhook_test_body_tail(uuid, uuid, text, jsonb, jsonb) from public;
grant execute on function crm.webhook_test_body_tail(uuid, uuid, text, jsonb, jsonb) to crm_api;

-- The events page: a sample body of every event, in the caller's workspace, as a receiver would
-- get it (no "test" key: the page documents real events). The service puts delivered_at between
-- head and tail and escapes non-ASCII as it does for every attempt.
create function crm.webhook_sample_bodies() returns table (event text, body_head text, body_tail text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_slug text;
begin
  perform crm.require_webhook_admin();
  select w.slug into v_slug from crm.workspaces w where w.id = v_workspace;
  return query
    select e.name, crm.webhook_body_head(e.id, e.name, now()),
           crm.webhook_body_tail(crm.uuid_v7(), v_workspace, v_slug, crm.webhook_sample_event_data(v_workspace, e.name), crm.event_actor())
      from (select t || '.' || a as name, crm.uuid_v7() as id, ti * 3 + ai as position
              from unnest(array['contact', 'company', 'deal']) with ordinality as ty(t, ti)
             cross join unnest(array['created', 'updated', 'deleted']) with ordinality as ac(a, ai)) e
     order by e.position;
end
$$;
comment on function crm.webhook_sample_bodies() is
  'A sample body of each of the 9 events around delivered_at (head, tail), built by the functions that build real ones; admins only.';
revoke execute on function crm.webhook_sample_bodies() from public;
grant execute on function crm.webhook_sample_bodies() to crm_api;

-- The events page documents events whatever the plan: admin only, without the plan gate of
-- crm.require_webhook_access.
create function crm.require_webhook_admin() returns void
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
  if not coalesce(crm.is_admin_for('webhooks:manage'), false) then
    raise exception 'webhooks are managed by workspace admins' using errcode = 'CR403', hint = 'forbidden';
  end if;
end
$$;
comment on function crm.require_webhook_admin() is 'Raises CR403 forbidden unless the caller is an admin of the current workspace whose token may manage webhooks.';
revoke execute on function crm.require_webhook_admin() from public;
grant execute on function crm.require_webhook_admin() to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Test events
-- ---------------------------------------------------------------------------------------------

-- A test delivery: created pending with its job, due at once, whatever the subscription's status.
-- Any of the 9 events may be tested, subscribed or not (an endpoint is often checked before its
-- events are chosen). Returns the delivery's id.
create function crm.send_webhook_test_event(p_subscription_id uuid, p_event text) returns uuid
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_data jsonb;
  v_event_id uuid := crm.uuid_v7();
  v_delivery crm.webhook_deliveries;
begin
  perform crm.require_webhook_access();
  v_data := crm.webhook_sample_event_data(v_workspace, p_event);
  -- A key-share lock keeps the subscription from being deleted until the delivery exists.
  perform 1 from crm.webhook_subscriptions s where s.workspace_id = v_workspace and s.id = p_subscription_id for key share;
  if not found then
    raise exception 'no such webhook subscription' using errcode = 'CR404', hint = 'not_found';
  end if;
  insert into crm.webhook_deliveries (workspace_id, id, subscription_id, event_id, event, record_type, record_id, status,
                                      next_attempt_at, generation, is_test, test_event)
  values (v_workspace, crm.webhook_delivery_id(v_event_id, p_subscription_id), p_subscription_id, v_event_id, p_event,
          split_part(p_event, '.', 1), (v_data -> 'object' ->> 'id')::uuid, 'pending', now(),
          -- The generation a job carries starts at 2, as everywhere a job is added to a row.
          2, true, jsonb_build_object('data', v_data, 'actor', crm.event_actor()))
  returning * into v_delivery;
  perform crm.add_webhook_delivery_jobs(array[v_delivery], now());
  return v_delivery.id;
end
$$;
comment on function crm.send_webhook_test_event(uuid, text) is
  'A test delivery of a sample event to a subscription (API.md section 7: POST .../test), sent at once even while paused; returns its delivery id.';
revoke execute on function crm.send_webhook_test_event(uuid, text) from public;
grant execute on function crm.send_webhook_test_event(uuid, text) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Recovery
-- ---------------------------------------------------------------------------------------------

-- The window of a recovery: since at most 30 days back (the log keeps 30 days), until after since.
create function crm.check_webhook_recovery_window(p_since timestamptz, p_until timestamptz) returns void
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_since is null then
    raise exception 'since is required' using errcode = 'CR422', hint = 'validation_failed', detail = '/since';
  end if;
  if p_since < now() - interval '30 days' then
    raise exception 'since must be at most 30 days back' using errcode = 'CR422', hint = 'validation_failed', detail = '/since';
  end if;
  if p_until is not null and p_until <= p_since then
    raise exception 'until must be later than since' using errcode = 'CR422', hint = 'validation_failed', detail = '/until';
  end if;
end
$$;
comment on function crm.check_webhook_recovery_window(timestamptz, timestamptz) is
  'Raises CR422 unless since is set and at most 30 days back and until (when set) is later than since.';
revoke execute on function crm.check_webhook_recovery_window(timestamptz, timestamptz) from public;
grant execute on function crm.check_webhook_recovery_window(timestamptz, timestamptz) to crm_api;

-- How many deliveries a recovery with this window would send again (the UI asks before it does).
create function crm.webhook_recovery_count(p_subscription_id uuid, p_since timestamptz, p_until timestamptz default null) returns integer
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_count integer;
begin
  perform crm.require_webhook_access();
  perform 1 from crm.webhook_subscriptions s where s.workspace_id = v_workspace and s.id = p_subscription_id;
  if not found then
    raise exception 'no such webhook subscription' using errcode = 'CR404', hint = 'not_found';
  end if;
  perform crm.check_webhook_recovery_window(p_since, p_until);
  -- Dead deliveries created since p_since completed after it: webhook_deliveries_completed's range.
  select count(*) into v_count from crm.webhook_deliveries d
   where d.workspace_id = v_workspace and d.subscription_id = p_subscription_id
     and d.completed_at >= p_since and d.status = 'dead' and not d.is_test
     and d.created_at >= p_since and d.created_at < coalesce(p_until, now());
  return v_count;
end
$$;
comment on function crm.webhook_recovery_count(uuid, timestamptz, timestamptz) is
  'The number of dead deliveries crm.recover_webhook_deliveries would send again for this window (runs as the caller, under row-level security).';
revoke execute on function crm.webhook_recovery_count(uuid, timestamptz, timestamptz) from public;
grant execute on function crm.webhook_recovery_count(uuid, timestamptz, timestamptz) to crm_api;

-- Every dead delivery of the subscription created in [since, until) gets a fresh cycle, same
-- delivery_id, in one UPDATE; the jobs follow in the same call, in event order (oldest first),
-- 100 deliveries a job. Only dead rows move: a delivery pending, retrying or held (already being
-- sent, or waiting for resume) is left as it is, so nothing is sent twice; a second recovery finds
-- nothing left to do. A paused subscription holds what it recovers, as it holds everything.
-- The subscription row is share-locked first, the order resume and the worker's auto-pause lock
-- in: a resume cannot miss deliveries held here, nor a recovery read a status a resume changes.
create function crm.recover_webhook_deliveries(p_subscription_id uuid, p_since timestamptz, p_until timestamptz default null)
returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_status text;
  v_count integer;
  v_pending crm.webhook_deliveries[];
begin
  perform crm.require_webhook_access();
  select s.status into v_status from crm.webhook_subscriptions s
   where s.workspace_id = v_workspace and s.id = p_subscription_id for share;
  if not found then
    raise exception 'no such webhook subscription' using errcode = 'CR404', hint = 'not_found';
  end if;
  perform crm.check_webhook_recovery_window(p_since, p_until);
  with recovered as (
    update crm.webhook_deliveries d
       set status = case when v_status = 'active' then 'pending' else 'held' end,
           cycle_attempts = 0, generation = d.generation + 1, completed_at = null, in_release = false,
           next_attempt_at = case when v_status = 'active' then now() end, updated_at = now()
     where d.workspace_id = v_workspace and d.subscription_id = p_subscription_id
       and d.completed_at >= p_since and d.status = 'dead' and not d.is_test
       and d.created_at >= p_since and d.created_at < coalesce(p_until, now())
    returning d.*
  )
  select count(*), array_agg(r order by r.event_id) filter (where r.status = 'pending') into v_count, v_pending from recovered r;
  perform crm.add_webhook_delivery_jobs(v_pending, now());
  return v_count;
end
$$;
comment on function crm.recover_webhook_deliveries(uuid, timestamptz, timestamptz) is
  'API.md section 7, POST .../recover: a fresh cycle for every dead delivery created in [since, until) (until defaults to now), sent oldest first (held while paused); returns how many.';
revoke execute on function crm.recover_webhook_deliveries(uuid, timestamptz, timestamptz) from public;
grant execute on function crm.recover_webhook_deliveries(uuid, timestamptz, timestamptz) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- The body as sent, for the delivery log
-- ---------------------------------------------------------------------------------------------

-- A delivery's body around delivered_at, built as the worker builds it (crm.events is the owner's,
-- so this reads it for the caller after the webhook access check). The service writes an attempt's
-- started_at between head and tail: that is the attempt's delivered_at, so the result is the
-- attempt's body byte for byte, and its stored signature verifies against it.
create function crm.webhook_delivery_body(p_subscription_id uuid, p_delivery_id uuid) returns table (body_head text, body_tail text)
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
begin
  perform crm.require_webhook_access();
  return query
    select crm.webhook_body_head(d.event_id, d.event, coalesce(e.occurred_at, d.created_at)),
           case when d.is_test then crm.webhook_test_body_tail(d.id, v_workspace, w.slug, d.test_event -> 'data', d.test_event -> 'actor')
                else crm.webhook_body_tail(d.id, v_workspace, w.slug, e.data, e.actor) end
      from crm.webhook_deliveries d
      join crm.workspaces w on w.id = d.workspace_id
      left join crm.events e on not d.is_test and e.workspace_id = d.workspace_id and e.id = d.event_id
     where d.workspace_id = v_workspace and d.subscription_id = p_subscription_id and d.id = p_delivery_id
       and (d.is_test or e.id is not null);
end
$$;
comment on function crm.webhook_delivery_body(uuid, uuid) is
  'The body of a delivery around delivered_at (head, tail), as the worker sends it; no row for an unknown delivery. Admins of the workspace with the plan only.';
revoke execute on function crm.webhook_delivery_body(uuid, uuid) from public;
grant execute on function crm.webhook_delivery_body(uuid, uuid) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Redefined from 000005_webhooks.sql: test deliveries in the state machine and the statistics
-- ---------------------------------------------------------------------------------------------

-- As in 000005, plus: the statistics leave test deliveries out.
create or replace function crm.webhook_subscription_json(p_workspace_id uuid, p_id uuid) returns json
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
                            and d.completed_at is not null and d.completed_at > now() - interval '24 hours' and not d.is_test),
        'deliveries_24h', (select count(*) from crm.webhook_deliveries d
                            where d.workspace_id = s.workspace_id and d.subscription_id = s.id
                              and d.id >= crm.uuid_v7_floor(now() - interval '24 hours') and not d.is_test),
        'last_delivery_at', (select to_char(d.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                               from crm.webhook_deliveries d
                              where d.workspace_id = s.workspace_id and d.subscription_id = s.id and not d.is_test
                              order by d.id desc limit 1)))
    from crm.webhook_subscriptions s
   where s.workspace_id = p_workspace_id and s.id = p_id
$$;

-- As in 000005, plus: a test delivery is never held by a paused subscription (a lapsed plan holds
-- it like any other), and its body comes from the row (test_event) with "test": true.
create or replace function crm.webhook_deliveries_to_send(p_workspace_id uuid, p_subscription_id uuid, p_delivery_ids uuid[], p_generations integer[])
returns table (
  delivery_id uuid, generation integer, event_id uuid, event text, body_head text, body_tail text,
  url text, secret_encrypted bytea, previous_secret_encrypted bytea
)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
-- A batch is at most 100 primary-key probes: never a hash, merge or bitmap plan over a whole
-- workspace, which the statistics of a table that grew fast since its last ANALYZE can suggest.
set enable_hashjoin = off
set enable_mergejoin = off
set enable_bitmapscan = off
set enable_seqscan = off
as $$
declare
  v_subscription crm.webhook_subscriptions;
  v_enabled boolean;
  v_slug text;
begin
  select * into v_subscription from crm.webhook_subscriptions s where s.workspace_id = p_workspace_id and s.id = p_subscription_id;
  if not found then
    return; -- deleted, and its deliveries with it
  end if;
  v_enabled := crm.webhooks_enabled(p_workspace_id);
  if v_subscription.status <> 'active' or not v_enabled then
    update crm.webhook_deliveries d set status = 'held', next_attempt_at = null, in_release = false
     where d.ctid = any (array(
             select x.ctid from unnest(p_delivery_ids, p_generations) as j(id, generation)
              cross join lateral (select d2.ctid, d2.subscription_id, d2.generation, d2.is_test from crm.webhook_deliveries d2
                                   where d2.workspace_id = p_workspace_id and d2.id = j.id limit 1) x
              where x.subscription_id = p_subscription_id and x.generation = j.generation and (not v_enabled or not x.is_test)))
       and d.status in ('pending', 'retrying');
    if not v_enabled then
      return;
    end if;
  end if;
  select w.slug into v_slug from crm.workspaces w where w.id = p_workspace_id;
  return query
    select d.id, d.generation, d.event_id, d.event, crm.webhook_body_head(d.event_id, d.event, coalesce(e.occurred_at, d.created_at)),
           case when d.is_test then crm.webhook_test_body_tail(d.id, p_workspace_id, v_slug, d.test_event -> 'data', d.test_event -> 'actor')
                else crm.webhook_body_tail(d.id, p_workspace_id, v_slug, e.data, e.actor) end,
           v_subscription.url, v_subscription.secret_encrypted,
           case when v_subscription.previous_secret_expires_at > now() then v_subscription.previous_secret_encrypted end
      from unnest(p_delivery_ids, p_generations) with ordinality as j(id, generation, i)
     cross join lateral (select d.* from crm.webhook_deliveries d where d.workspace_id = p_workspace_id and d.id = j.id limit 1) d
      left join lateral (select e.* from crm.events e where not d.is_test and e.workspace_id = p_workspace_id and e.id = d.event_id limit 1) e on true
     where d.subscription_id = p_subscription_id and d.generation = j.generation and d.status in ('pending', 'retrying')
       and (d.is_test or e.id is not null) and (v_subscription.status = 'active' or d.is_test)
     order by j.i;
end
$$;
comment on function crm.webhook_deliveries_to_send(uuid, uuid, uuid[], integer[]) is
  'deliver_webhook''s read for a batch: the body around delivered_at, the endpoint and its secrets per delivery still due; none for stale or final ones; holds them when paused (test deliveries excepted) or the plan lapsed.';

-- As in 000005, plus: each attempt's signature is logged, a test delivery is never held (its cycle
-- goes on while the subscription is paused), and the auto-pause rule counts no test delivery.
create or replace function crm.record_webhook_attempts(
  p_workspace_id uuid, p_subscription_id uuid, p_results crm.webhook_attempt_result[], p_retry_delays interval[] default null
) returns jsonb
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
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
      insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, response_status, error, response_body_excerpt, signature)
      select p_workspace_id, c.id, 1, r.started_at, r.duration_ms, r.response_status, r.error, r.response_body_excerpt, r.signature
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
      select row(d.id, r.event_id, 0, r.started_at, r.duration_ms, r.response_status, r.error, r.response_body_excerpt, r.signature)::crm.webhook_attempt_result
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
         select d.ctid as row_ctid, d.generation, d.status, d.attempt_count, d.cycle_attempts, d.is_test from crm.webhook_deliveries d
          where d.workspace_id = p_workspace_id and d.id = r.delivery_id
            for update) d
       -- A test delivery is never held: it goes on as if its subscription were active.
       cross join lateral crm.webhook_attempt_next_state(r.started_at, r.error, d.cycle_attempts,
                                                         case when d.is_test then 'active' else v_subscription_status end, v_retry_delays) n
    ), logged as (
      insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, response_status, error, response_body_excerpt, signature)
      select p_workspace_id, a.delivery_id, a.attempt_count + 1, a.started_at, a.duration_ms, a.response_status, a.error, a.response_body_excerpt, a.signature
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

  -- Auto-pause (API.md section 8), test deliveries left out; the subscription row is locked since
  -- the batch had failures.
  if v_outcomes ? 'dead' then
    select count(*), count(*) filter (where d.status = 'dead') into v_final_total, v_final_dead
      from crm.webhook_deliveries d
     where d.workspace_id = p_workspace_id and d.subscription_id = p_subscription_id
       and d.completed_at is not null and d.completed_at > now() - interval '24 hours' and not d.is_test;
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


-- As in 000005, plus: a test delivery's fresh cycle is sent even while the subscription is paused.
create or replace function crm.redeliver_webhook(p_subscription_id uuid, p_delivery_id uuid) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_delivery crm.webhook_deliveries;
begin
  perform crm.require_webhook_access();
  update crm.webhook_deliveries d
     set status = case when s.status = 'active' or d.is_test then 'pending' else 'held' end,
         cycle_attempts = 0, generation = d.generation + 1, completed_at = null, in_release = false,
         next_attempt_at = case when s.status = 'active' or d.is_test then now() end
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
