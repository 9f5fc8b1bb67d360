-- The token a change was made with, for a record's history (crm.record_history, docs/api.md section
-- 5b). A column of its own rather than a key of actor: actor is copied into every webhook body as it
-- is, and receivers are not told which token wrote a change. The default reads the request context
-- in the writing transaction, so every outbox trigger fills it without naming it. Events written
-- before this column have none (the default is set after the column is added: no row is rewritten).
-- The lookup of one record's events, newest first, is the existing index events_record.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

alter table crm.events add column token_id uuid;
alter table crm.events alter column token_id set default crm.current_token_id();
