-- A record update's history entry stored with its event (crm.record_history, docs/api.md section 5b):
-- the outbox triggers fill it when they write a .updated event, so a history page reads each change
-- instead of computing it from the event's data (about half of the page's statement, see
-- docs/performance.md, "Record history"). Created and deleted events, and events written before this
-- column, keep it null: the view computes theirs with the same function (crm.event_changes), so no
-- row is rewritten here.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

alter table crm.events add column changes jsonb;
