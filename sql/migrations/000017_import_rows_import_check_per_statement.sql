-- The staged rows' import checked once per statement instead of once per row: the foreign key
-- import_rows_workspace_id_import_id_fkey fired PostgreSQL's check trigger for every row of the
-- file that the import job stages in one INSERT, a lookup and a row lock of the same import each,
-- about half of what staging cost the database (docs/performance.md, "Imports"). The statement
-- triggers tg_import_rows__import_exists_* (the check, the import locked FOR KEY SHARE as the key's
-- check locked it) and tg_imports__delete_import_rows (the cascade) keep the same guarantee: every
-- staged row's import exists.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

alter table crm.import_rows drop constraint import_rows_workspace_id_import_id_fkey;
