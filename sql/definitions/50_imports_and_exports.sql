-- Imports and exports: imports, their staged rows and errors, the steps of the import job, CSV cells
-- for exports.
-- Applied by `crm migrate` whenever a file of sql/definitions/ changes, as a whole and in file order
-- (sql/CONVENTIONS.md): edit the definition here; it is the only one.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.queue_import(
  p_import_id uuid,
  p_mapping jsonb,
  p_mode text,
  p_match_on text,
  p_dry_run boolean,
  p_token_id uuid
)
 returns void
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_context record := crm.verified_context();
  v_workspace uuid := v_context.workspace_id;
  v_record_type text;
  v_status text;
  v_dry_run boolean;
  v_available boolean;
begin
  -- The token named must be the caller's own, live, with the scopes and app the context proves:
  -- the import is bound to the credential the request came with.
  if not exists (select from crm.tokens t
                  where t.id = p_token_id and t.user_id = v_context.user_id
                    and t.revoked_at is null and t.expires_at > now()
                    and t.scopes is not distinct from v_context.scopes
                    and t.oauth_app_id is not distinct from v_context.oauth_app_id) then
    raise exception 'the token of this request is not the caller''s' using errcode = 'CR401', hint = 'token_invalid';
  end if;
  select i.record_type, i.status, i.dry_run, (i.staged or i.file_bytes is not null)
    into v_record_type, v_status, v_dry_run, v_available
    from crm.imports i
   where i.workspace_id = v_workspace and i.id = p_import_id and i.user_id = v_context.user_id
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
         failure = null, failure_code = null, queued_at = now(), started_at = null, finished_at = null,
         token_scopes = v_context.scopes, oauth_app_id = v_context.oauth_app_id, token_id = p_token_id
   where i.workspace_id = v_workspace and i.id = p_import_id;
  perform graphile_worker.add_job('process_import',
    json_build_object('workspace_id', v_workspace, 'import_id', p_import_id),
    max_attempts => 5, job_key => 'process_import:' || p_import_id::text);
end
$function$;
comment on function crm.queue_import(
  p_import_id uuid,
  p_mapping jsonb,
  p_mode text,
  p_match_on text,
  p_dry_run boolean,
  p_token_id uuid
) is
  'Starts an import: checks the import grant (and update for upsert) of the caller, records the options, the token '
  '(which must be the caller''s own, live, with the proven scopes and app) and its scopes and app, and adds the '
  'process_import job in the same transaction.';
grant execute
  on function crm.queue_import(
    p_import_id uuid,
    p_mapping jsonb,
    p_mode text,
    p_match_on text,
    p_dry_run boolean,
    p_token_id uuid
  )
  to crm_api;

create or replace function crm.import_to_process(p_workspace_id uuid, p_import_id uuid)
 returns table(user_id uuid, status text, staged boolean, delimiter text, file_size double precision, has_file boolean)
 language sql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select i.user_id, i.status, i.staged, i.delimiter, i.file_size::float8, i.file_bytes is not null
    from crm.imports i where i.workspace_id = p_workspace_id and i.id = p_import_id
$function$;
comment on function crm.import_to_process(p_workspace_id uuid, p_import_id uuid) is
  'Worker only: the state of an import its job needs (never the file itself).';
grant execute on function crm.import_to_process(p_workspace_id uuid, p_import_id uuid) to crm_worker;

create or replace function crm.import_file_slice(
  p_workspace_id uuid,
  p_import_id uuid,
  p_from integer,
  p_length integer
)
 returns text
 language sql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select encode(substring(i.file_bytes from p_from for p_length), 'base64')
    from crm.imports i where i.workspace_id = p_workspace_id and i.id = p_import_id
$function$;
comment on function crm.import_file_slice(p_workspace_id uuid, p_import_id uuid, p_from integer, p_length integer) is
  'Worker only: p_length bytes of an import''s file from byte p_from (1-based), base64.';
grant execute on function crm.import_file_slice(p_workspace_id uuid, p_import_id uuid, p_from integer, p_length integer)
  to crm_worker;

create or replace function crm.mark_import_staged(p_workspace_id uuid, p_import_id uuid)
 returns void
 language sql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  update crm.imports i set staged = true where i.workspace_id = p_workspace_id and i.id = p_import_id
$function$;
comment on function crm.mark_import_staged(p_workspace_id uuid, p_import_id uuid) is
  'Worker only: every record of the import''s file is in crm.import_rows.';
grant execute on function crm.mark_import_staged(p_workspace_id uuid, p_import_id uuid) to crm_worker;

create or replace function crm.begin_import_batch(p_workspace_id uuid, p_import_id uuid)
 returns table(
   status text,
   record_type text,
   columns text[],
   mapping jsonb,
   mode text,
   match_on text,
   dry_run boolean,
   last_row_done integer
 )
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_user uuid;
  v_scopes text[];
  v_app uuid;
  v_token uuid;
  v_withdrawn text;
begin
  -- Column by column: never drags the file (file_bytes) into the function.
  select i.user_id, i.token_scopes, i.oauth_app_id, i.token_id, i.status, i.record_type, i.columns, i.mapping, i.mode, i.match_on, i.dry_run, i.last_row_done
    into v_user, v_scopes, v_app, v_token, status, record_type, columns, mapping, mode, match_on, dry_run, last_row_done
    from crm.imports i where i.workspace_id = p_workspace_id and i.id = p_import_id
     for update;
  if not found then
    raise exception 'no such import' using errcode = 'CR404', hint = 'not_found';
  end if;
  if not exists (select from crm.memberships m join crm.users u on u.id = m.user_id
                  where m.workspace_id = p_workspace_id and m.user_id = v_user
                    and m.suspended_at is null and u.suspended_at is null) then
    raise exception 'the importing member is suspended or has left the workspace' using errcode = 'CR403', hint = 'member_inactive';
  end if;
  -- The credential that queued the import, as crm.authenticate judges a request's: a revoked
  -- grant first (it revokes its tokens too, and is the cause), then the token (gone or revoked),
  -- then API access (tokens and app tokens; a UI session is not an API credential). Expiry does
  -- not stop an import: it was started while the token was valid, and nobody withdrew it.
  select case
           when g.revoked_at is not null then 'grant_revoked'
           when v_token is not null and (t.id is null or t.revoked_at is not null) then 'token_revoked'
           when coalesce(t.kind, 'token') in ('token', 'oauth') and not u.api_access then 'api_access_disabled'
         end
    into v_withdrawn
    from crm.users u
    left join crm.tokens t on t.id = v_token and t.user_id = u.id
    left join crm.oauth_grants g on g.workspace_id = t.workspace_id and g.id = t.oauth_grant_id
   where u.id = v_user;
  if v_withdrawn = 'grant_revoked' then
    raise exception 'the app connection that started this import was revoked' using errcode = 'CR403', hint = v_withdrawn;
  elsif v_withdrawn = 'token_revoked' then
    raise exception 'the token that started this import was revoked' using errcode = 'CR403', hint = v_withdrawn;
  elsif v_withdrawn = 'api_access_disabled' then
    raise exception 'the importing user''s API access was turned off' using errcode = 'CR403', hint = v_withdrawn;
  end if;
  perform crm.set_context(v_user, p_workspace_id, 'import', v_scopes, v_app);
  perform set_config('crm.import_id', p_import_id::text, true);
  perform set_config('crm.import_proof', crm.import_proof(p_import_id), true);
  if crm.grant_scope(record_type, 'import') is null then
    raise exception 'the importing member''s role has no % import grant', record_type using errcode = 'CR403', hint = 'import_grant_missing';
  end if;
  if mode = 'upsert' and crm.grant_scope(record_type, 'update') is null then
    raise exception 'the importing member''s role has no % update grant (needed for upsert)', record_type using errcode = 'CR403', hint = 'import_grant_missing';
  end if;
  if status = 'queued' then
    update crm.imports i set status = 'processing', started_at = coalesce(i.started_at, now())
     where i.workspace_id = p_workspace_id and i.id = p_import_id;
    status := 'processing';
  end if;
  return next;
end
$function$;
comment on function crm.begin_import_batch(p_workspace_id uuid, p_import_id uuid) is
  'Worker only: opens an import batch as the importing user (via import, within the scopes of the token that queued '
  'it), after checking membership, the token that queued it (not revoked, its OAuth grant not revoked, API access on) '
  'and grants; locks the import row. Refusals are CR403 with the failure code as hint.';
grant execute on function crm.begin_import_batch(p_workspace_id uuid, p_import_id uuid) to crm_worker;

create or replace function crm.finish_import_batch(
  p_import_id uuid,
  p_expected_last_row integer,
  p_last_row integer,
  p_counts jsonb,
  p_errors jsonb
)
 returns void
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.finish_import_batch(
  p_import_id uuid,
  p_expected_last_row integer,
  p_last_row integer,
  p_counts jsonb,
  p_errors jsonb
) is
  'Records a batch''s errors and counts and advances last_row_done (only from the expected mark: a concurrent run '
  'fails with 40001).';
grant execute
  on function crm.finish_import_batch(
    p_import_id uuid,
    p_expected_last_row integer,
    p_last_row integer,
    p_counts jsonb,
    p_errors jsonb
  )
  to crm_api;

create or replace function crm.complete_import(
  p_workspace_id uuid,
  p_import_id uuid,
  p_status text,
  p_failure text,
  p_failure_code text default NULL::text
)
 returns void
 language sql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  update crm.imports set status = p_status, failure = p_failure, failure_code = p_failure_code, finished_at = now()
   where workspace_id = p_workspace_id and id = p_import_id;
  -- After a real run only the rows errors.csv needs are kept; a dry run keeps all for the real run.
  delete from crm.import_rows r
   using crm.imports i
   where i.workspace_id = p_workspace_id and i.id = p_import_id and p_status = 'completed' and not i.dry_run
     and r.workspace_id = i.workspace_id and r.import_id = i.id
     and not exists (select from crm.import_errors e where e.workspace_id = r.workspace_id and e.import_id = r.import_id and e.row = r.row);
$function$;
comment on function crm.complete_import(
  p_workspace_id uuid,
  p_import_id uuid,
  p_status text,
  p_failure text,
  p_failure_code text
) is
  'Worker only: ends an import (completed or failed, with the failure''s message and code) and drops staged rows no '
  'longer needed.';
grant execute
  on function crm.complete_import(
    p_workspace_id uuid,
    p_import_id uuid,
    p_status text,
    p_failure text,
    p_failure_code text
  )
  to crm_worker;

create or replace function crm.prune_imports(log_retention_days integer)
 returns bigint
 language sql
as $function$
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
$function$;
comment on function crm.prune_imports(log_retention_days integer) is
  'Removes import files and staged rows 7 days after upload, and imports with their errors after the log retention '
  '(at least 7 days).';

create or replace function crm.import_cell(value text)
 returns text
 language sql
 immutable parallel safe
return NULLIF(
         CASE
           WHEN left(btrim(value), 1) = ''''::text
            AND left(ltrim(btrim(value), ''''::text), 1) IN ('='::text, '+'::text, '-'::text, '@'::text, E'\t'::text, E'\r'::text)
             THEN substr(btrim(value), 2)
           ELSE btrim(value)
         END,
         ''::text);
comment on function crm.import_cell(value text) is
  'An imported cell as the import reads it: trimmed of spaces, empty is null, and the export''s formula guard '
  '(crm.csv_text_cell: one leading '' before any number of '' and then =, +, -, @, a tab or a carriage return) '
  'taken off, so an export imports back unchanged.';
grant execute on function crm.import_cell(value text) to crm_api;

create or replace function crm.import_json_object(value text)
 returns jsonb
 language plpgsql
 immutable parallel safe
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  -- An exception block, not pg_input_is_valid: that needs PostgreSQL 16, and 15 is supported.
  return case when jsonb_typeof(value::jsonb) = 'object' then value::jsonb end;
exception when invalid_text_representation then
  return null;
end
$function$;
comment on function crm.import_json_object(value text) is
  'An imported custom_fields cell (the export''s JSON object column) as jsonb; null when it is not a JSON object.';
grant execute on function crm.import_json_object(value text) to crm_api;

create or replace function crm.import_key(p_kind text, p_value text)
 returns text
 language sql
 immutable parallel safe
return CASE p_kind
            WHEN 'email'::text THEN lower(crm.import_cell(p_value))
            WHEN 'domain'::text THEN rtrim(lower(crm.import_cell(p_value)), '.'::text)
            WHEN 'id'::text THEN CASE
            WHEN (
              crm.import_cell(
                p_value) ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'::text) THEN lower(crm.import_cell(p_value))
            ELSE NULL::text END
            ELSE NULL::text
       END;
comment on function crm.import_key(p_kind text, p_value text) is
  'The match key of a cell as an import compares it: email lower-case, domain lower-case without a trailing dot, id a '
  'canonical UUID (anything else has no key).';
grant execute on function crm.import_key(p_kind text, p_value text) to crm_api;

create or replace function crm.mark_import_repeats(p_workspace_id uuid, p_import_id uuid, p_kind text, p_column integer)
 returns integer
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
 set enable_nestloop to 'off'
as $function$
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
$function$;
comment on function crm.mark_import_repeats(p_workspace_id uuid, p_import_id uuid, p_kind text, p_column integer) is
  'Worker only: marks every staged row whose match key (crm.import_key of cell p_column) repeats an earlier row of '
  'the file, clearing the marks of a previous run first (no nested loop: linear whatever the statistics of '
  'crm.import_rows say).';
grant execute on function crm.mark_import_repeats(p_workspace_id uuid, p_import_id uuid, p_kind text, p_column integer)
  to crm_worker;

create or replace function crm.clear_import_rows(p_workspace_id uuid, p_import_id uuid)
 returns void
 language sql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  delete from crm.import_rows r where r.workspace_id = p_workspace_id and r.import_id = p_import_id
$function$;
comment on function crm.clear_import_rows(p_workspace_id uuid, p_import_id uuid) is
  'Worker only: removes an import''s staged rows before it is staged again.';
grant execute on function crm.clear_import_rows(p_workspace_id uuid, p_import_id uuid) to crm_worker;

create or replace function crm.import_date(value text)
 returns date
 language sql
 immutable parallel safe
as $function$
  select case
    when value ~ '^\d{4}-\d{2}-\d{2}$'
         and substr(value, 1, 4)::integer between 1000 and 9999
         and substr(value, 6, 2)::integer between 1 and 12
         and substr(value, 9, 2)::integer between 1 and
             extract(day from (make_date(substr(value, 1, 4)::integer, substr(value, 6, 2)::integer, 1) + interval '1 month - 1 day'))::integer
    then value::date
  end
$function$;
comment on function crm.import_date(value text) is
  'Parses YYYY-MM-DD; null for anything else (imports report it as a row error).';
grant execute on function crm.import_date(value text) to crm_api;

create or replace function crm.import_check_constraints(p_record_type text)
 returns integer
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.import_check_constraints(p_record_type text) is
  'Imports: reports every row of pg_temp.import_typed that a CHECK constraint of the target table would refuse (one '
  'scan for all of them).';
grant execute on function crm.import_check_constraints(p_record_type text) to crm_api;

create or replace function crm.import_constraint_message(p_constraint text, p_field text)
 returns text
 language sql
 immutable parallel safe
as $function$
  select case
    when p_constraint like '%\_name\_or\_email' then 'needs a first name, a last name or an email'
    when p_constraint like '%\_length' then p_field || ' is empty or too long'
    when p_constraint like '%\_format' then p_field || ' is not in a valid format'
    when p_constraint like '%\_custom\_fields\_check' then 'custom_fields are invalid (at most 50 keys)'
    when p_constraint like '%\_check' then p_field || ' is out of range'
    else p_field || ' is invalid (' || p_constraint || ')'
  end
$function$;
comment on function crm.import_constraint_message(p_constraint text, p_field text) is
  'A readable message for a constraint an import row breaks.';
grant execute on function crm.import_constraint_message(p_constraint text, p_field text) to crm_api;

create or replace function crm.non_member_ids(p_user_ids uuid[])
 returns uuid[]
 language sql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select array(
    select distinct u.id from unnest(p_user_ids) as u (id)
     where u.id is not null
       and not exists (select from crm.memberships m where m.workspace_id = (select crm.current_workspace_id()) and m.user_id = u.id)
     order by u.id)
$function$;
comment on function crm.non_member_ids(p_user_ids uuid[]) is
  'The ids among p_user_ids (nulls left out) that are not members of the current workspace (all of them without a '
  'proven context).';
grant execute on function crm.non_member_ids(p_user_ids uuid[]) to crm_api;

create or replace function crm.owners_outside_scope(p_resource text, p_action text, p_owner_ids uuid[])
 returns uuid[]
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.owners_outside_scope(p_resource text, p_action text, p_owner_ids uuid[]) is
  'The owners among p_owner_ids (nulls left out) whose records the current member''s resource:action scope does not '
  'cover: none for all, every one without a grant.';
grant execute on function crm.owners_outside_scope(p_resource text, p_action text, p_owner_ids uuid[]) to crm_api;

create or replace function crm.csv_text_cell(value text)
 returns text
 language sql
 immutable parallel safe
as $function$
  -- strpos, not a regular expression: a plain search is faster per cell.
  select case
    when value is null then ''
    -- ltrim: a text that already looks guarded ('=...) gets one ' more, so the import, which takes one ' off
    -- (crm.import_cell), reads every text back exactly.
    when left(value, 1) in ('=', '+', '-', '@', E'\t', E'\r')
      or (left(value, 1) = '''' and left(ltrim(value, ''''), 1) in ('=', '+', '-', '@', E'\t', E'\r')) then
      case
        when strpos(value, '"') > 0 or strpos(value, ',') > 0 or strpos(value, E'\n') > 0 or strpos(value, E'\r') > 0
          then '"''' || replace(value, '"', '""') || '"'
        else '''' || value
      end
    when strpos(value, '"') > 0 or strpos(value, ',') > 0 or strpos(value, E'\n') > 0 or strpos(value, E'\r') > 0
      then '"' || replace(value, '"', '""') || '"'
    else value
  end
$function$;
comment on function crm.csv_text_cell(value text) is
  'One CSV text cell: a leading '' before =, +, -, @, a tab or a carriage return (a spreadsheet would run it as a '
  'formula) or before a text that already begins with '' and then one of those (so crm.import_cell reads it back '
  'exactly), then RFC 4180 quoting; null is empty.';
grant execute on function crm.csv_text_cell(value text) to crm_api;

comment on table crm.imports is 'One uploaded CSV file and the import job run on it (docs/api.md section 6).';
comment on column crm.imports.file_bytes is 'The uploaded file as sent (BOM included); null once pruned.';
comment on column crm.imports.staged is 'Every record of the file is in crm.import_rows.';
comment on column crm.imports.last_row_done is
  'Progress: every data row up to this number is landed or reported, committed with the counts.';
comment on column crm.imports.token_scopes is
  'The scopes of the token that queued the import (null: unscoped); its batches land within them.';
comment on column crm.imports.oauth_app_id is
  'The OAuth app through which the import was queued, if any (its events name the app).';
comment on column crm.imports.token_id is
  'The token that queued the import (crm.queue_import); every batch stops the import once it is revoked, its OAuth '
  'grant revoked, or its user''s API access off. Null for imports queued before this column.';
comment on column crm.imports.failure_code is
  'Why a failed import stopped, as an API error code (token_revoked, grant_revoked, api_access_disabled, '
  'member_inactive, import_grant_missing, import_file_invalid), or null.';
create policy imports_all_owner on crm.imports as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy imports_all_owner on crm.imports is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy imports_insert_with_grant on crm.imports as permissive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (user_id = ( SELECT crm.current_user_id() AS current_user_id))
     AND (crm.grant_scope(record_type, 'import'::text) IS NOT NULL))
  );
comment on policy imports_insert_with_grant on crm.imports is 'Uploading needs the import grant on the record type.';
create policy imports_select_own_or_admin on crm.imports as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((user_id = ( SELECT crm.current_user_id() AS current_user_id)) OR ( SELECT crm.is_admin() AS is_admin))
     AND crm.scopes_cover(( SELECT crm.current_scopes() AS current_scopes), record_type, 'import'::text))
  );
comment on policy imports_select_own_or_admin on crm.imports is
  'An import is seen by the member who uploaded it and by admins; by a scoped token only with write on its record '
  'type.';
grant select (workspace_id, id, user_id, record_type, file_name, file_size, delimiter, columns, row_count, sample_rows, suggested_mapping, status, mapping, mode, match_on, dry_run, last_row_done, created, updated, skipped, failed, companies_created, failure, created_at, queued_at, started_at, finished_at, failure_code)
  on crm.imports
  to crm_api;
grant insert (record_type, file_name, file_bytes, file_size, delimiter, columns, row_count, sample_rows, suggested_mapping)
  on crm.imports
  to crm_api;
comment on index crm.imports_created_at is 'crm.prune_imports: files and imports past their retention.';

comment on table crm.import_rows is
  'Every data record of an import file as parsed (row = 1-based data record number); kept for failed rows '
  '(errors.csv) and dry runs.';
comment on column crm.import_rows.user_id is
  'The importing user (copied from crm.imports so the policy needs no join).';
comment on column crm.import_rows.repeat_of is
  'The first row of this file with the same match key, when this row repeats it (crm.mark_import_repeats, once per '
  'run).';
create policy import_rows_all_owner on crm.import_rows as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy import_rows_all_owner on crm.import_rows is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy import_rows_insert_worker on crm.import_rows as permissive for insert to crm_worker
  with check (true);
comment on policy import_rows_insert_worker on crm.import_rows is
  'The import job stages a file''s records (it reads none back: crm_worker has no select policy or grant here).';
create policy import_rows_select_own_or_admin on crm.import_rows as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((user_id = ( SELECT crm.current_user_id() AS current_user_id)) OR ( SELECT crm.is_admin() AS is_admin))
     AND ((( SELECT crm.current_scopes() AS current_scopes) IS NULL)
          OR (EXISTS ( SELECT
                       FROM crm.imports i
                       WHERE ((i.workspace_id = import_rows.workspace_id) AND (i.id = import_rows.import_id))))))
  );
comment on policy import_rows_select_own_or_admin on crm.import_rows is 'Staged rows are seen like their import.';
grant select on crm.import_rows to crm_api;
grant insert on crm.import_rows to crm_worker;

-- A staged row's import exists: the foreign key's guarantee, checked once per statement (migration
-- 000017): the job stages a whole file in one INSERT, which the key checked and locked row by row.
create or replace function crm.tg_import_rows__import_exists()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_imports bigint;
  v_found bigint;
begin
  select count(*) into v_imports from (select distinct n.workspace_id, n.import_id from new_rows n) p;
  if v_imports = 0 then
    return null;
  end if;
  -- Locked as a foreign key's check locks its referenced row: an import being deleted meanwhile is
  -- waited for and then not found, and one not yet deleted cannot be until this transaction ends.
  perform 1 from (select distinct n.workspace_id, n.import_id from new_rows n order by 1, 2) p
   cross join lateral (select i.id from crm.imports i
                        where i.workspace_id = p.workspace_id and i.id = p.import_id for key share) i;
  get diagnostics v_found = row_count;
  if v_found < v_imports then
    raise exception 'a staged import row names an import that does not exist'
      using errcode = 'foreign_key_violation', schema = 'crm', table = 'import_rows',
            constraint = 'import_rows_import_exists';
  end if;
  return null;
end
$function$;
comment on function crm.tg_import_rows__import_exists() is
  'Statement trigger of crm.import_rows: refuses the statement (23503) when a row it inserted or updated names an '
  'import that does not exist, locking each import named FOR KEY SHARE once, as a foreign key would lock it once per '
  'row.';
grant execute on function crm.tg_import_rows__import_exists() to crm_worker;
CREATE TRIGGER tg_import_rows__import_exists_insert AFTER INSERT ON crm.import_rows
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_import_rows__import_exists();
CREATE TRIGGER tg_import_rows__import_exists_update AFTER UPDATE ON crm.import_rows
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_import_rows__import_exists();

create or replace function crm.tg_imports__delete_import_rows()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  delete from crm.import_rows r using old_rows o where r.workspace_id = o.workspace_id and r.import_id = o.id;
  return null;
end
$function$;
comment on function crm.tg_imports__delete_import_rows() is
  'Deletes the staged rows of the imports a statement deleted (the cascade the foreign key of crm.import_rows gave).';
CREATE TRIGGER tg_imports__delete_import_rows AFTER DELETE ON crm.imports
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_imports__delete_import_rows();

comment on table crm.import_errors is 'Why a row was not imported: one line per problem (a row may have several).';
create policy import_errors_all_owner on crm.import_errors as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy import_errors_all_owner on crm.import_errors is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy import_errors_select_own_or_admin on crm.import_errors as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((user_id = ( SELECT crm.current_user_id() AS current_user_id)) OR ( SELECT crm.is_admin() AS is_admin))
     AND ((( SELECT crm.current_scopes() AS current_scopes) IS NULL)
          OR (EXISTS ( SELECT
                       FROM crm.imports i
                       WHERE ((i.workspace_id = import_errors.workspace_id) AND (i.id = import_errors.import_id))))))
  );
comment on policy import_errors_select_own_or_admin on crm.import_errors is 'Errors are seen like their import.';
grant select on crm.import_errors to crm_api;
