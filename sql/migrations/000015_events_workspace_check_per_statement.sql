-- The outbox's workspace key checked once per statement instead of once per row: the foreign key
-- events_workspace_id_fkey fired PostgreSQL's check trigger for every event, a lookup and a row lock
-- of the workspace each, about a fifth of what writing an event cost (docs/performance.md, "Batch
-- routes"). The statement triggers tg_events__workspace_exists_* (the check, the workspace locked
-- FOR KEY SHARE as the key's check locked it) and tg_workspaces__delete_events (the cascade) keep
-- the same guarantee: every event's workspace exists.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

alter table crm.events drop constraint events_workspace_id_fkey;
