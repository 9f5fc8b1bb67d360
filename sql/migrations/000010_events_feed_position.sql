-- The events feed's position (docs/api.md section 8a): each event carries the id of the transaction
-- that wrote it, and the feed reads a workspace's events in (xid, id) order, only below the oldest
-- transaction still running, so no event can appear behind a cursor already handed out
-- (docs/decisions.md, "The events feed's order"). Events written before this column read as
-- transaction 0: older than every new one, in id order.
set local lock_timeout = '5s';
-- Existing events (30 days by default) are given position 0 in one pass.
set local statement_timeout = '10min';

alter table crm.events add column xid xid8;
update crm.events set xid = '0' where xid is null;
alter table crm.events alter column xid set default pg_current_xact_id();
-- squawk-ignore require-concurrent-index-creation
create index events_feed on crm.events using btree (workspace_id, xid, id);
