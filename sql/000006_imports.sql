-- Imports (API.md section 6): uploaded CSV files, their staged rows and per-row errors, the proven
-- import context that policies read, and the functions the process_import job runs. Exports need
-- no table: the export query itself adds the export scope (src/exports/export-query.ts).
--
-- Where the file lives: in crm.imports.file_bytes (bytea, storage EXTERNAL). Keeping it in the
-- database makes upload and job one system: any worker on any machine can run the job, the file is
-- backed up and removed with its workspace, and there is no shared disk or object store to run.
-- EXTERNAL (uncompressed TOAST) lets the job read the file in 1 MiB substring() slices, so neither
-- side ever holds the whole 50 MiB. crm.prune_imports drops files and staged rows after 7 days.
--
-- How a job lands rows (workers/process_import.ts): it stages every record of the file into
-- crm.import_rows with COPY ... FROM STDIN (as the owner, in one transaction: measured, a third of
-- the database time of an INSERT from json per 5,000 records), then lands them in batches; each
-- batch transaction runs as crm_api with the importing user's proven context (the import context
-- of 000002_tenancy.sql), validates set-wise, inserts/updates, records its errors and advances
-- crm.imports.last_row_done together. A killed worker leaves whole batches done or not done, and
-- the retried job resumes after last_row_done. The record policies an import meets are in
-- 000003_records.sql.

-- Transaction-local limits, as in every migration: waiting long for a lock would hold up every
-- query queued behind the migration, and no statement here should run for long.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- ---------------------------------------------------------------------------------------------
-- Imports
-- ---------------------------------------------------------------------------------------------

create table crm.imports (
  workspace_id uuid not null default crm.current_workspace_id() references crm.workspaces (id) on delete cascade,
  id uuid not null default crm.uuid_v7(),
  user_id uuid not null default crm.current_user_id(),
  record_type text not null constraint imports_record_type_known check (record_type in ('contacts', 'companies', 'deals')),
  file_name text constraint imports_file_name_length check (length(file_name) between 1 and 255),
  file_bytes bytea,
  file_size bigint not null constraint imports_file_size_check check (file_size >= 0),
  delimiter text not null constraint imports_delimiter_known check (delimiter in (',', ';', E'\t')),
  columns text[] not null,
  row_count integer not null constraint imports_row_count_check check (row_count >= 0),
  sample_rows jsonb not null,
  suggested_mapping jsonb not null,
  status text not null default 'uploaded' constraint imports_status_known check (status in ('uploaded', 'queued', 'processing', 'completed', 'failed')),
  mapping jsonb,
  mode text constraint imports_mode_known check (mode in ('create', 'upsert')),
  match_on text constraint imports_match_on_known check (match_on in ('email', 'domain', 'id')),
  dry_run boolean not null default false,
  staged boolean not null default false,
  last_row_done integer not null default 0,
  created integer not null default 0,
  updated integer not null default 0,
  skipped integer not null default 0,
  failed integer not null default 0,
  companies_created integer not null default 0,
  failure text,
  created_at timestamptz not null default now(),
  queued_at timestamptz,
  started_at timestamptz,
  finished_at timestamptz,
  primary key (workspace_id, id),
  constraint imports_user_fkey foreign key (workspace_id, user_id) references crm.memberships (workspace_id, user_id) on delete cascade
);
alter table crm.imports enable row level security;
-- Uncompressed out-of-line storage: substring(file_bytes ...) then reads only the slice's chunks.
alter table crm.imports alter column file_bytes set storage external;
create index imports_created_at on crm.imports (created_at);
comment on index crm.imports_created_at is 'crm.prune_imports: files and imports past their retention.';
comment on table crm.imports is 'One uploaded CSV file and the import job run on it (API.md section 6).';
comment on column crm.imports.file_bytes is 'The uploaded file as sent (BOM included); null once pruned.';
comment on column crm.imports.last_row_done is 'Progress: every data row up to this number is landed or reported, committed with the counts.';
comment on column crm.imports.staged is 'Every record of the file is in crm.import_rows.';

create policy imports_select_own_or_admin on crm.imports for select to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and (user_id = (select crm.current_user_id()) or (select crm.is_admin())));
comment on policy imports_select_own_or_admin on crm.imports is 'An import is seen by the member who uploaded it and by admins.';
create policy imports_insert_with_grant on crm.imports for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id()) and user_id = (select crm.current_user_id())
              and crm.grant_scope(record_type, 'import') is not null);
comment on policy imports_insert_with_grant on crm.imports is 'Uploading needs the import grant on the record type.';
-- No update or delete for crm_api: the state machine moves only through the functions below.
grant select (workspace_id, id, user_id, record_type, file_name, file_size, delimiter, columns, row_count, sample_rows,
              suggested_mapping, status, mapping, mode, match_on, dry_run, last_row_done, created, updated, skipped, failed,
              companies_created, failure, created_at, queued_at, started_at, finished_at)
   on crm.imports to crm_api;
grant insert (record_type, file_name, file_bytes, file_size, delimiter, columns, row_count, sample_rows, suggested_mapping)
   on crm.imports to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Staged rows and errors
-- ---------------------------------------------------------------------------------------------

create table crm.import_rows (
  workspace_id uuid not null,
  import_id uuid not null,
  row integer not null,
  user_id uuid not null,
  cells text[] not null,
  repeat_of integer,
  primary key (workspace_id, import_id, row),
  foreign key (workspace_id, import_id) references crm.imports (workspace_id, id) on delete cascade
);
alter table crm.import_rows enable row level security;
-- The primary key serves the batch ranges (row > last_row_done order by row).
comment on table crm.import_rows is 'Every data record of an import file as parsed (row = 1-based data record number); kept for failed rows (errors.csv) and dry runs.';
comment on column crm.import_rows.user_id is 'The importing user (copied from crm.imports so the policy needs no join).';
comment on column crm.import_rows.repeat_of is
  'The first row of this file with the same match key, when this row repeats it (crm.mark_import_repeats, once per run).';
create policy import_rows_select_own_or_admin on crm.import_rows for select to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and (user_id = (select crm.current_user_id()) or (select crm.is_admin())));
comment on policy import_rows_select_own_or_admin on crm.import_rows is 'Staged rows are seen like their import.';
grant select on crm.import_rows to crm_api;

create table crm.import_errors (
  workspace_id uuid not null,
  import_id uuid not null,
  row integer not null,
  position integer not null,
  user_id uuid not null,
  column_name text,
  field text,
  message text not null,
  primary key (workspace_id, import_id, row, position),
  foreign key (workspace_id, import_id) references crm.imports (workspace_id, id) on delete cascade
);
alter table crm.import_errors enable row level security;
-- The primary key serves "the first 100 errors" and errors.csv (in row order).
comment on table crm.import_errors is 'Why a row was not imported: one line per problem (a row may have several).';
create policy import_errors_select_own_or_admin on crm.import_errors for select to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and (user_id = (select crm.current_user_id()) or (select crm.is_admin())));
comment on policy import_errors_select_own_or_admin on crm.import_errors is 'Errors are seen like their import.';
grant select on crm.import_errors to crm_api;


-- ---------------------------------------------------------------------------------------------
-- Step 2: queue the job (called by the API as crm_api)
-- ---------------------------------------------------------------------------------------------

create function crm.queue_import(p_import_id uuid, p_mapping jsonb, p_mode text, p_match_on text, p_dry_run boolean) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, public
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_record_type text;
  v_status text;
  v_dry_run boolean;
  v_available boolean;
begin
  select i.record_type, i.status, i.dry_run, (i.staged or i.file_bytes is not null)
    into v_record_type, v_status, v_dry_run, v_available
    from crm.imports i
   where i.workspace_id = v_workspace and i.id = p_import_id and i.user_id = crm.current_user_id()
     for update;
  if not found then
    raise exception 'no such import' using errcode = 'CR404', hint = 'not_found';
  end if;
  if crm.grant_scope(v_record_type, 'import') is null then
    raise exception 'your role has no % import grant', v_record_type using errcode = 'CR403', hint = 'forbidden';
  end if;
  if p_mode = 'upsert' and crm.grant_scope(v_record_type, 'update') is null then
    raise exception 'an upsert needs the % update grant', v_record_type using errcode = 'CR403', hint = 'forbidden';
  end if;
  -- A file runs once for real; after a dry run it may run again (for real or dry).
  if not (v_status = 'uploaded' or (v_status in ('completed', 'failed') and v_dry_run)) then
    raise exception 'this import has already been started (status %)', v_status using errcode = 'CR409', hint = 'import_already_started';
  end if;
  if not v_available then
    raise exception 'the file of this import has been removed; upload it again' using errcode = 'CR409', hint = 'import_file_removed';
  end if;
  delete from crm.import_errors e where e.workspace_id = v_workspace and e.import_id = p_import_id;
  update crm.imports i
     set status = 'queued', mapping = p_mapping, mode = p_mode, match_on = p_match_on, dry_run = p_dry_run,
         last_row_done = 0, created = 0, updated = 0, skipped = 0, failed = 0, companies_created = 0,
         failure = null, queued_at = now(), started_at = null, finished_at = null
   where i.workspace_id = v_workspace and i.id = p_import_id;
  perform graphile_worker.add_job('process_import',
    json_build_object('workspace_id', v_workspace, 'import_id', p_import_id),
    max_attempts => 5, job_key => 'process_import:' || p_import_id::text);
end
$$;
comment on function crm.queue_import(uuid, jsonb, text, text, boolean) is
  'Starts an import: checks the import grant (and update for upsert) of the caller, records the options and adds the process_import job in the same transaction.';
revoke execute on function crm.queue_import(uuid, jsonb, text, text, boolean) from public;
grant execute on function crm.queue_import(uuid, jsonb, text, text, boolean) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- The job's steps (the worker connects as the owner; none of these is executable by crm_api
-- except finish_import_batch, which needs the proven import context)
-- ---------------------------------------------------------------------------------------------

-- Opens a batch: checks that the importing member is still active and still holds the grants,
-- sets the request context for that user with via = 'import' plus the import proof, and locks the
-- import row so two workers can never land the same batch. The caller then switches to crm_api.
create function crm.begin_import_batch(p_workspace_id uuid, p_import_id uuid)
returns table (status text, record_type text, columns text[], mapping jsonb, mode text, match_on text, dry_run boolean, last_row_done integer)
language plpgsql volatile security definer
set search_path = pg_catalog, public
as $$
declare
  v_user uuid;
begin
  -- Column by column: never drags the file (file_bytes) into the function.
  select i.user_id, i.status, i.record_type, i.columns, i.mapping, i.mode, i.match_on, i.dry_run, i.last_row_done
    into v_user, status, record_type, columns, mapping, mode, match_on, dry_run, last_row_done
    from crm.imports i where i.workspace_id = p_workspace_id and i.id = p_import_id
     for update;
  if not found then
    raise exception 'no such import' using errcode = 'CR404', hint = 'not_found';
  end if;
  if not exists (select from crm.memberships m join crm.users u on u.id = m.user_id
                  where m.workspace_id = p_workspace_id and m.user_id = v_user
                    and m.suspended_at is null and u.suspended_at is null) then
    raise exception 'the importing member is suspended or has left the workspace' using errcode = 'CR403', hint = 'forbidden';
  end if;
  perform crm.set_context(v_user, p_workspace_id, 'import');
  perform set_config('crm.import_id', p_import_id::text, true);
  perform set_config('crm.import_proof', crm.import_proof(p_import_id), true);
  if crm.grant_scope(record_type, 'import') is null then
    raise exception 'the importing member''s role has no % import grant', record_type using errcode = 'CR403', hint = 'forbidden';
  end if;
  if mode = 'upsert' and crm.grant_scope(record_type, 'update') is null then
    raise exception 'the importing member''s role has no % update grant (needed for upsert)', record_type using errcode = 'CR403', hint = 'forbidden';
  end if;
  if status = 'queued' then
    update crm.imports i set status = 'processing', started_at = coalesce(i.started_at, now())
     where i.workspace_id = p_workspace_id and i.id = p_import_id;
    status := 'processing';
  end if;
  return next;
end
$$;
comment on function crm.begin_import_batch(uuid, uuid) is
  'Worker only: opens an import batch as the importing user (via import), after checking membership and grants; locks the import row.';
revoke execute on function crm.begin_import_batch(uuid, uuid) from public;

-- Closes a batch: its errors, its counts and the new progress mark, in the batch's transaction.
create function crm.finish_import_batch(p_import_id uuid, p_expected_last_row integer, p_last_row integer, p_counts jsonb, p_errors jsonb) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, public
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_user uuid := crm.current_user_id();
begin
  if crm.current_import_id() is distinct from p_import_id then
    raise exception 'not inside this import' using errcode = '42501';
  end if;
  insert into crm.import_errors (workspace_id, import_id, row, position, user_id, column_name, field, message)
  select v_workspace, p_import_id, (e.item ->> 'row')::integer,
         row_number() over (partition by (e.item ->> 'row')::integer order by e.ordinality),
         v_user, e.item ->> 'column_name', e.item ->> 'field', e.item ->> 'message'
    from jsonb_array_elements(p_errors) with ordinality as e(item, ordinality);
  update crm.imports i
     set last_row_done = p_last_row,
         created = i.created + coalesce((p_counts ->> 'created')::integer, 0),
         updated = i.updated + coalesce((p_counts ->> 'updated')::integer, 0),
         skipped = i.skipped + coalesce((p_counts ->> 'skipped')::integer, 0),
         failed = i.failed + coalesce((p_counts ->> 'failed')::integer, 0),
         companies_created = i.companies_created + coalesce((p_counts ->> 'companies_created')::integer, 0)
   where i.workspace_id = v_workspace and i.id = p_import_id and i.last_row_done = p_expected_last_row;
  if not found then
    raise exception 'import % moved on under this batch', p_import_id using errcode = '40001';
  end if;
end
$$;
comment on function crm.finish_import_batch(uuid, integer, integer, jsonb, jsonb) is
  'Records a batch''s errors and counts and advances last_row_done (only from the expected mark: a concurrent run fails with 40001).';
revoke execute on function crm.finish_import_batch(uuid, integer, integer, jsonb, jsonb) from public;
grant execute on function crm.finish_import_batch(uuid, integer, integer, jsonb, jsonb) to crm_api;

create function crm.complete_import(p_workspace_id uuid, p_import_id uuid, p_status text, p_failure text) returns void
language sql volatile
as $$
  update crm.imports set status = p_status, failure = p_failure, finished_at = now()
   where workspace_id = p_workspace_id and id = p_import_id;
  -- After a real run only the rows errors.csv needs are kept; a dry run keeps all for the real run.
  delete from crm.import_rows r
   using crm.imports i
   where i.workspace_id = p_workspace_id and i.id = p_import_id and p_status = 'completed' and not i.dry_run
     and r.workspace_id = i.workspace_id and r.import_id = i.id
     and not exists (select from crm.import_errors e where e.workspace_id = r.workspace_id and e.import_id = r.import_id and e.row = r.row);
$$;
comment on function crm.complete_import(uuid, uuid, text, text) is 'Worker only: ends an import (completed or failed) and drops staged rows no longer needed.';
revoke execute on function crm.complete_import(uuid, uuid, text, text) from public;

-- ---------------------------------------------------------------------------------------------
-- Owners a scope does not cover, for a set of owners at once
-- ---------------------------------------------------------------------------------------------

-- An import reports, row by row, the owners its scopes refuse (a new record's owner under the
-- import grant; a matched record's owner, and its new owner, under the update grant) before it
-- writes anything, so that the batch's other rows still land. The rule is the policies' own:
-- crm.grant_scope is 'all', or the owner is one of crm.scope_owner_ids. A batch passes its
-- distinct owners and calls this once per statement (as an InitPlan), never once per row: each
-- helper verifies the context's HMAC proof.
create function crm.owners_outside_scope(p_resource text, p_action text, p_owner_ids uuid[]) returns uuid[]
language plpgsql stable
set search_path = pg_catalog, public
as $$
declare
  v_covered uuid[];
begin
  if crm.grant_scope(p_resource, p_action) = 'all' then
    return '{}';
  end if;
  v_covered := crm.scope_owner_ids(p_resource, p_action);
  return array(select distinct o.owner_id
                 from unnest(p_owner_ids) as o (owner_id)
                where o.owner_id is not null and o.owner_id <> all (v_covered)
                order by o.owner_id);
end
$$;
comment on function crm.owners_outside_scope(text, text, uuid[]) is
  'The owners among p_owner_ids (nulls left out) whose records the current member''s resource:action scope does not cover: none for all, every one without a grant.';
grant execute on function crm.owners_outside_scope(text, text, uuid[]) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Repeated keys within a file, found once per run
-- ---------------------------------------------------------------------------------------------

-- A key (email, domain or id) repeated within a file fails as "duplicate: repeats row N". The run
-- marks every repeat once, in one pass, when it starts; batches read the mark of their own rows.
-- (Reading every earlier staged row from each batch instead is quadratic in the file: 2.3 s of a
-- 100,000-row import, growing with the square of its length.)
create function crm.import_key(p_kind text, p_value text) returns text
language sql immutable parallel safe
return case p_kind
  when 'email' then lower(nullif(btrim(p_value), ''))
  when 'domain' then rtrim(lower(nullif(btrim(p_value), '')), '.')
  when 'id' then case when btrim(p_value) ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$' then lower(btrim(p_value)) end
end;
comment on function crm.import_key(text, text) is
  'The match key of a cell as an import compares it: email lower-case, domain lower-case without a trailing dot, id a canonical UUID (anything else has no key).';
grant execute on function crm.import_key(text, text) to crm_api;

-- Worker only (as the owner, inside the run's first batch transaction, so the marks commit with
-- that batch). p_column is the 1-based cell of the key; null clears the marks (no key mapped).
--
-- complete_import deletes the staged rows, so autovacuum usually last saw crm.import_rows empty.
-- Believing that, the planner would join the marked rows to the file's rows with a nested loop that
-- computes the window again for every row: 155 s for a 20,000-row file (seen in a test database;
-- 2 s in a fresh one). Without nested loops the join is a hash or merge join, linear in the file.
create function crm.mark_import_repeats(p_workspace_id uuid, p_import_id uuid, p_kind text, p_column integer) returns integer
language plpgsql volatile
set search_path = pg_catalog, pg_temp
set enable_nestloop = off
as $$
declare
  v_marked integer;
begin
  update crm.import_rows r set repeat_of = null
   where r.workspace_id = p_workspace_id and r.import_id = p_import_id and r.repeat_of is not null;
  if p_column is null then
    return 0;
  end if;
  with keyed as (
    select r.row, min(r.row) over (partition by crm.import_key(p_kind, r.cells[p_column])) as first_row
      from crm.import_rows r
     where r.workspace_id = p_workspace_id and r.import_id = p_import_id
       and crm.import_key(p_kind, r.cells[p_column]) is not null
  )
  update crm.import_rows r set repeat_of = k.first_row
    from keyed k
   where r.workspace_id = p_workspace_id and r.import_id = p_import_id and r.row = k.row and k.first_row < k.row;
  get diagnostics v_marked = row_count;
  return v_marked;
end
$$;
comment on function crm.mark_import_repeats(uuid, uuid, text, integer) is
  'Worker only: marks every staged row whose match key (crm.import_key of cell p_column) repeats an earlier row of the file, clearing the marks of a previous run first (no nested loop: linear whatever the statistics of crm.import_rows say).';
revoke execute on function crm.mark_import_repeats(uuid, uuid, text, integer) from public;

-- ---------------------------------------------------------------------------------------------
-- Set-wise validation helpers (run as crm_api inside a batch)
-- ---------------------------------------------------------------------------------------------

-- A cell as a date, or null when it is not a real YYYY-MM-DD date (no exception, no subtransaction).
create function crm.import_date(value text) returns date
language sql immutable parallel safe
as $$
  select case
    when value ~ '^\d{4}-\d{2}-\d{2}$'
         and substr(value, 1, 4)::integer between 1000 and 9999
         and substr(value, 6, 2)::integer between 1 and 12
         and substr(value, 9, 2)::integer between 1 and
             extract(day from (make_date(substr(value, 1, 4)::integer, substr(value, 6, 2)::integer, 1) + interval '1 month - 1 day'))::integer
    then value::date
  end
$$;
comment on function crm.import_date(text) is 'Parses YYYY-MM-DD; null for anything else (imports report it as a row error).';
grant execute on function crm.import_date(text) to crm_api;

-- Every CHECK constraint of the target table, evaluated on the batch's typed rows: the same rules
-- as a create, read from the catalog so that they never drift from 000003_records.sql. A row whose
-- value breaks a constraint gets one problem per constraint, named after the constraint's (first)
-- column. All the constraints run in one scan of the batch (one INSERT ... SELECT per constraint
-- scans it nine times for contacts): a row's problems come out in constraint-name order, rows in
-- row order. %L of a missing column name gives NULL, so the field is null then.
create function crm.import_check_constraints(p_record_type text) returns integer
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
  v_broken text;
  v_fields text;
  v_messages text;
  v_count integer;
begin
  if p_record_type not in ('contacts', 'companies', 'deals') then
    raise exception 'unknown record type %', p_record_type;
  end if;
  -- Each expression is the catalog's own text of a constraint of our table, never client input.
  select string_agg(format('not coalesce((%s), true)', k.expression), ', ' order by k.conname),
         string_agg(format('%L', k.field), ', ' order by k.conname),
         string_agg(format('%L', crm.import_constraint_message(k.conname, k.field)), ', ' order by k.conname)
    into v_broken, v_fields, v_messages
    from (select c.conname, pg_get_expr(c.conbin, c.conrelid) as expression,
                 (select a.attname from pg_attribute a where a.attrelid = c.conrelid and a.attnum = c.conkey[1]) as field
            from pg_constraint c
           where c.conrelid = format('crm.%I', p_record_type)::regclass and c.contype = 'c') k;
  if v_broken is null then
    return 0;
  end if;
  -- One array of verdicts per row; only rows with a broken constraint are unnested (a VALUES list
  -- per row was measured at 40 µs a row: its expressions are set up again for every row).
  execute format(
    'insert into pg_temp.import_problems (row, field, message)
     select b.row, u.field, u.message
       from (select t.row, array[%s] as broken from pg_temp.import_typed t) b
      cross join lateral unnest(b.broken, array[%s]::text[], array[%s]::text[]) with ordinality as u (broken, field, message, ordinal)
      where true = any (b.broken) and u.broken
      order by b.row, u.ordinal', v_broken, v_fields, v_messages);
  get diagnostics v_count = row_count;
  return v_count;
end
$$;
comment on function crm.import_check_constraints(text) is 'Imports: reports every row of pg_temp.import_typed that a CHECK constraint of the target table would refuse (one scan for all of them).';
grant execute on function crm.import_check_constraints(text) to crm_api;

create function crm.import_constraint_message(p_constraint text, p_field text) returns text
language sql immutable parallel safe
as $$
  select case
    when p_constraint like '%\_name\_or\_email' then 'needs a first name, a last name or an email'
    when p_constraint like '%\_length' then p_field || ' is empty or too long'
    when p_constraint like '%\_format' then p_field || ' is not in a valid format'
    when p_constraint like '%\_custom\_fields\_check' then 'custom_fields are invalid (at most 50 keys)'
    when p_constraint like '%\_check' then p_field || ' is out of range'
    else p_field || ' is invalid (' || p_constraint || ')'
  end
$$;
comment on function crm.import_constraint_message(text, text) is 'A readable message for a constraint an import row breaks.';
grant execute on function crm.import_constraint_message(text, text) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Exports: CSV cells are built in SQL, so the API process only concatenates lines
-- ---------------------------------------------------------------------------------------------

create function crm.csv_cell(value text) returns text
language sql immutable parallel safe
as $$
  -- strpos, not a regular expression: measured three times faster over a million rows.
  select case
    when value is null then ''
    when strpos(value, '"') > 0 or strpos(value, ',') > 0 or strpos(value, E'\n') > 0 or strpos(value, E'\r') > 0
      then '"' || replace(value, '"', '""') || '"'
    else value
  end
$$;
comment on function crm.csv_cell(text) is 'One RFC 4180 CSV cell: quoted when it holds a quote, a comma or a line break; null is empty.';
grant execute on function crm.csv_cell(text) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Housekeeping (crm.housekeeping runs every crm.prune_* function)
-- ---------------------------------------------------------------------------------------------

create function crm.prune_imports(log_retention_days integer) returns bigint
language sql volatile
as $$
  with files as (
    update crm.imports set file_bytes = null
     where file_bytes is not null and created_at < now() - interval '7 days' and status not in ('queued', 'processing')
    returning 1
  ), staged as (
    delete from crm.import_rows r using crm.imports i
     where i.workspace_id = r.workspace_id and i.id = r.import_id
       and i.created_at < now() - interval '7 days' and i.status not in ('queued', 'processing')
    returning 1
  ), imports as (
    delete from crm.imports
     where created_at < now() - make_interval(days => greatest(log_retention_days, 7)) and status not in ('queued', 'processing')
    returning 1
  )
  select (select count(*) from files) + (select count(*) from staged) + (select count(*) from imports)
$$;
comment on function crm.prune_imports(integer) is
  'Removes import files and staged rows 7 days after upload, and imports with their errors after the log retention (at least 7 days).';
