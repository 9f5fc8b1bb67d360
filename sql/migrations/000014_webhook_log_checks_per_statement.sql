-- The delivery log's two foreign keys (a delivery's subscription, an attempt's delivery) become
-- statement-level triggers in sql/definitions/40_events_and_webhooks.sql, which keep the same rules:
-- an insert whose parent does not exist fails (23503) with the parent locked FOR KEY SHARE as the
-- foreign key locked it, and deleting a subscription or a delivery deletes its deliveries or
-- attempts. A foreign key checks and locks its parent once per row: a batch of 100 first attempts
-- locked the same subscription row 100 times (a multixact when several batches overlap) and each
-- delivery it had just inserted once more; the triggers check each parent once per statement and
-- lock only parents the transaction did not write itself (docs/performance.md, Webhooks).
set local lock_timeout = '5s';
set local statement_timeout = '60s';

alter table crm.webhook_attempts drop constraint webhook_attempts_delivery_fkey;
alter table crm.webhook_deliveries drop constraint webhook_deliveries_subscription_fkey;
