-- A webhook subscription as the API shows it, with its 24-hour stats, rendered in SQL as records
-- are by crm.<type>_json.
--
-- It takes the subscription's key rather than its row: crm_api may not read secret_encrypted, and
-- a whole-row reference needs every column. It runs as the caller, so row-level security decides
-- what it sees, of the subscription (admins only) and of its deliveries alike.

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
