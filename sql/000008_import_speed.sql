-- Import speed: what an import batch pays per row, made cheaper without loosening any rule.
-- Measured on the benchmark's 100,000-contact file (bench/imports.ts) with a profiler on the
-- landing backend; each section says what it bought. Every rule stays enforced by the database:
-- the CHECK constraints, policies and outbox triggers are the same with less per-row work, and the
-- one foreign key dropped (a record's workspace key) was implied by the owner key beside it.

-- ---------------------------------------------------------------------------------------------
-- custom_fields CHECK: an empty object needs no per-row function executor
-- ---------------------------------------------------------------------------------------------

-- The CHECK on custom_fields called a SQL function with a subquery, which PostgreSQL cannot
-- inline: every row started a small executor (about 8 % of an import's insert, and the same again
-- in the import's own constraint pass). Almost every imported row has no custom fields, so the
-- check now answers '{}' inline and runs the full check, unchanged, only for a non-empty object.
create function crm.custom_fields_entries_are_valid(fields jsonb) returns boolean
language sql immutable parallel safe
as $$
  select jsonb_typeof(fields) = 'object'
     and (select count(*) <= 50
                 and coalesce(bool_and(key ~ '^[a-z][a-z0-9_]{0,62}$'
                                       and jsonb_typeof(value) in ('string', 'number', 'boolean', 'null')), true)
            from jsonb_each(fields))
$$;
comment on function crm.custom_fields_entries_are_valid(jsonb) is
  'The full custom_fields check: an object of at most 50 keys matching ^[a-z][a-z0-9_]{0,62}$ whose values are strings, numbers, booleans or null.';
grant execute on function crm.custom_fields_entries_are_valid(jsonb) to crm_api;

-- Same answer for every input as before (the empty object passed the full check too, and null
-- still gives null); a single expression, so the planner inlines it into the CHECK.
create or replace function crm.custom_fields_are_valid(fields jsonb) returns boolean
language sql immutable parallel safe
return fields = '{}'::jsonb or crm.custom_fields_entries_are_valid(fields);
comment on function crm.custom_fields_are_valid(jsonb) is
  'CHECK for custom_fields: an object of at most 50 keys matching ^[a-z][a-z0-9_]{0,62}$ whose values are strings, numbers, booleans or null. The empty object is answered inline (no per-row executor).';

-- ---------------------------------------------------------------------------------------------
-- Outbox: events built as jsonb directly
-- ---------------------------------------------------------------------------------------------

-- The outbox triggers rendered each record with crm.<type>_json (json text), then jsonb parsed
-- that text again to store it: about a third of the event's cost. These render the same object
-- straight into jsonb. crm.events.data is jsonb, so the stored value is identical (same keys,
-- same values; jsonb orders keys itself); test/imports/import-speed.test.ts compares both
-- renderings field by field. The API keeps its json functions (key order as documented).
create function crm.company_jsonb(c crm.companies) returns jsonb
language sql stable parallel safe
return jsonb_build_object(
    'id', c.id, 'name', c.name, 'domain', c.domain, 'website', c.website, 'industry', c.industry,
    'phone', c.phone, 'city', c.city, 'country', c.country, 'employee_count', c.employee_count,
    'annual_revenue', c.annual_revenue::text, 'description', c.description, 'owner_id', c.owner_id,
    'custom_fields', c.custom_fields,
    'created_at', to_char(c.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'updated_at', to_char(c.updated_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'created_by', c.created_by, 'updated_by', c.updated_by);
comment on function crm.company_jsonb(crm.companies) is 'crm.company_json(c)::jsonb without the json text in between (the outbox stores jsonb).';

create function crm.contact_jsonb(c crm.contacts) returns jsonb
language sql stable parallel safe
return jsonb_build_object(
    'id', c.id, 'first_name', c.first_name, 'last_name', c.last_name, 'email', c.email,
    'phone', c.phone, 'job_title', c.job_title, 'city', c.city, 'country', c.country,
    'company_id', c.company_id, 'owner_id', c.owner_id, 'custom_fields', c.custom_fields,
    'created_at', to_char(c.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'updated_at', to_char(c.updated_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'created_by', c.created_by, 'updated_by', c.updated_by);
comment on function crm.contact_jsonb(crm.contacts) is 'crm.contact_json(c)::jsonb without the json text in between (the outbox stores jsonb).';

create function crm.deal_jsonb(d crm.deals) returns jsonb
language sql stable parallel safe
return jsonb_build_object(
    'id', d.id, 'name', d.name, 'amount', d.amount::text, 'currency', d.currency, 'stage', d.stage,
    'stage_changed_at', to_char(d.stage_changed_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), 'close_date', d.close_date,
    'company_id', d.company_id, 'owner_id', d.owner_id, 'custom_fields', d.custom_fields,
    'created_at', to_char(d.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'updated_at', to_char(d.updated_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'created_by', d.created_by, 'updated_by', d.updated_by);
comment on function crm.deal_jsonb(crm.deals) is 'crm.deal_json(d)::jsonb without the json text in between (the outbox stores jsonb).';
grant execute on function crm.company_jsonb(crm.companies), crm.contact_jsonb(crm.contacts), crm.deal_jsonb(crm.deals) to crm_api;

-- The three outbox trigger functions of 000003, unchanged but for the rendering above (same
-- signatures, so the triggers keep pointing at them).
create or replace function crm.tg_companies__write_events() returns trigger
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_actor jsonb := crm.event_actor();
  v_ids uuid[];
begin
  if tg_op = 'INSERT' then
    with written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
      select n.workspace_id, 'company.created', 'company', n.id, jsonb_build_object('object', crm.company_jsonb(n)), v_actor
        from new_rows n order by n.id
      returning id)
    select array_agg(id) into v_ids from written;
  elsif tg_op = 'UPDATE' then
    with changed as (
      select n.workspace_id, n.id, crm.company_jsonb(n) as object, crm.company_jsonb(o) as before
        from old_rows o join new_rows n on n.workspace_id = o.workspace_id and n.id = o.id
    ), diffed as (
      select c.workspace_id, c.id, c.object, crm.json_changes(c.before, c.object) as previous from changed c
    ), written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
      select d.workspace_id, 'company.updated', 'company', d.id, jsonb_build_object('object', d.object, 'previous_attributes', d.previous), v_actor
        from diffed d where d.previous <> '{}'::jsonb order by d.id
      returning id)
    select array_agg(id) into v_ids from written;
  else
    with written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
      select o.workspace_id, 'company.deleted', 'company', o.id, jsonb_build_object('object', crm.company_jsonb(o)), v_actor
        from old_rows o order by o.id
      returning id)
    select array_agg(id) into v_ids from written;
  end if;
  if v_ids is not null then
    perform crm.enqueue_event_fan_out(v_ids);
  end if;
  return null;
end
$$;
comment on function crm.tg_companies__write_events() is 'Outbox: company.created/updated/deleted for every row the statement wrote (no event for an update that changed nothing); objects rendered by crm.company_jsonb.';

create or replace function crm.tg_contacts__write_events() returns trigger
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_actor jsonb := crm.event_actor();
  v_ids uuid[];
begin
  if tg_op = 'INSERT' then
    with written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
      select n.workspace_id, 'contact.created', 'contact', n.id, jsonb_build_object('object', crm.contact_jsonb(n)), v_actor
        from new_rows n order by n.id
      returning id)
    select array_agg(id) into v_ids from written;
  elsif tg_op = 'UPDATE' then
    with changed as (
      select n.workspace_id, n.id, crm.contact_jsonb(n) as object, crm.contact_jsonb(o) as before
        from old_rows o join new_rows n on n.workspace_id = o.workspace_id and n.id = o.id
    ), diffed as (
      select c.workspace_id, c.id, c.object, crm.json_changes(c.before, c.object) as previous from changed c
    ), written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
      select d.workspace_id, 'contact.updated', 'contact', d.id, jsonb_build_object('object', d.object, 'previous_attributes', d.previous), v_actor
        from diffed d where d.previous <> '{}'::jsonb order by d.id
      returning id)
    select array_agg(id) into v_ids from written;
  else
    with written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
      select o.workspace_id, 'contact.deleted', 'contact', o.id, jsonb_build_object('object', crm.contact_jsonb(o)), v_actor
        from old_rows o order by o.id
      returning id)
    select array_agg(id) into v_ids from written;
  end if;
  if v_ids is not null then
    perform crm.enqueue_event_fan_out(v_ids);
  end if;
  return null;
end
$$;
comment on function crm.tg_contacts__write_events() is 'Outbox: contact.created/updated/deleted for every row the statement wrote (no event for an update that changed nothing); objects rendered by crm.contact_jsonb.';

create or replace function crm.tg_deals__write_events() returns trigger
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_actor jsonb := crm.event_actor();
  v_ids uuid[];
begin
  if tg_op = 'INSERT' then
    with written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
      select n.workspace_id, 'deal.created', 'deal', n.id, jsonb_build_object('object', crm.deal_jsonb(n)), v_actor
        from new_rows n order by n.id
      returning id)
    select array_agg(id) into v_ids from written;
  elsif tg_op = 'UPDATE' then
    with changed as (
      select n.workspace_id, n.id, crm.deal_jsonb(n) as object, crm.deal_jsonb(o) as before
        from old_rows o join new_rows n on n.workspace_id = o.workspace_id and n.id = o.id
    ), diffed as (
      select c.workspace_id, c.id, c.object, crm.json_changes(c.before, c.object) as previous from changed c
    ), written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
      select d.workspace_id, 'deal.updated', 'deal', d.id, jsonb_build_object('object', d.object, 'previous_attributes', d.previous), v_actor
        from diffed d where d.previous <> '{}'::jsonb order by d.id
      returning id)
    select array_agg(id) into v_ids from written;
  else
    with written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
      select o.workspace_id, 'deal.deleted', 'deal', o.id, jsonb_build_object('object', crm.deal_jsonb(o)), v_actor
        from old_rows o order by o.id
      returning id)
    select array_agg(id) into v_ids from written;
  end if;
  if v_ids is not null then
    perform crm.enqueue_event_fan_out(v_ids);
  end if;
  return null;
end
$$;
comment on function crm.tg_deals__write_events() is 'Outbox: deal.created/updated/deleted for every row the statement wrote; a stage change is a deal.updated with previous_attributes.stage; objects rendered by crm.deal_jsonb.';

-- ---------------------------------------------------------------------------------------------
-- Row triggers on insert: fire only when there is something to change
-- ---------------------------------------------------------------------------------------------

-- On INSERT the before-write triggers only normalise (email lower-case, domain lower-case without
-- a trailing dot, a deal's first stage and stage_changed_at = now()). A PL/pgSQL call per row cost
-- a few per cent of an import; a WHEN clause, evaluated inline, now skips rows that are already
-- in shape. The functions are unchanged, and UPDATE keeps its unconditional trigger (it keeps
-- created_* and records updated_by). Trigger names keep the alphabetical order of 000003, so the
-- update trigger still runs before tg_*__touch_updated_at.
drop trigger tg_companies__before_write on crm.companies;
create trigger tg_companies__before_insert before insert on crm.companies
  for each row when (new.domain is distinct from rtrim(lower(new.domain), '.'))
  execute function crm.tg_companies__before_write();
create trigger tg_companies__before_update before update on crm.companies
  for each row execute function crm.tg_companies__before_write();

drop trigger tg_contacts__before_write on crm.contacts;
create trigger tg_contacts__before_insert before insert on crm.contacts
  for each row when (new.email is distinct from lower(new.email))
  execute function crm.tg_contacts__before_write();
create trigger tg_contacts__before_update before update on crm.contacts
  for each row execute function crm.tg_contacts__before_write();

drop trigger tg_deals__before_write on crm.deals;
create trigger tg_deals__before_insert before insert on crm.deals
  for each row when (new.stage is null or new.stage_changed_at is distinct from now())
  execute function crm.tg_deals__before_write();
create trigger tg_deals__before_update before update on crm.deals
  for each row execute function crm.tg_deals__before_write();

-- ---------------------------------------------------------------------------------------------
-- Staging
-- ---------------------------------------------------------------------------------------------

-- The worker now stages a file's records with COPY ... FROM STDIN into crm.import_rows (as the
-- owner, in the staging transaction): about a third of the database time of one
-- json_to_recordset INSERT per 5,000 records, which this function was.
drop function crm.stage_import_rows(uuid, uuid, json);

-- ---------------------------------------------------------------------------------------------
-- Repeated keys within a file, found once per run
-- ---------------------------------------------------------------------------------------------

-- A key (email, domain or id) repeated within a file fails as "duplicate: repeats row N". Each
-- batch used to read every earlier staged row to find those: quadratic in the file (2.3 s of a
-- 100,000-row import, growing with the square of its length). The run now marks every repeat
-- once, in one pass, when it starts; batches read the mark of their own rows.
alter table crm.import_rows add column repeat_of integer;
comment on column crm.import_rows.repeat_of is
  'The first row of this file with the same match key, when this row repeats it (crm.mark_import_repeats, once per run).';

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
create function crm.mark_import_repeats(p_workspace_id uuid, p_import_id uuid, p_kind text, p_column integer) returns integer
language plpgsql volatile
set search_path = pg_catalog, pg_temp
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
  'Worker only: marks every staged row whose match key (crm.import_key of cell p_column) repeats an earlier row of the file, clearing the marks of a previous run first.';
revoke execute on function crm.mark_import_repeats(uuid, uuid, text, integer) from public;

-- ---------------------------------------------------------------------------------------------
-- A batch's CHECK constraint pass in one scan
-- ---------------------------------------------------------------------------------------------

-- 000006 ran one INSERT ... SELECT per CHECK constraint of the target table (nine scans of the
-- batch for contacts). The same expressions, read from the catalog as before, now run in one
-- scan: a row's problems come out in constraint-name order as before, rows in row order.
-- %L of a missing column name gives NULL, as the field of 000006 was.
create or replace function crm.import_check_constraints(p_record_type text) returns integer
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

-- ---------------------------------------------------------------------------------------------
-- Records: one foreign-key check a row less
-- ---------------------------------------------------------------------------------------------

-- Every record row paid two foreign-key checks that both prove its workspace exists: the
-- workspace key (workspace_id -> workspaces) and the owner key ((workspace_id, owner_id) ->
-- memberships, whose workspace_id references workspaces). Both columns are NOT NULL, so the owner
-- key alone already guarantees the workspace; the workspace key is dropped (measured: about 5 % of
-- an import's insert; each check is a small query). Its one other duty, ON DELETE CASCADE, moves to
-- a trigger on workspaces: the records go first (deals and contacts before companies, so no
-- company_id is set to null on the way), then the memberships go by their own cascade.
alter table crm.contacts drop constraint contacts_workspace_id_fkey;
alter table crm.companies drop constraint companies_workspace_id_fkey;
alter table crm.deals drop constraint deals_workspace_id_fkey;

create function crm.tg_workspaces__delete_records() returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  -- Their outbox triggers write *.deleted events, which the workspace's own cascade then removes.
  delete from crm.deals d where d.workspace_id = old.id;
  delete from crm.contacts c where c.workspace_id = old.id;
  delete from crm.companies c where c.workspace_id = old.id;
  return old;
end
$$;
comment on function crm.tg_workspaces__delete_records() is
  'Deletes a workspace''s deals, contacts and companies before the workspace itself (what the workspace foreign keys'' ON DELETE CASCADE did; their owner keys now prove the workspace exists).';
create trigger tg_workspaces__delete_records before delete on crm.workspaces
  for each row execute function crm.tg_workspaces__delete_records();
