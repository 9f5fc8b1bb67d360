-- webhook_deliveries_test_event_consistent was added NOT VALID to a table that already had rows
-- (every row made since was checked); a database that still has it unvalidated checks the old rows
-- now, so that the constraint holds for every row and a DBA reads it as valid. A new database made it
-- valid with its table, and this does nothing there.
set local lock_timeout = '5s';
-- A scan of the deliveries kept (30 days by default) that takes no lock writes wait for.
set local statement_timeout = '10min';

alter table crm.webhook_deliveries validate constraint webhook_deliveries_test_event_consistent;
