-- Events and webhooks: the outbox, subscriptions, deliveries and their attempts, test events and
-- recovery.
-- Applied by `crm migrate` whenever a file of sql/definitions/ changes, as a whole and in file order
-- (sql/CONVENTIONS.md): edit the definition here; it is the only one.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.event_actor()
 returns jsonb
 language sql
 stable
as $function$
  select case when c.user_id is null
              then jsonb_build_object('type', 'system', 'id', null, 'via', 'system')
              when c.app_id is not null
              then jsonb_build_object('type', 'user', 'id', c.user_id,
                                      'via', case when c.via = 'api' then 'oauth' else c.via end, 'app_id', c.app_id)
              else jsonb_build_object('type', 'user', 'id', c.user_id, 'via', c.via)
         end
    from (select crm.current_user_id() as user_id, crm.current_oauth_app_id() as app_id, coalesce(crm.current_via(), 'api') as via) c
$function$;
comment on function crm.event_actor() is
  'The actor of an event from the request context: the user and how they came in (api, ui, import; oauth with app_id '
  'for an OAuth app''s access token, an import queued through an app keeps via import and names the app), or system.';
grant execute on function crm.event_actor() to crm_api;

create or replace function crm.json_changes(before jsonb, after jsonb)
 returns jsonb
 language sql
 immutable parallel safe
as $function$
  select coalesce(jsonb_object_agg(o.key, o.value), '{}'::jsonb)
    from jsonb_each(before) as o
   where o.key not in ('updated_at', 'updated_by')
     and o.value is distinct from after -> o.key
$function$;
comment on function crm.json_changes(before jsonb, after jsonb) is
  'previous_attributes of an event: the old value of every field that differs (updated_at/updated_by excluded).';
grant execute on function crm.json_changes(before jsonb, after jsonb) to crm_api;

create or replace function crm.enqueue_event_fan_out(event_ids uuid[])
 returns void
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if event_ids is null or cardinality(event_ids) = 0 then
    return;
  end if;
  perform graphile_worker.add_job('fan_out_event', json_build_object('event_ids', event_ids), max_attempts => 25,
                                  job_key => 'fan_out_event:' || event_ids[1]::text, job_key_mode => 'unsafe_dedupe');
end
$function$;
comment on function crm.enqueue_event_fan_out(event_ids uuid[]) is
  'Called by the outbox triggers with the ids of the events one statement wrote: adds one fan_out_event job for them, '
  'keyed by the first event id (a plain insert into the queue, no scan of it).';

create or replace function crm.tg_webhook_subscriptions__check_limits()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.tg_webhook_subscriptions__check_limits() is
  'Refuses a subscription without the plan (402) or beyond 100 per workspace (422).';
grant execute on function crm.tg_webhook_subscriptions__check_limits() to crm_api;

create or replace function crm.webhooks_enabled(p_workspace_id uuid)
 returns boolean
 language sql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select coalesce((select w.plan = 'pro' or coalesce(w.trial_ends_at > now(), false) from crm.workspaces w where w.id = p_workspace_id), false)
$function$;
comment on function crm.webhooks_enabled(p_workspace_id uuid) is
  'Webhooks work on the pro plan or while the trial runs; otherwise no route answers and no delivery is created or '
  'sent.';

create or replace function crm.require_webhook_access()
 returns void
 language plpgsql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if not crm.is_admin() then
    raise exception 'webhooks are managed by workspace admins' using errcode = 'CR403', hint = 'forbidden';
  end if;
  if not crm.is_admin_for('webhooks:manage') then
    raise exception 'this token''s scopes do not include webhooks:manage' using errcode = 'CR403', hint = 'insufficient_scope';
  end if;
  if not crm.webhooks_enabled(crm.current_workspace_id()) then
    raise exception 'webhooks need the Pro plan or an active trial' using errcode = 'CR402', hint = 'plan_required';
  end if;
end
$function$;
comment on function crm.require_webhook_access() is
  'Raises CR403 forbidden unless the caller is an admin, CR403 insufficient_scope when the token lacks '
  'webhooks:manage, then CR402 plan_required unless the workspace may use webhooks.';
grant execute on function crm.require_webhook_access() to crm_api;

create or replace function crm.require_webhook_admin()
 returns void
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
begin
  if not coalesce(crm.is_admin_for('webhooks:manage'), false) then
    raise exception 'webhooks are managed by workspace admins' using errcode = 'CR403', hint = 'forbidden';
  end if;
end
$function$;
comment on function crm.require_webhook_admin() is
  'Raises CR403 forbidden unless the caller is an admin of the current workspace whose token may manage webhooks.';
grant execute on function crm.require_webhook_admin() to crm_api;

create or replace function crm.webhook_subscription_json(p_workspace_id uuid, p_id uuid)
 returns json
 language sql
 stable parallel safe
as $function$
  select json_build_object(
      'id', s.id, 'name', s.name, 'url', s.url, 'events', s.events, 'status', s.status,
      'paused_reason', s.paused_reason,
      'paused_at', to_char(s.paused_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
      'health', case
                  when s.status = 'paused' then 'paused'
                  when (select count(*) = 3 and bool_and(l.error is not null)
                          from (select a.error from crm.webhook_attempts a
                                 where a.workspace_id = s.workspace_id and a.subscription_id = s.id and not a.is_test
                                 order by a.started_at desc limit 3) l) then 'failing'
                  else 'healthy'
                end,
      'secret_last4', s.secret_last4,
      'created_at', to_char(s.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
      'updated_at', to_char(s.updated_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
      'stats', json_build_object(
        'success_rate', round(r.succeeded::numeric / nullif(r.attempts, 0), 4)::float8,
        'attempts_24h', r.attempts,
        'deliveries_24h', (select count(*) from crm.webhook_deliveries d
                            where d.workspace_id = s.workspace_id and d.subscription_id = s.id
                              and d.id >= crm.uuid_v7_floor(now() - interval '24 hours') and not d.is_test),
        'last_delivery_at', (select to_char(d.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                               from crm.webhook_deliveries d
                              where d.workspace_id = s.workspace_id and d.subscription_id = s.id and not d.is_test
                              order by d.id desc limit 1)))
    from crm.webhook_subscriptions s
   cross join lateral (select count(*) as attempts, count(*) filter (where a.error is null) as succeeded
                         from crm.webhook_attempts a
                        where a.workspace_id = s.workspace_id and a.subscription_id = s.id and not a.is_test
                          and a.started_at > now() - interval '24 hours') r
   where s.workspace_id = p_workspace_id and s.id = p_id
$function$;
comment on function crm.webhook_subscription_json(p_workspace_id uuid, p_id uuid) is
  'A webhook subscription exactly as the API shows it (times as crm.api_time writes them), with stats: success_rate = '
  'successful / all attempts started in the last 24 hours (a retrying delivery''s failures included; tests left out; '
  'through webhook_attempts_health) of attempts_24h, deliveries_24h created in the last 24 hours, '
  'last_delivery_at; health = paused, failing (its last 3 non-test attempts failed) or healthy; null when the caller '
  'cannot see it.';
grant execute on function crm.webhook_subscription_json(p_workspace_id uuid, p_id uuid) to crm_api;

create or replace function crm.webhook_event_matches(patterns text[], event text)
 returns boolean
 language sql
 immutable parallel safe
as $function$
  select '*' = any (patterns) or event = any (patterns) or split_part(event, '.', 1) || '.*' = any (patterns)
$function$;
comment on function crm.webhook_event_matches(patterns text[], event text) is
  'Whether an event name matches any of a subscription''s patterns.';
grant execute on function crm.webhook_event_matches(patterns text[], event text) to crm_api;

create or replace function crm.pause_webhook_subscription(p_subscription_id uuid)
 returns void
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  perform crm.require_webhook_access();
  update crm.webhook_subscriptions s set status = 'paused', paused_reason = 'manual', paused_at = now()
   where s.workspace_id = crm.current_workspace_id() and s.id = p_subscription_id and s.status = 'active';
  if not found and not exists (select 1 from crm.webhook_subscriptions s where s.workspace_id = crm.current_workspace_id() and s.id = p_subscription_id) then
    raise exception 'no such webhook subscription' using errcode = 'CR404', hint = 'not_found';
  end if;
end
$function$;
comment on function crm.pause_webhook_subscription(p_subscription_id uuid) is
  'Pauses a subscription (manual): new events and due retries become held.';
grant execute on function crm.pause_webhook_subscription(p_subscription_id uuid) to crm_api;

create or replace function crm.resume_webhook_subscription(p_subscription_id uuid)
 returns integer
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.resume_webhook_subscription(p_subscription_id uuid) is
  'Resumes a subscription and releases its held deliveries in their original order; returns how many.';
grant execute on function crm.resume_webhook_subscription(p_subscription_id uuid) to crm_api;

create or replace function crm.continue_webhook_release(p_workspace_id uuid, p_subscription_id uuid)
 returns boolean
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.continue_webhook_release(p_workspace_id uuid, p_subscription_id uuid) is
  'Adds the job of the next delivery a resume released (event order); false when the release is done.';
grant execute on function crm.continue_webhook_release(p_workspace_id uuid, p_subscription_id uuid) to crm_worker;

create or replace function crm.rotate_webhook_secret(
  p_subscription_id uuid,
  p_secret_encrypted bytea,
  p_secret_last4 text,
  p_grace_period_seconds integer
)
 returns timestamp with time zone
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.rotate_webhook_secret(
  p_subscription_id uuid,
  p_secret_encrypted bytea,
  p_secret_last4 text,
  p_grace_period_seconds integer
) is
  'Replaces the secret; the old one keeps signing (second v1) for the grace period, none when it is 0.';
grant execute
  on function crm.rotate_webhook_secret(
    p_subscription_id uuid,
    p_secret_encrypted bytea,
    p_secret_last4 text,
    p_grace_period_seconds integer
  )
  to crm_api;

create or replace function crm.tg_webhook_deliveries__keep_identity()
 returns trigger
 language plpgsql
as $function$
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
$function$;
comment on function crm.tg_webhook_deliveries__keep_identity() is
  'delivery_id (and what it delivers) never changes; receivers deduplicate on it.';
grant execute on function crm.tg_webhook_deliveries__keep_identity() to crm_api;

create or replace function crm.webhook_delivery_id(p_event_id uuid, p_subscription_id uuid)
 returns uuid
 language sql
 immutable parallel safe
as $function$
  select encode(set_bit(set_bit(set_bit(set_bit(set_bit(set_bit(
           substring(uuid_send(p_event_id) from 1 for 6) || substring(sha256(uuid_send(p_event_id) || uuid_send(p_subscription_id)) from 1 for 10),
           52, 1), 53, 1), 54, 1), 55, 0), 70, 0), 71, 1), 'hex')::uuid
$function$;
comment on function crm.webhook_delivery_id(p_event_id uuid, p_subscription_id uuid) is
  'The delivery_id of an event for a subscription, the same every time it is computed: a first attempt re-sent after '
  'a crash carries the id the receiver already saw.';
grant execute on function crm.webhook_delivery_id(p_event_id uuid, p_subscription_id uuid) to crm_api;

create or replace function crm.event_body_start(p_event_id uuid, p_event text, p_occurred_at timestamp with time zone)
 returns text
 language sql
 stable parallel safe
as $function$
  select '{"id":"' || p_event_id || '","event":"' || p_event
         || '","occurred_at":"' || to_char(p_occurred_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') || '"'
$function$;
comment on function crm.event_body_start(p_event_id uuid, p_event text, p_occurred_at timestamp with time zone) is
  'An event''s envelope up to occurred_at: the start of a webhook body and of an events feed entry.';
grant execute on function crm.event_body_start(p_event_id uuid, p_event text, p_occurred_at timestamp with time zone)
  to crm_api;

create or replace function crm.event_body_rest(p_workspace_id uuid, p_workspace_slug text, p_data jsonb, p_actor jsonb)
 returns text
 language sql
 stable parallel safe
as $function$
  select '"workspace":{"id":"' || p_workspace_id || '","slug":' || to_json(p_workspace_slug)::text
         || '},"data":' || p_data::text || ',"actor":' || p_actor::text || '}'
$function$;
comment on function crm.event_body_rest(p_workspace_id uuid, p_workspace_slug text, p_data jsonb, p_actor jsonb) is
  'An event''s envelope from workspace to its end: the end of a webhook body and of an events feed entry.';
grant execute on function crm.event_body_rest(p_workspace_id uuid, p_workspace_slug text, p_data jsonb, p_actor jsonb)
  to crm_api;

create or replace function crm.event_feed_entry(e crm.events, p_workspace_slug text)
 returns text
 language sql
 stable parallel safe
as $function$
  select crm.event_body_start(e.id, e.event, e.occurred_at) || ','
         || crm.event_body_rest(e.workspace_id, p_workspace_slug, e.data, e.actor)
$function$;
comment on function crm.event_feed_entry(e crm.events, p_workspace_slug text) is
  'An event as the events feed answers it (docs/api.md section 8a): the webhook body without delivery_id and '
  'delivered_at, built by the functions that build that body.';
grant execute on function crm.event_feed_entry(e crm.events, p_workspace_slug text) to crm_api;

create or replace function crm.webhook_body_head(p_event_id uuid, p_event text, p_occurred_at timestamp with time zone)
 returns text
 language sql
 stable parallel safe
as $function$
  select crm.event_body_start(p_event_id, p_event, p_occurred_at) || ',"delivered_at":"'
$function$;
comment on function crm.webhook_body_head(p_event_id uuid, p_event text, p_occurred_at timestamp with time zone) is
  'A delivery body up to the value of delivered_at, which each attempt writes.';
grant execute on function crm.webhook_body_head(p_event_id uuid, p_event text, p_occurred_at timestamp with time zone)
  to crm_api;

create or replace function crm.webhook_body_tail(
  p_delivery_id uuid,
  p_workspace_id uuid,
  p_workspace_slug text,
  p_data jsonb,
  p_actor jsonb
)
 returns text
 language sql
 stable parallel safe
as $function$
  select '","delivery_id":"' || p_delivery_id || '",' || crm.event_body_rest(p_workspace_id, p_workspace_slug, p_data, p_actor)
$function$;
comment on function crm.webhook_body_tail(
  p_delivery_id uuid,
  p_workspace_id uuid,
  p_workspace_slug text,
  p_data jsonb,
  p_actor jsonb
) is
  'A delivery body after the value of delivered_at.';
grant execute
  on function crm.webhook_body_tail(
    p_delivery_id uuid,
    p_workspace_id uuid,
    p_workspace_slug text,
    p_data jsonb,
    p_actor jsonb
  )
  to crm_api;

create or replace function crm.webhook_test_body_tail(
  p_delivery_id uuid,
  p_workspace_id uuid,
  p_workspace_slug text,
  p_data jsonb,
  p_actor jsonb
)
 returns text
 language sql
 stable parallel safe
as $function$
  select left(crm.webhook_body_tail(p_delivery_id, p_workspace_id, p_workspace_slug, p_data, p_actor), -1) || ',"test":true}'
$function$;
comment on function crm.webhook_test_body_tail(
  p_delivery_id uuid,
  p_workspace_id uuid,
  p_workspace_slug text,
  p_data jsonb,
  p_actor jsonb
) is
  'crm.webhook_body_tail of a test event: the same keys, then "test": true.';
grant execute
  on function crm.webhook_test_body_tail(
    p_delivery_id uuid,
    p_workspace_id uuid,
    p_workspace_slug text,
    p_data jsonb,
    p_actor jsonb
  )
  to crm_api;

create or replace function crm.webhook_delivery_body(p_subscription_id uuid, p_delivery_id uuid)
 returns table(body_head text, body_tail text)
 language plpgsql
 stable security definer
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
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
$function$;
comment on function crm.webhook_delivery_body(p_subscription_id uuid, p_delivery_id uuid) is
  'The body of a delivery around delivered_at (head, tail), as the worker sends it; no row for an unknown delivery. '
  'Admins of the workspace with the plan only.';
grant execute on function crm.webhook_delivery_body(p_subscription_id uuid, p_delivery_id uuid) to crm_api;

create or replace function crm.webhook_delivery_batch_size()
 returns integer
 language sql
 immutable parallel safe
as $function$ select 100 $function$;
comment on function crm.webhook_delivery_batch_size() is 'The most deliveries one deliver_webhook job carries.';
grant execute on function crm.webhook_delivery_batch_size() to crm_api;

create or replace function crm.add_webhook_delivery_jobs(
  p_deliveries crm.webhook_deliveries[],
  p_run_at timestamp with time zone,
  p_ordered boolean default false
)
 returns void
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.add_webhook_delivery_jobs(
  p_deliveries crm.webhook_deliveries[],
  p_run_at timestamp with time zone,
  p_ordered boolean
) is
  'deliver_webhook jobs for some deliveries, batched per subscription and due time, payload {w, s, d: [ids], g: '
  '[generations], o}: workspace, subscription, deliveries with their generations, and whether they must keep their '
  'place (resume).';

create or replace function crm.webhook_first_attempts_to_send(p_event_ids uuid[], p_rerun boolean default false)
 returns table(
   workspace_id uuid,
   subscription_id uuid,
   delivery_id uuid,
   event_id uuid,
   event text,
   body_head text,
   body_tail text,
   url text,
   secret_encrypted bytea,
   previous_secret_encrypted bytea
 )
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
 set enable_hashjoin to 'off'
 set enable_mergejoin to 'off'
 set enable_bitmapscan to 'off'
 set enable_seqscan to 'off'
 set plan_cache_mode to 'force_generic_plan'
as $function$
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
$function$;
comment on function crm.webhook_first_attempts_to_send(p_event_ids uuid[], p_rerun boolean) is
  'fan_out_event''s read: the first attempts to make for some events (delivery id, body, endpoint, secrets), by '
  'subscription; creates the held deliveries of paused subscriptions.';
grant execute on function crm.webhook_first_attempts_to_send(p_event_ids uuid[], p_rerun boolean) to crm_worker;

create or replace function crm.webhook_deliveries_to_send(
  p_workspace_id uuid,
  p_subscription_id uuid,
  p_delivery_ids uuid[],
  p_generations integer[]
)
 returns table(
   delivery_id uuid,
   generation integer,
   event_id uuid,
   event text,
   body_head text,
   body_tail text,
   url text,
   secret_encrypted bytea,
   previous_secret_encrypted bytea
 )
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
 set enable_hashjoin to 'off'
 set enable_mergejoin to 'off'
 set enable_bitmapscan to 'off'
 set enable_seqscan to 'off'
as $function$
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
$function$;
comment on function crm.webhook_deliveries_to_send(
  p_workspace_id uuid,
  p_subscription_id uuid,
  p_delivery_ids uuid[],
  p_generations integer[]
) is
  'deliver_webhook''s read for a batch: the body around delivered_at, the endpoint and its secrets per delivery still '
  'due; none for stale or final ones; holds them when paused (test deliveries excepted) or the plan lapsed.';
grant execute
  on function crm.webhook_deliveries_to_send(
    p_workspace_id uuid,
    p_subscription_id uuid,
    p_delivery_ids uuid[],
    p_generations integer[]
  )
  to crm_worker;

create or replace function crm.redeliver_webhook(p_subscription_id uuid, p_delivery_id uuid)
 returns void
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_status text;
  v_next_attempt_at timestamptz;
  v_delivery crm.webhook_deliveries;
begin
  perform crm.require_webhook_access();
  -- The row lock orders concurrent calls: the second sees what the first made of the delivery.
  select d.status, d.next_attempt_at into v_status, v_next_attempt_at from crm.webhook_deliveries d
   where d.workspace_id = v_workspace and d.subscription_id = p_subscription_id and d.id = p_delivery_id
     for update;
  if not found then
    raise exception 'no such delivery' using errcode = 'CR404', hint = 'not_found';
  end if;
  -- A retrying delivery is attempted now, in its cycle (docs/api.md section 7). One already due (its
  -- job may be running, or it waits its turn in a resume's release) is being attempted: left as it
  -- is, so no second attempt runs beside it. Clock time, not the transaction's: a job becomes due by
  -- the clock.
  if v_status = 'retrying' and v_next_attempt_at <= clock_timestamp() then
    return;
  end if;
  -- Otherwise only a finished delivery starts a fresh cycle: one pending or held has its attempt on
  -- the way or kept, and a reset would give it 7 more every time (retries for ever).
  if v_status not in ('dead', 'delivered', 'retrying') then
    raise exception 'only a dead, delivered or retrying delivery can be sent again; this one is %', v_status
      using errcode = 'CR409', hint = 'delivery_not_finished';
  end if;
  -- Pending until the attempt is recorded: a second call meanwhile is refused (409), and the job the
  -- retry was scheduled with is stale (its generation has passed) and sends nothing. A retry now
  -- keeps its cycle, so the schedule after it goes on as after any failed attempt.
  update crm.webhook_deliveries d
     set status = case when s.status = 'active' or d.is_test then 'pending' else 'held' end,
         cycle_attempts = case when v_status = 'retrying' then d.cycle_attempts else 0 end,
         generation = d.generation + 1, completed_at = null, in_release = false,
         next_attempt_at = case when s.status = 'active' or d.is_test then now() end
    from crm.webhook_subscriptions s
   where d.workspace_id = v_workspace and d.subscription_id = p_subscription_id and d.id = p_delivery_id
     and s.workspace_id = d.workspace_id and s.id = d.subscription_id
  returning d.* into v_delivery;
  if v_delivery.status = 'pending' then
    perform crm.add_webhook_delivery_jobs(array[v_delivery], now());
  end if;
end
$function$;
comment on function crm.redeliver_webhook(p_subscription_id uuid, p_delivery_id uuid) is
  'A fresh cycle of 7 attempts for a dead or delivered delivery, same delivery_id, the first at once (held when the '
  'subscription is paused); a retrying one attempted now in its cycle (left alone when already due); pending or held '
  'is CR409 delivery_not_finished.';
grant execute on function crm.redeliver_webhook(p_subscription_id uuid, p_delivery_id uuid) to crm_api;

create or replace function crm.prune_webhook_deliveries(log_retention_days integer)
 returns bigint
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.prune_webhook_deliveries(log_retention_days integer) is
  'Removes delivered and dead deliveries (their attempts cascade) older than the log retention, subscription by '
  'subscription through webhook_deliveries_completed; held and pending ones stay (nothing is dropped).';

create or replace function crm.tg_webhook_attempts__append_only()
 returns trigger
 language plpgsql
as $function$
begin
  raise exception 'webhook attempts are append-only' using errcode = 'CR422', hint = 'validation_failed';
end
$function$;
comment on function crm.tg_webhook_attempts__append_only() is
  'An attempt is a fact: never changed (rows leave only with their delivery).';
grant execute on function crm.tg_webhook_attempts__append_only() to crm_api;

create or replace function crm.webhook_retry_delays()
 returns interval[]
 language sql
 immutable parallel safe
as $function$ select '{30 seconds, 2 minutes, 10 minutes, 1 hour, 6 hours, 24 hours}'::interval[] $function$;
comment on function crm.webhook_retry_delays() is
  'The delays before attempts 2, 3, ... of a cycle (docs/api.md section 8); a cycle has one attempt more than there '
  'are delays. Tests pass a shorter schedule (WEBHOOK_RETRY_SCHEDULE) to crm.record_webhook_attempts.';
grant execute on function crm.webhook_retry_delays() to crm_api;

create or replace function crm.webhook_attempt_next_state(
  p_started_at timestamp with time zone,
  p_error text,
  p_cycle_attempts integer,
  p_subscription_status text,
  p_retry_delays interval[]
)
 returns table(status text, cycle_attempts integer, next_attempt_at timestamp with time zone)
 language sql
 stable
as $function$
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
$function$;
comment on function crm.webhook_attempt_next_state(
  p_started_at timestamp with time zone,
  p_error text,
  p_cycle_attempts integer,
  p_subscription_status text,
  p_retry_delays interval[]
) is
  'A delivery''s state after an attempt (null started_at: not attempted, pending): delivered; dead after the last '
  'attempt of a cycle; held while paused; retrying, due after the next delay of the schedule.';
grant execute
  on function crm.webhook_attempt_next_state(
    p_started_at timestamp with time zone,
    p_error text,
    p_cycle_attempts integer,
    p_subscription_status text,
    p_retry_delays interval[]
  )
  to crm_api;

create or replace function crm.record_webhook_attempts(
  p_workspace_id uuid,
  p_subscription_id uuid,
  p_results crm.webhook_attempt_result[],
  p_retry_delays interval[] default NULL::interval[]
)
 returns jsonb
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
 set enable_hashjoin to 'off'
 set enable_mergejoin to 'off'
 set enable_bitmapscan to 'off'
 set enable_seqscan to 'off'
 set plan_cache_mode to 'force_generic_plan'
as $function$
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
      insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, response_status, error, response_body_excerpt, signature,
                                        subscription_id, is_test, request_headers)
      select p_workspace_id, c.id, 1, r.started_at, r.duration_ms, r.response_status, r.error, r.response_body_excerpt, r.signature,
             c.subscription_id, c.is_test, r.request_headers
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
      select row(d.id, r.event_id, 0, r.started_at, r.duration_ms, r.response_status, r.error, r.response_body_excerpt, r.signature,
                 r.request_headers)::crm.webhook_attempt_result
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
      select r.*, d.row_ctid, d.attempt_count, d.subscription_id, d.is_test,
             case when d.generation <> r.generation or d.status not in ('pending', 'retrying') then 'stale' else n.status end as outcome,
             n.cycle_attempts, n.next_attempt_at
        from (select u.* from unnest(v_later) u order by u.delivery_id) r
       cross join lateral (
         select d.ctid as row_ctid, d.generation, d.status, d.attempt_count, d.cycle_attempts, d.subscription_id, d.is_test
           from crm.webhook_deliveries d
          where d.workspace_id = p_workspace_id and d.id = r.delivery_id
            for update) d
       -- A test delivery is never held: it goes on as if its subscription were active.
       cross join lateral crm.webhook_attempt_next_state(r.started_at, r.error, d.cycle_attempts,
                                                         case when d.is_test then 'active' else v_subscription_status end, v_retry_delays) n
    ), logged as (
      insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, response_status, error, response_body_excerpt, signature,
                                        subscription_id, is_test, request_headers)
      select p_workspace_id, a.delivery_id, a.attempt_count + 1, a.started_at, a.duration_ms, a.response_status, a.error, a.response_body_excerpt, a.signature,
             a.subscription_id, a.is_test, a.request_headers
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

  -- Auto-pause (docs/api.md section 8), test deliveries left out; the subscription row is locked since
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
$function$;
comment on function crm.record_webhook_attempts(
  p_workspace_id uuid,
  p_subscription_id uuid,
  p_results crm.webhook_attempt_result[],
  p_retry_delays interval[]
) is
  'Logs a batch of first or later attempts of one subscription and moves each delivery on (created by its first '
  'attempt): delivered; retrying or pending (jobs added); held (paused); dead after the last attempt of a cycle, with '
  'the auto-pause rule in the same transaction.';
grant execute
  on function crm.record_webhook_attempts(
    p_workspace_id uuid,
    p_subscription_id uuid,
    p_results crm.webhook_attempt_result[],
    p_retry_delays interval[]
  )
  to crm_worker;

create or replace function crm.claim_webhook_operation(
  p_workspace_id uuid,
  p_subscription_id uuid,
  p_operation text,
  p_allowance integer,
  p_window interval
)
 returns void
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_window_ends_at timestamptz;
begin
  insert into crm.webhook_operation_counts as c (workspace_id, subscription_id, operation, window_ends_at, count)
  values (p_workspace_id, p_subscription_id, p_operation, now() + p_window, 1)
  on conflict (workspace_id, subscription_id, operation) do update
    set count = case when c.window_ends_at <= now() then 1 else c.count + 1 end,
        window_ends_at = case when c.window_ends_at <= now() then now() + p_window else c.window_ends_at end
    where c.window_ends_at <= now() or c.count < p_allowance
  returning c.window_ends_at into v_window_ends_at;
  if v_window_ends_at is null then
    -- Refused: the row is locked by the statement above and read again with a fresh snapshot.
    select c.window_ends_at into v_window_ends_at from crm.webhook_operation_counts c
     where c.workspace_id = p_workspace_id and c.subscription_id = p_subscription_id and c.operation = p_operation;
    raise exception 'a subscription may have % % every %; retry later', p_allowance,
      case p_operation when 'test' then 'test events' else 'recoveries' end, p_window
      using errcode = 'CR429', hint = 'rate_limited',
            detail = greatest(1, ceil(extract(epoch from v_window_ends_at - now())))::integer::text;
  end if;
end
$function$;
comment on function crm.claim_webhook_operation(
  p_workspace_id uuid,
  p_subscription_id uuid,
  p_operation text,
  p_allowance integer,
  p_window interval
) is
  'Counts one test event or recovery of a subscription in its fixed window, or raises CR429 rate_limited with the '
  'seconds until the window ends as detail (called by the SECURITY DEFINER functions of those operations).';

create or replace function crm.webhook_sample_event_data(p_workspace_id uuid, p_event text)
 returns jsonb
 language plpgsql
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
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
$function$;
comment on function crm.webhook_sample_event_data(p_workspace_id uuid, p_event text) is
  'The data of a sample event ({object, previous_attributes?}) as the outbox triggers would write it, for a realistic '
  'record that exists nowhere; 422 for an unknown event name.';
grant execute on function crm.webhook_sample_event_data(p_workspace_id uuid, p_event text) to crm_api;

create or replace function crm.webhook_sample_bodies()
 returns table(event text, body_head text, body_tail text)
 language plpgsql
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
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
$function$;
comment on function crm.webhook_sample_bodies() is
  'A sample body of each of the 9 events around delivered_at (head, tail), built by the functions that build real '
  'ones; admins only.';
grant execute on function crm.webhook_sample_bodies() to crm_api;

create or replace function crm.send_webhook_test_event(p_subscription_id uuid, p_event text)
 returns uuid
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
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
  -- A test goes out at once even while paused: 20 a minute per subscription, so the endpoint
  -- cannot be used to make the sender flood an address.
  perform crm.claim_webhook_operation(v_workspace, p_subscription_id, 'test', 20, interval '1 minute');
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
$function$;
comment on function crm.send_webhook_test_event(p_subscription_id uuid, p_event text) is
  'A test delivery of a sample event to a subscription (docs/api.md section 7: POST .../test), sent at once even '
  'while paused; at most 20 a minute per subscription (CR429); returns its delivery id.';
grant execute on function crm.send_webhook_test_event(p_subscription_id uuid, p_event text) to crm_api;

create or replace function crm.check_webhook_recovery_window(
  p_since timestamp with time zone,
  p_until timestamp with time zone
)
 returns void
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
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
$function$;
comment on function crm.check_webhook_recovery_window(
  p_since timestamp with time zone,
  p_until timestamp with time zone
) is
  'Raises CR422 unless since is set and at most 30 days back and until (when set) is later than since.';
grant execute
  on function crm.check_webhook_recovery_window(p_since timestamp with time zone, p_until timestamp with time zone)
  to crm_api;

create or replace function crm.webhook_recovery_count(
  p_subscription_id uuid,
  p_since timestamp with time zone,
  p_until timestamp with time zone default NULL::timestamp with time zone
)
 returns integer
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
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
$function$;
comment on function crm.webhook_recovery_count(
  p_subscription_id uuid,
  p_since timestamp with time zone,
  p_until timestamp with time zone
) is
  'The number of dead deliveries crm.recover_webhook_deliveries would send again for this window (runs as the caller, '
  'under row-level security).';
grant execute
  on function crm.webhook_recovery_count(
    p_subscription_id uuid,
    p_since timestamp with time zone,
    p_until timestamp with time zone
  )
  to crm_api;

create or replace function crm.recover_webhook_deliveries(
  p_subscription_id uuid,
  p_since timestamp with time zone,
  p_until timestamp with time zone default NULL::timestamp with time zone
)
 returns integer
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
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
  -- Each recovery may start thousands of cycles again: 10 an hour per subscription.
  perform crm.claim_webhook_operation(v_workspace, p_subscription_id, 'recover', 10, interval '1 hour');
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
$function$;
comment on function crm.recover_webhook_deliveries(
  p_subscription_id uuid,
  p_since timestamp with time zone,
  p_until timestamp with time zone
) is
  'docs/api.md section 7, POST .../recover: a fresh cycle for every dead delivery created in [since, until) (until '
  'defaults to now), sent oldest first (held while paused); at most 10 an hour per subscription (CR429); returns how '
  'many.';
grant execute
  on function crm.recover_webhook_deliveries(
    p_subscription_id uuid,
    p_since timestamp with time zone,
    p_until timestamp with time zone
  )
  to crm_api;

comment on table crm.events is
  'The outbox: one row per record change, written by triggers in the writing transaction (docs/api.md section 8). '
  'data = {object, previous_attributes?, associations_changed?}; actor = {type, id, via}.';
comment on column crm.events.data is
  'object: the record after the change (before it for .deleted) as the API shows it; previous_attributes: old value '
  'of each changed field; associations_changed: {contacts: {added, removed}, ...}.';
create policy events_all_owner on crm.events as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy events_all_owner on crm.events is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create or replace function crm.tg_events__notify_feed()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  perform pg_notify('crm_events', w.workspace_id::text) from (select distinct n.workspace_id from new_rows n) w;
  return null;
end
$function$;
comment on function crm.tg_events__notify_feed() is
  'Wakes the events feed''s long polls: one notification per workspace a statement wrote events for, delivered at '
  'commit (PostgreSQL folds repeats within a transaction), on the channel crm_events that each API process listens to.';
grant execute on function crm.tg_events__notify_feed() to crm_api;
CREATE TRIGGER tg_events__notify_feed AFTER INSERT ON crm.events
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_events__notify_feed();

-- An event's workspace exists: the foreign key's guarantee, checked once per statement (migration 000015).
create or replace function crm.tg_events__workspace_exists()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_ids uuid[];
begin
  select array_agg(distinct n.workspace_id) into v_ids from new_rows n;
  -- Locked as a foreign key's check locks its referenced row: a workspace being deleted meanwhile is
  -- waited for and then not found, and one not yet deleted cannot be until this transaction ends.
  if cardinality(v_ids) > (select count(*) from (select from crm.workspaces w where w.id = any (v_ids) for key share of w) as l) then
    raise exception 'an event''s workspace must exist'
      using errcode = 'foreign_key_violation', detail = 'workspaces: ' || array_to_string(v_ids, ', ');
  end if;
  return null;
end
$function$;
comment on function crm.tg_events__workspace_exists() is
  'Statement trigger of crm.events: refuses the statement (23503) when a row it inserted or updated names a workspace '
  'that does not exist, locking the workspaces it names FOR KEY SHARE, as a foreign key would, once per statement '
  'rather than once per row.';
grant execute on function crm.tg_events__workspace_exists() to crm_api;
CREATE TRIGGER tg_events__workspace_exists_insert AFTER INSERT ON crm.events
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_events__workspace_exists();
CREATE TRIGGER tg_events__workspace_exists_update AFTER UPDATE ON crm.events
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_events__workspace_exists();

create or replace function crm.tg_workspaces__delete_events()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  delete from crm.events e using old_rows o where e.workspace_id = o.id;
  return null;
end
$function$;
comment on function crm.tg_workspaces__delete_events() is
  'Deletes the events of the workspaces a statement deleted (the cascade the foreign key of crm.events gave), the '
  '*.deleted events tg_workspaces__delete_records had their records write included.';
CREATE TRIGGER tg_workspaces__delete_events AFTER DELETE ON crm.workspaces
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_workspaces__delete_events();
create policy events_select_viewable on crm.events as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (CASE record_type
            WHEN 'contact'::text THEN
              ((( SELECT crm.grant_scope('contacts'::text, 'view'::text) AS grant_scope) = 'all'::text)
               OR (((data -> 'object'::text) ->> 'owner_id'::text))::uuid = ANY (
                    ( SELECT crm.scope_owner_ids('contacts'::text, 'view'::text) AS scope_owner_ids)::uuid[]))
            WHEN 'company'::text THEN
              ((( SELECT crm.grant_scope('companies'::text, 'view'::text) AS grant_scope) = 'all'::text)
               OR (((data -> 'object'::text) ->> 'owner_id'::text))::uuid = ANY (
                    ( SELECT crm.scope_owner_ids('companies'::text, 'view'::text) AS scope_owner_ids)::uuid[]))
            WHEN 'deal'::text THEN
              ((( SELECT crm.grant_scope('deals'::text, 'view'::text) AS grant_scope) = 'all'::text)
               OR (((data -> 'object'::text) ->> 'owner_id'::text))::uuid = ANY (
                    ( SELECT crm.scope_owner_ids('deals'::text, 'view'::text) AS scope_owner_ids)::uuid[]))
            ELSE false
          END))
  );
comment on policy events_select_viewable on crm.events is
  'The events feed (docs/api.md section 8a): a caller reads the events of its workspace whose record it may view '
  'with its role and token scopes, as the record stood in the event (its owner then): all, or the owners the own/team '
  'scope covers; a token whose scopes do not cover the type reads none.';
grant select on crm.events to crm_api;
comment on column crm.events.xid is
  'The writing transaction (pg_current_xact_id()); the events feed orders by (xid, id) and reads only below the '
  'oldest running transaction, so nothing appears behind a cursor (docs/decisions.md). 0 for events written before '
  'the column.';
comment on index crm.events_feed is 'The events feed: a workspace''s events after a cursor, in (xid, id) order.';
comment on index crm.events_occurred_at is
  'The events feed''s retention window: a page from the start of the window (no cursor) in a workspace whose events '
  'are mostly older than EVENTS_RETENTION_DAYS is found through it (0.05 ms, against 460 ms of scanning without it '
  'at 1,000,000 old events). Events are never removed.';
comment on index crm.events_record is 'A record''s history (crm.record_history reads it newest first).';
comment on index crm.webhook_events_id is
  'fan_out_event looks events up by id alone (the outbox job carries only ids).';

-- Record history (docs/api.md section 5b): the outbox read as each record's changes. Who may read a
-- record's history is decided in crm.may_read_record_history, run as the caller: the record's own
-- table is asked whether the caller may view the record now (its row-level security decides), and
-- an admin whose token covers viewing the type also reads the history of records deleted since.
-- The view reads crm.events with its owner's rights and keeps only the rows that function allows,
-- so the events feed's policy (events_select_viewable, by the owner in the event) neither widens
-- nor narrows a history.
create or replace function crm.may_read_record_history(p_record_type text, p_workspace_id uuid, p_record_id uuid)
 returns boolean
 language plpgsql
 stable
 cost 5000
as $function$
begin
  if p_workspace_id is distinct from crm.current_workspace_id() then
    return false;
  end if;
  -- From the request context alone (an expression PL/pgSQL evaluates without running a query).
  if crm.is_admin()
     and crm.grant_scope(case p_record_type when 'contact' then 'contacts' when 'company' then 'companies'
                                            when 'deal' then 'deals' end, 'view') = 'all' then
    return true;
  end if;
  -- Run as the caller: the record table's own policies decide what exists.
  return case p_record_type
    when 'contact' then exists (select from crm.contacts r where r.workspace_id = p_workspace_id and r.id = p_record_id)
    when 'company' then exists (select from crm.companies r where r.workspace_id = p_workspace_id and r.id = p_record_id)
    when 'deal' then exists (select from crm.deals r where r.workspace_id = p_workspace_id and r.id = p_record_id)
    else false
  end;
end
$function$;
comment on function crm.may_read_record_history(p_record_type text, p_workspace_id uuid, p_record_id uuid) is
  'Whether the caller may read the history of a record (docs/api.md section 5b): it may view the record now, under the '
  'record table''s own policies, or it is an admin whose role and token view every record of the type (deleted '
  'ones included). False outside the caller''s workspace and without a request context.';
grant execute on function crm.may_read_record_history(p_record_type text, p_workspace_id uuid, p_record_id uuid)
  to crm_api;
comment on column crm.events.token_id is
  'The token the change was made with (the request context''s, by default), or null: for crm.record_history, never '
  'sent to webhooks.';

comment on column crm.events.changes is
  'The history entry''s changes of a .updated event (crm.event_changes of its name and data), stored by the outbox '
  'triggers as they write it so that crm.record_history reads rather than computes them; null for created and deleted '
  'events and for events written before the column, whose changes the view computes.';

-- A change of a record as its history shows it (docs/api.md section 5b), from an event's name and data:
-- an update's fields are previous_attributes' keys (each from its old value to the object's), a create
-- lists every field set and a delete every field the record had; custom fields by key, and the links
-- of associations_changed. A set-returning SQL function of one SELECT, so that the planner inlines it
-- wherever it is called (a scalar SQL function would run as a call of its own, about 50 µs each) and
-- folds its branches when the event is a constant, as in the outbox triggers.
create or replace function crm.event_changes(p_event text, p_data jsonb)
 returns table (changes jsonb)
 language sql
 immutable parallel safe
as $function$
  SELECT COALESCE(jsonb_object_agg(c.field, c.change), '{}'::jsonb)
  FROM ( SELECT f.key AS field,
                jsonb_build_object('from', f.value, 'to', COALESCE((p_data #> ARRAY['object'::text, f.key]), 'null'::jsonb)) AS change
           FROM jsonb_each((p_data -> 'previous_attributes'::text)) f(key, value)
          WHERE ((p_event ~~ '%.updated'::text)
                 AND (f.key <> ALL (ARRAY['id'::text, 'created_at'::text, 'updated_at'::text, 'created_by'::text, 'updated_by'::text, 'custom_fields'::text]))
                 AND (f.value <> COALESCE((p_data #> ARRAY['object'::text, f.key]), 'null'::jsonb)))
        UNION ALL
         SELECT f.key,
                CASE WHEN (p_event ~~ '%.created'::text) THEN jsonb_build_object('from', NULL::jsonb, 'to', f.value)
                     ELSE jsonb_build_object('from', f.value, 'to', NULL::jsonb) END
           FROM jsonb_each((p_data -> 'object'::text)) f(key, value)
          WHERE ((p_event !~~ '%.updated'::text)
                 AND (f.key <> ALL (ARRAY['id'::text, 'created_at'::text, 'updated_at'::text, 'created_by'::text, 'updated_by'::text, 'custom_fields'::text]))
                 AND (f.value <> 'null'::jsonb))
        UNION ALL
         SELECT ('custom_fields.'::text || k.key),
                jsonb_build_object('from', COALESCE((cf.old -> k.key), 'null'::jsonb), 'to', COALESCE((cf.new -> k.key), 'null'::jsonb))
           FROM ( SELECT CASE WHEN (p_event ~~ '%.created'::text) THEN '{}'::jsonb
                              ELSE COALESCE((p_data #> '{previous_attributes,custom_fields}'::text[]), (p_data #> '{object,custom_fields}'::text[]), '{}'::jsonb)
                         END AS old,
                         CASE WHEN (p_event ~~ '%.deleted'::text) THEN '{}'::jsonb
                              ELSE COALESCE((p_data #> '{object,custom_fields}'::text[]), '{}'::jsonb)
                         END AS new
                  WHERE ((p_event !~~ '%.updated'::text) OR ((p_data -> 'previous_attributes'::text) ? 'custom_fields'::text))
                 OFFSET 0) cf
           CROSS JOIN LATERAL jsonb_object_keys((cf.old || cf.new)) k(key)
          WHERE (COALESCE((cf.old -> k.key), 'null'::jsonb) <> COALESCE((cf.new -> k.key), 'null'::jsonb))
        UNION ALL
         SELECT ('associations.'::text || a.key), a.value
           FROM jsonb_each((p_data -> 'associations_changed'::text)) a(key, value)) c
$function$;
comment on function crm.event_changes(p_event text, p_data jsonb) is
  'The changes of an event as crm.record_history shows them: {field: {from, to}}, custom_fields.<key> per custom '
  'field, associations.<type>: {added, removed}. The outbox triggers store an update''s in crm.events.changes.';
grant execute on function crm.event_changes(p_event text, p_data jsonb) to crm_api;

-- Who may read is asked in a LATERAL subquery of its own (OFFSET 0 keeps it one) so that the planner
-- may put a Memoize node over it, keyed by the record: then the events of one record ask once, not
-- once each (docs/performance.md, Record history); without one, each event asks, as before.
-- An event's changes are read from crm.events.changes, which the outbox triggers fill for an update;
-- only the rest (a create, a delete, an association change, an event older than the column) computes
-- them, by the same function.
create view crm.record_history as
 SELECT e.workspace_id,
    e.record_type,
    e.record_id,
    e.id,
    e.occurred_at,
    split_part(e.event, '.'::text, 2) AS action,
    (jsonb_build_object('user_id', e.actor -> 'id'::text,
                        'name', to_jsonb(u.name),
                        'via', e.actor -> 'via'::text)
     || jsonb_strip_nulls(jsonb_build_object('token_id', e.token_id, 'app_id', e.actor -> 'app_id'::text))) AS actor,
    COALESCE(e.changes, ( SELECT c.changes
           FROM crm.event_changes(e.event, e.data) c(changes))) AS changes
   FROM ((crm.events e
     -- A join, not a subquery, for the actor's name: with more than one relation in FROM,
     -- PostgreSQL 15 and 18 print the view alike (with one, 18 leaves the columns unqualified), so
     -- sql/schema.sql holds for both.
     LEFT JOIN crm.users u ON ((u.id = ((e.actor ->> 'id'::text))::uuid)))
     CROSS JOIN LATERAL ( SELECT crm.may_read_record_history(e.record_type, e.workspace_id, e.record_id) AS allowed
            OFFSET 0) m)
  WHERE ((e.workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id)) AND m.allowed);
comment on view crm.record_history is
  'Every change of every record, from the outbox (docs/api.md section 5b): action created, updated or deleted; actor '
  '{user_id, name, via, token_id?, app_id?} (the user''s current name); changes {field: {from, '
  'to}} with custom_fields.<key> per key and associations.<type>: {added, removed}; created lists the fields set, '
  'deleted the fields the record had. Rows of the caller''s workspace that crm.may_read_record_history allows: '
  'crm.act_as shows what each user sees; without a request context, none.';
grant select on crm.record_history to crm_api;

comment on table crm.webhook_subscriptions is
  'Webhook endpoints of a workspace (docs/api.md section 7). Admins only; the secret is AES-256-GCM encrypted by the '
  'service (APP_SECRET via HKDF).';
comment on column crm.webhook_subscriptions.secret_encrypted is
  'iv | tag | ciphertext of the whsec_ secret, additional data = workspace id; never readable by crm_api.';
comment on column crm.webhook_subscriptions.previous_secret_encrypted is
  'The secret before the last rotation; signs too until previous_secret_expires_at.';
create policy webhook_subscriptions_all_admin on crm.webhook_subscriptions as permissive for all to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('webhooks:manage'::text) AS is_admin_for))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('webhooks:manage'::text) AS is_admin_for))
  );
comment on policy webhook_subscriptions_all_admin on crm.webhook_subscriptions is
  'Admins of the current workspace see and manage its subscriptions (a scoped token needs webhooks:manage); everyone '
  'else sees none.';
create policy webhook_subscriptions_all_owner on crm.webhook_subscriptions as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy webhook_subscriptions_all_owner on crm.webhook_subscriptions is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
grant delete on crm.webhook_subscriptions to crm_api;
grant select (workspace_id, id, name, url, events, status, paused_reason, paused_at, secret_last4, previous_secret_expires_at, created_at, updated_at, created_by)
  on crm.webhook_subscriptions
  to crm_api;
grant insert (name, url, events, secret_encrypted, secret_last4) on crm.webhook_subscriptions to crm_api;
grant update (name, url, events, status, paused_reason, paused_at, secret_encrypted, secret_last4, previous_secret_encrypted, previous_secret_expires_at)
  on crm.webhook_subscriptions
  to crm_api;
CREATE TRIGGER tg_webhook_subscriptions__check_limits BEFORE INSERT ON crm.webhook_subscriptions
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_webhook_subscriptions__check_limits();
CREATE TRIGGER tg_webhook_subscriptions__touch_updated_at BEFORE UPDATE ON crm.webhook_subscriptions
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg__touch_updated_at();

comment on table crm.webhook_deliveries is
  'One event for one subscription (docs/api.md section 7). status: pending (first attempt due), retrying, delivered, '
  'dead (every attempt of a cycle failed), held (paused subscription or lapsed plan).';
comment on column crm.webhook_deliveries.cycle_attempts is
  'Attempts in the current cycle (one more than crm.webhook_retry_delays() has delays); redeliver starts a new cycle, '
  'resume keeps it (the attempts left).';
comment on column crm.webhook_deliveries.generation is
  'Bumped whenever a deliver_webhook job is added; a job whose generation differs is stale and ends quietly.';
comment on column crm.webhook_deliveries.in_release is
  'Released by resume and not yet attempted: these go out one after the other in event order '
  '(crm.continue_webhook_release).';
comment on column crm.webhook_deliveries.is_test is
  'A test event (POST .../test): sent even while the subscription is paused; never counted in the stats or the '
  'auto-pause rule, never recovered.';
comment on column crm.webhook_deliveries.test_event is
  'The event of a test delivery, {data: {object, previous_attributes?}, actor}, as crm.events would hold it (a test '
  'event is not in the outbox); null for real deliveries.';
create policy webhook_deliveries_all_owner on crm.webhook_deliveries as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy webhook_deliveries_all_owner on crm.webhook_deliveries is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy webhook_deliveries_select_admin on crm.webhook_deliveries as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('webhooks:manage'::text) AS is_admin_for))
  );
comment on policy webhook_deliveries_select_admin on crm.webhook_deliveries is
  'Admins of the workspace read its delivery log (a scoped token needs webhooks:manage); writes go through SECURITY '
  'DEFINER functions only.';
grant select on crm.webhook_deliveries to crm_api;
comment on index crm.webhook_deliveries_completed is
  'Stats, the auto-pause rule (final deliveries of the last 24 hours) and housekeeping (final deliveries past the '
  'retention).';
comment on index crm.webhook_deliveries_held is
  'Resume releases held deliveries in their original order: the order of their events (time-ordered ids written by '
  'the outbox).';
comment on index crm.webhook_deliveries_log is
  'The delivery log, newest first (ids are time-ordered), keyset cursor on id; the cascade on subscription delete.';
comment on index crm.webhook_deliveries_subscription_event is
  'One delivery per subscription and event: a re-run fan-out creates nothing twice.';
CREATE TRIGGER tg_webhook_deliveries__keep_identity BEFORE UPDATE ON crm.webhook_deliveries
  FOR EACH ROW
  WHEN (((new.id <> old.id)
         OR (new.workspace_id <> old.workspace_id)
         OR (new.subscription_id <> old.subscription_id)
         OR (new.event_id <> old.event_id)
         OR (new.event <> old.event)
         OR (new.created_at <> old.created_at)
         OR (new.attempt_count < old.attempt_count)))
  EXECUTE FUNCTION crm.tg_webhook_deliveries__keep_identity();
CREATE TRIGGER tg_webhook_deliveries__touch_updated_at BEFORE UPDATE ON crm.webhook_deliveries
  FOR EACH ROW
  WHEN ((NOT (new.updated_at IS DISTINCT FROM old.updated_at)))
  EXECUTE FUNCTION crm.tg__touch_updated_at();

comment on type crm.webhook_attempt_result is
  'One attempt for crm.record_webhook_attempts: a first attempt (generation null, event_id set) or a later one (the '
  'generation its job carried).';
grant usage on type crm.webhook_attempt_result to public;

comment on table crm.webhook_attempts is
  'Every HTTP attempt of a delivery: status, duration, error class and the first 2 KiB of the answer.';
comment on column crm.webhook_attempts.signature is
  'The X-Service-Signature header the attempt carried (t=...,v1=...[,v1=...]); null when no request was sent (the '
  'address was refused).';
comment on column crm.webhook_attempts.subscription_id is
  'The delivery''s subscription, copied so that a subscription''s recent attempts (success_rate, health) are read '
  'through webhook_attempts_health without its deliveries.';
comment on column crm.webhook_attempts.request_headers is
  'Every header the attempt''s request carried, by lower-case name, secrets left out (src/webhooks/send.ts); null '
  'when no request was sent, and for attempts logged before it was kept.';
comment on column crm.webhook_attempts.is_test is
  'The delivery''s test flag, copied: test attempts never count in the statistics or the health.';
create policy webhook_attempts_all_owner on crm.webhook_attempts as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy webhook_attempts_all_owner on crm.webhook_attempts is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy webhook_attempts_select_admin on crm.webhook_attempts as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('webhooks:manage'::text) AS is_admin_for))
  );
comment on policy webhook_attempts_select_admin on crm.webhook_attempts is
  'Admins of the workspace read the attempts of its deliveries (a scoped token needs webhooks:manage).';
grant select on crm.webhook_attempts to crm_api;
CREATE TRIGGER tg_webhook_attempts__append_only BEFORE UPDATE ON crm.webhook_attempts
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_webhook_attempts__append_only();

-- The delivery log's parents, checked once per statement (migration 000014 dropped the two foreign
-- keys that checked and locked them once per row): a delivery's subscription and an attempt's
-- delivery exist, and deleting a subscription or a delivery deletes what hangs from it.
create or replace function crm.tg_webhook_deliveries__subscription_exists()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_parents bigint;
  v_found bigint;
begin
  select count(*) into v_parents from (select distinct n.workspace_id, n.subscription_id from new_rows n) p;
  if v_parents = 0 then
    return null;
  end if;
  -- Locked as a foreign key locks its parent: a delete under way waits for this transaction, or has
  -- removed the row already, which is then not found.
  -- Probes by primary key, one per parent (lateral: the transition table has no statistics).
  perform 1 from (select distinct n.workspace_id, n.subscription_id from new_rows n order by 1, 2) p
   cross join lateral (select s.id from crm.webhook_subscriptions s
                        where s.workspace_id = p.workspace_id and s.id = p.subscription_id for key share) s;
  get diagnostics v_found = row_count;
  if v_found < v_parents then
    raise exception 'a webhook delivery names a subscription that does not exist'
      using errcode = 'foreign_key_violation', schema = 'crm', table = 'webhook_deliveries',
            constraint = 'webhook_deliveries_subscription_exists';
  end if;
  return null;
end
$function$;
comment on function crm.tg_webhook_deliveries__subscription_exists() is
  'The foreign key of a delivery''s subscription, once per inserting statement: each subscription named is locked FOR '
  'KEY SHARE once (not once per delivery), and a missing one fails the statement with 23503.';
grant execute on function crm.tg_webhook_deliveries__subscription_exists() to crm_api;

create or replace function crm.tg_webhook_attempts__delivery_exists()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_this_transaction xid := pg_current_xact_id()::xid;
  v_parents bigint;
  v_written bigint;
  v_locked bigint := 0;
begin
  select count(*) into v_parents from (select distinct n.workspace_id, n.delivery_id from new_rows n) p;
  if v_parents = 0 then
    return null;
  end if;
  -- A delivery this transaction inserted or moved on (crm.record_webhook_attempts does one or the
  -- other in the statement that logs the attempt) cannot be deleted by another before it commits:
  -- it is found, not locked again.
  -- Probes by primary key, one per parent (lateral: the transition table has no statistics).
  select count(*) into v_written
    from (select distinct n.workspace_id, n.delivery_id from new_rows n) p
   cross join lateral (select 1 from crm.webhook_deliveries d
                        where d.workspace_id = p.workspace_id and d.id = p.delivery_id and d.xmin = v_this_transaction) d;
  if v_written < v_parents then
    perform 1 from (select distinct n.workspace_id, n.delivery_id from new_rows n order by 1, 2) p
     cross join lateral (select d.id from crm.webhook_deliveries d
                          where d.workspace_id = p.workspace_id and d.id = p.delivery_id and d.xmin <> v_this_transaction
                            for key share) d;
    get diagnostics v_locked = row_count;
  end if;
  if v_written + v_locked < v_parents then
    raise exception 'a webhook attempt names a delivery that does not exist'
      using errcode = 'foreign_key_violation', schema = 'crm', table = 'webhook_attempts',
            constraint = 'webhook_attempts_delivery_exists';
  end if;
  return null;
end
$function$;
comment on function crm.tg_webhook_attempts__delivery_exists() is
  'The foreign key of an attempt''s delivery, once per inserting statement: a delivery this transaction wrote is only '
  'found, any other is locked FOR KEY SHARE as a foreign key would lock it; a missing one fails with 23503.';
grant execute on function crm.tg_webhook_attempts__delivery_exists() to crm_api;

create or replace function crm.tg_webhook_subscriptions__delete_deliveries()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  delete from crm.webhook_deliveries d
   where d.ctid = any (array(select x.ctid from old_rows o
                              cross join lateral (select x.ctid from crm.webhook_deliveries x
                                                   where x.workspace_id = o.workspace_id and x.subscription_id = o.id) x));
  return null;
end
$function$;
comment on function crm.tg_webhook_subscriptions__delete_deliveries() is
  'The cascade of a deleted subscription to its deliveries (and through them their attempts), once per statement.';
grant execute on function crm.tg_webhook_subscriptions__delete_deliveries() to crm_api;

create or replace function crm.tg_webhook_deliveries__delete_attempts()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  delete from crm.webhook_attempts a
   where a.ctid = any (array(select x.ctid from old_rows o
                              cross join lateral (select x.ctid from crm.webhook_attempts x
                                                   where x.workspace_id = o.workspace_id and x.delivery_id = o.id) x));
  return null;
end
$function$;
comment on function crm.tg_webhook_deliveries__delete_attempts() is
  'The cascade of deleted deliveries to their attempts, once per statement (housekeeping deletes thousands at once).';
grant execute on function crm.tg_webhook_deliveries__delete_attempts() to crm_api;

CREATE TRIGGER tg_webhook_deliveries__subscription_exists AFTER INSERT ON crm.webhook_deliveries
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_webhook_deliveries__subscription_exists();
CREATE TRIGGER tg_webhook_attempts__delivery_exists AFTER INSERT ON crm.webhook_attempts
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_webhook_attempts__delivery_exists();
CREATE TRIGGER tg_webhook_subscriptions__delete_deliveries AFTER DELETE ON crm.webhook_subscriptions
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_webhook_subscriptions__delete_deliveries();
CREATE TRIGGER tg_webhook_deliveries__delete_attempts AFTER DELETE ON crm.webhook_deliveries
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_webhook_deliveries__delete_attempts();

comment on table crm.webhook_operation_counts is
  'Test events and recoveries a subscription has had in its current fixed window (crm.claim_webhook_operation); '
  'written only by the SECURITY DEFINER functions of those operations, so no request role has a policy or grant.';
create policy webhook_operation_counts_all_owner on crm.webhook_operation_counts as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy webhook_operation_counts_all_owner on crm.webhook_operation_counts is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
