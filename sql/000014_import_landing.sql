-- Import landing: what the second round of import profiling changed in the database.
-- Measured on bench/imports.ts (100,000 contacts) with per-statement timings in the job and the
-- CPU time of the landing backend; README (CSV import) has the figures.

-- ---------------------------------------------------------------------------------------------
-- Repeats within a file: a plan that stays linear whatever the statistics say
-- ---------------------------------------------------------------------------------------------

-- complete_import deletes the staged rows, so autovacuum usually last saw crm.import_rows empty.
-- Believing that, the planner joined the marked rows to the file's rows with a nested loop that
-- computed the window again for every row: 155 s for a 20,000-row file (seen in a test database;
-- 2 s in a fresh one). Without nested loops the join is a hash or merge join, linear in the file.
-- Same statements, same marks.
create or replace function crm.mark_import_repeats(p_workspace_id uuid, p_import_id uuid, p_kind text, p_column integer) returns integer
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
-- Ids: PostgreSQL's own UUIDv7 where the server has one
-- ---------------------------------------------------------------------------------------------

-- An imported contact takes two ids (the record's and its event's). crm.uuid_v7 builds one from
-- gen_random_uuid and the clock in SQL: 3.7 µs against 2.0 µs for PostgreSQL 18's uuidv7() (100,000
-- calls, same session). On 18 and later it now calls uuidv7(): also a version 7 UUID, time-ordered
-- to the millisecond, and in addition monotonic within a session (its sub-millisecond bits).
-- Older servers keep the SQL of 000001.
do $$
begin
  if current_setting('server_version_num')::integer >= 180000 then
    execute $sql$
      create or replace function crm.uuid_v7() returns uuid
      language sql volatile parallel safe
      return uuidv7()
    $sql$;
    comment on function crm.uuid_v7() is 'A time-ordered UUID version 7: PostgreSQL''s uuidv7() (this server is 18 or later).';
  end if;
end
$$;
