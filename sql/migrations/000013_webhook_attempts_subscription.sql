-- A subscription's attempts of the last 24 hours and its latest attempts (docs/api.md section 7:
-- stats.success_rate and health), read through one index instead of through every delivery of the
-- log: an attempt in the last 24 hours may belong to a delivery created up to 30 days earlier
-- (redeliver, recover), so the deliveries' creation order bounds nothing. Each attempt carries its
-- delivery's subscription and test flag, both fixed for a delivery's life
-- (crm.tg_webhook_deliveries__keep_identity); crm.record_webhook_attempts writes them.
-- Each attempt also keeps the request headers it sent, secrets left out (docs/api.md section 7):
-- the Standard Webhooks signature and the transport's headers cannot be rebuilt afterwards.
set local lock_timeout = '5s';
-- Existing attempts (30 days by default) are filled in one pass.
set local statement_timeout = '10min';

alter table crm.webhook_attempts add column subscription_id uuid;
alter table crm.webhook_attempts add column is_test boolean;
alter table crm.webhook_attempts add column request_headers jsonb;
alter type crm.webhook_attempt_result add attribute request_headers jsonb;
-- The append-only trigger refuses every update; this one fills the new columns of existing rows.
alter table crm.webhook_attempts disable trigger user;
update crm.webhook_attempts a
   set subscription_id = d.subscription_id, is_test = d.is_test
  from crm.webhook_deliveries d
 where d.workspace_id = a.workspace_id and d.id = a.delivery_id;
alter table crm.webhook_attempts enable trigger user;
-- The table is locked for the update above already; the scan of NOT NULL adds no new wait.
-- squawk-ignore adding-not-nullable-field
alter table crm.webhook_attempts alter column subscription_id set not null;
-- squawk-ignore adding-not-nullable-field
alter table crm.webhook_attempts alter column is_test set not null;
-- squawk-ignore require-concurrent-index-creation
create index webhook_attempts_health on crm.webhook_attempts
  using btree (workspace_id, subscription_id, started_at) include (error)
  where not is_test;
