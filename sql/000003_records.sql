-- Records: companies, contacts, deals, their deal stages and associations, the outbox of record
-- events, and idempotency keys for POSTs. API.md sections 4, 5 and 8 are the contract.
--
-- Shape of every record table (after CONVENTIONS.md): keys start with workspace_id; owner_id
-- defaults to the caller and is what the policies read; created_by/updated_by/updated_at are kept
-- by triggers, never by the client (crm_api has no column grant on them). One SQL function per type
-- (crm.contact_json, crm.company_json, crm.deal_json) renders the API's JSON, and its jsonb twin
-- (crm.contact_jsonb, ...) renders the same object for the outbox; test/imports/import-speed.test.ts
-- compares both renderings field by field, so a response and a webhook never disagree about a record.
--
-- A record table has no foreign key of its own to crm.workspaces: its owner key ((workspace_id,
-- owner_id) -> memberships, whose workspace_id references workspaces) already proves that the
-- workspace exists, both columns being NOT NULL, and each foreign-key check is a small query per
-- row (measured: a second one cost about 5 % of an import's insert). The cascade when a workspace
-- is deleted is crm.tg_workspaces__delete_records.

-- Transaction-local limits, as in every migration: waiting long for a lock would hold up every
-- query queued behind the migration, and no statement here should run for long.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- ---------------------------------------------------------------------------------------------
-- Shared helpers
-- ---------------------------------------------------------------------------------------------

-- SQL-standard bodies (RETURN ...): stored parsed, so the planner inlines them without parsing
-- text on every query (measured: planning a one-deal read went from ~150 to ~120 µs as crm_api).
create function crm.api_time(value timestamptz) returns text
language sql stable parallel safe
return to_char(value at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"');
comment on function crm.api_time(timestamptz) is 'A timestamp as the API writes it: RFC 3339, UTC, milliseconds (2026-11-22T03:00:21.123Z). The JSON functions below spell the same to_char out inline (one inlining step less per query).';
grant execute on function crm.api_time(timestamptz) to crm_api;

-- The CHECK on custom_fields. Almost every row (an imported one above all) has no custom fields,
-- so crm.custom_fields_are_valid answers '{}' inline and runs the full check only for a non-empty
-- object. The full check is a SQL function with a subquery, which PostgreSQL cannot inline: every
-- row it checks starts a small executor (measured: about 8 % of an import's insert, and the same
-- again in the import's own constraint pass). crm.custom_fields_are_valid is a single expression,
-- so the planner inlines it into the CHECK; null gives null.
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

create function crm.custom_fields_are_valid(fields jsonb) returns boolean
language sql immutable parallel safe
return fields = '{}'::jsonb or crm.custom_fields_entries_are_valid(fields);
comment on function crm.custom_fields_are_valid(jsonb) is
  'CHECK for custom_fields: an object of at most 50 keys matching ^[a-z][a-z0-9_]{0,62}$ whose values are strings, numbers, booleans or null. The empty object is answered inline (no per-row executor).';

create function crm.digits(value text) returns text
language sql immutable parallel safe
as $$
  select nullif(regexp_replace(value, '[^0-9]', '', 'g'), '')
$$;
comment on function crm.digits(text) is 'The digits of a phone number, so search matches "+1 (555) 010-0199" when given 5550100199.';

-- The fields of an update that changed: the old value of each, bookkeeping fields left out
-- (updated_at and updated_by change on every update and would only be noise).
create function crm.json_changes(before jsonb, after jsonb) returns jsonb
language sql immutable parallel safe
as $$
  select coalesce(jsonb_object_agg(o.key, o.value), '{}'::jsonb)
    from jsonb_each(before) as o
   where o.key not in ('updated_at', 'updated_by')
     and o.value is distinct from after -> o.key
$$;
comment on function crm.json_changes(jsonb, jsonb) is 'previous_attributes of an event: the old value of every field that differs (updated_at/updated_by excluded).';


-- What search matches, one function per type: the expression indexes below and the search
-- queries (src/records/search.ts) must use exactly these calls for the planner to pick the index.
create function crm.company_search_text(name text, domain text, phone text) returns text
language sql immutable parallel safe
as $$
  select lower(coalesce(name, '') || ' ' || coalesce(domain, '') || ' ' || coalesce(crm.digits(phone), ''))
$$;
comment on function crm.company_search_text(text, text, text) is 'The text search matches for a company: name, domain and phone digits, lower-case.';

create function crm.contact_search_text(first_name text, last_name text, email text, phone text) returns text
language sql immutable parallel safe
as $$
  select lower(coalesce(first_name, '') || ' ' || coalesce(last_name, '') || ' ' || coalesce(email, '') || ' ' || coalesce(crm.digits(phone), ''))
$$;
comment on function crm.contact_search_text(text, text, text, text) is 'The text search matches for a contact: names, email and phone digits, lower-case.';

create function crm.deal_search_text(name text) returns text
language sql immutable parallel safe
as $$
  select lower(name)
$$;
comment on function crm.deal_search_text(text) is 'The text search matches for a deal: its name, lower-case.';

grant execute on function crm.custom_fields_are_valid(jsonb), crm.digits(text), crm.json_changes(jsonb, jsonb),
  crm.company_search_text(text, text, text), crm.contact_search_text(text, text, text, text), crm.deal_search_text(text)
  to crm_api;

-- ---------------------------------------------------------------------------------------------
-- The outbox
-- ---------------------------------------------------------------------------------------------

create table crm.events (
  workspace_id uuid not null references crm.workspaces (id) on delete cascade,
  id uuid not null default crm.uuid_v7(),
  event text not null constraint events_event_format check (event ~ '^(contact|company|deal)\.(created|updated|deleted)$'),
  record_type text not null constraint events_record_type_check check (record_type in ('contact', 'company', 'deal')),
  record_id uuid not null,
  occurred_at timestamptz not null default now(),
  data jsonb not null constraint events_data_has_object check (jsonb_typeof(data -> 'object') = 'object'),
  actor jsonb not null constraint events_actor_shape check (actor ->> 'type' in ('user', 'system') and actor ? 'via'),
  primary key (workspace_id, id)
);
-- No policy at all: crm_api has no privilege here. Events are written only by the SECURITY
-- DEFINER triggers below (as the owner, who bypasses RLS) and read by the worker (as the owner).
alter table crm.events enable row level security;
create index events_record on crm.events (workspace_id, record_type, record_id, id);
comment on index crm.events_record is 'A record''s history, newest last (support and tests).';
create index events_occurred_at on crm.events (occurred_at);
comment on index crm.events_occurred_at is 'Housekeeping and replays by time across workspaces.';
comment on table crm.events is
  'The outbox: one row per record change, written by triggers in the writing transaction (API.md section 8). data = {object, previous_attributes?, associations_changed?}; actor = {type, id, via}.';
comment on column crm.events.data is 'object: the record after the change (before it for .deleted) as the API shows it; previous_attributes: old value of each changed field; associations_changed: {contacts: {added, removed}, ...}.';
-- crm.events is keyed (workspace_id, id), but the outbox hands the webhooks worker bare ids.
create index webhook_events_id on crm.events (id);
comment on index crm.webhook_events_id is 'fan_out_event looks events up by id alone (the outbox job carries only ids).';

-- The hand-off to the webhooks worker: one fan_out_event job (workers/fan_out_event.ts) per
-- statement that wrote events. Runs inside the writing transaction, so a rolled-back change adds
-- no job. graphile-worker's own migrations run after ours (src/db/migrate.ts), so this is plpgsql:
-- its body is resolved when it runs, not when it is created.
create function crm.enqueue_event_fan_out(event_ids uuid[]) returns void
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if event_ids is null or cardinality(event_ids) = 0 then
    return;
  end if;
  perform graphile_worker.add_job('fan_out_event', json_build_object('event_ids', event_ids), max_attempts => 25);
end
$$;
comment on function crm.enqueue_event_fan_out(uuid[]) is
  'Called by the outbox triggers with the ids of the events one statement wrote: adds one fan_out_event job for them.';
revoke execute on function crm.enqueue_event_fan_out(uuid[]) from public;

create function crm.event_actor() returns jsonb
language sql stable
as $$
  select case when crm.current_user_id() is null
              then jsonb_build_object('type', 'system', 'id', null, 'via', 'system')
              else jsonb_build_object('type', 'user', 'id', crm.current_user_id(), 'via', coalesce(crm.current_via(), 'api'))
         end
$$;
grant execute on function crm.event_actor() to crm_api;
comment on function crm.event_actor() is 'The actor of an event from the request context: the user and how they came in (api, ui, import), or system.';

-- ---------------------------------------------------------------------------------------------
-- Deal stages
-- ---------------------------------------------------------------------------------------------

create table crm.deal_stages (
  workspace_id uuid not null references crm.workspaces (id) on delete cascade,
  key text not null constraint deal_stages_key_format check (key ~ '^[a-z][a-z0-9_]{0,62}$'),
  label text not null constraint deal_stages_label_length check (length(label) between 1 and 100),
  position integer not null constraint deal_stages_position_check check (position >= 0),
  is_closed boolean not null default false,
  is_won boolean not null default false,
  constraint deal_stages_won_is_closed check (not is_won or is_closed),
  primary key (workspace_id, key),
  constraint deal_stages_position_unique unique (workspace_id, position) deferrable initially deferred
);
alter table crm.deal_stages enable row level security;
-- deal_stages_position_unique also serves "the stages in order" and the first stage lookup.
comment on table crm.deal_stages is 'The pipeline of a workspace, in position order; a deal''s stage is one of these keys.';

create function crm.tg_workspaces__seed_deal_stages() returns trigger
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  insert into crm.deal_stages (workspace_id, key, label, position, is_closed, is_won)
  select n.id, s.key, s.label, s.position, s.is_closed, s.is_won
    from new_workspaces n
   cross join (values ('lead', 'Lead', 0, false, false),
                      ('qualified', 'Qualified', 1, false, false),
                      ('proposal', 'Proposal', 2, false, false),
                      ('negotiation', 'Negotiation', 3, false, false),
                      ('won', 'Won', 4, true, true),
                      ('lost', 'Lost', 5, true, false)) as s (key, label, position, is_closed, is_won);
  return null;
end
$$;
comment on function crm.tg_workspaces__seed_deal_stages() is 'Gives every new workspace the default pipeline: lead, qualified, proposal, negotiation, won, lost.';
create trigger tg_workspaces__seed_deal_stages
  after insert on crm.workspaces referencing new table as new_workspaces
  for each statement execute function crm.tg_workspaces__seed_deal_stages();

create policy deal_stages_select_member on crm.deal_stages for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()));
comment on policy deal_stages_select_member on crm.deal_stages is 'Every member of a workspace sees its pipeline.';
grant select on crm.deal_stages to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Row and statement triggers shared by the record tables
-- ---------------------------------------------------------------------------------------------

-- Raised with SQLSTATE CR422: src/http/database-errors.ts answers 422 with the pointer in DETAIL.
-- Statement-level over the transition tables: one query checks every row a statement wrote (an
-- import batch of 5,000 rows runs the RLS query, and its policy helpers, once instead of 5,000
-- times: measured ~110 µs a row as a row trigger). It runs after the statement's row-level checks, so a
-- company_id that does not exist at all is refused first by the foreign key (also 422, /company_id).
create function crm.tg__assert_company_visible() returns trigger
language plpgsql
as $$
begin
  -- Runs as the caller: RLS decides what "visible" means. The owner (imports' set-up, psql) sees all.
  -- The distinct ids of each workspace are looked up in one pass (= any (array)), never row by row:
  -- a nested loop over a freshly filled companies table whose statistics still say "empty" was
  -- measured at 450 ms for 5,000 rows; this is linear whatever the planner believes.
  if tg_op = 'INSERT' then
    perform from (select n.workspace_id, array_agg(distinct n.company_id) as ids
                    from new_rows n where n.company_id is not null group by n.workspace_id) w
     where cardinality(w.ids) > (select count(*) from crm.companies c where c.workspace_id = w.workspace_id and c.id = any (w.ids))
     limit 1;
  else
    perform from (select n.workspace_id, array_agg(distinct n.company_id) as ids
                    from new_rows n join old_rows o on o.workspace_id = n.workspace_id and o.id = n.id
                   where n.company_id is not null and n.company_id is distinct from o.company_id
                   group by n.workspace_id) w
     where cardinality(w.ids) > (select count(*) from crm.companies c where c.workspace_id = w.workspace_id and c.id = any (w.ids))
     limit 1;
  end if;
  if found then
    raise exception 'company_id must be a company you can see'
      using errcode = 'CR422', hint = 'validation_failed', detail = '/company_id';
  end if;
  return null;
end
$$;
comment on function crm.tg__assert_company_visible() is
  'Statement trigger of contacts and deals: refuses (422, pointer /company_id) the whole statement when a row it inserted, or whose company_id it changed, names a company the caller cannot see.';

-- On INSERT the before-write triggers only normalise (email lower-case, domain lower-case without
-- a trailing dot, a deal's first stage and stage_changed_at = now()); a WHEN clause, evaluated
-- inline, skips the rows already in shape (a PL/pgSQL call per row cost a few per cent of an
-- import). UPDATE keeps an unconditional trigger (it keeps created_* and records updated_by).
-- Trigger names sort tg_*__before_update before tg_*__touch_updated_at, which is the order they
-- fire in.

-- Outbox triggers: one per table and operation, statement-level with transition tables, so an
-- import of 10,000 rows writes its events in one INSERT ... SELECT. SECURITY DEFINER because
-- crm_api has no privilege on crm.events; search_path is pinned.

-- ---------------------------------------------------------------------------------------------
-- Companies
-- ---------------------------------------------------------------------------------------------

create table crm.companies (
  workspace_id uuid not null default crm.current_workspace_id(),
  id uuid not null default crm.uuid_v7(),
  owner_id uuid not null default crm.current_user_id(),
  name text not null constraint companies_name_length check (length(name) between 1 and 255),
  domain text constraint companies_domain_format check (
    length(domain) <= 253
    and domain ~ '^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]([a-z0-9-]{0,61}[a-z0-9])?$'),
  website text constraint companies_website_format check (length(website) <= 2048 and website ~* '^https?://[^\s/?#]+[^\s]*$'),
  industry text constraint companies_industry_length check (length(industry) between 1 and 100),
  phone text constraint companies_phone_format check (length(phone) <= 50 and phone ~* '^\+?[0-9 ().\-/]*[0-9][0-9 ().\-/]*( ?(x|ext\.?|#) ?[0-9]{1,10})?$'),
  city text constraint companies_city_length check (length(city) between 1 and 100),
  country text constraint companies_country_length check (length(country) between 1 and 100),
  employee_count integer constraint companies_employee_count_check check (employee_count >= 0),
  annual_revenue numeric(18, 2) constraint companies_annual_revenue_check check (annual_revenue >= 0),
  description text constraint companies_description_length check (length(description) <= 10000),
  custom_fields jsonb not null default '{}'::jsonb constraint companies_custom_fields_check check (crm.custom_fields_are_valid(custom_fields)),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  created_by uuid default crm.current_user_id(),
  updated_by uuid default crm.current_user_id(),
  primary key (workspace_id, id),
  constraint companies_owner_fkey foreign key (workspace_id, owner_id) references crm.memberships (workspace_id, user_id)
);
alter table crm.companies enable row level security;
create index companies_owner on crm.companies (workspace_id, owner_id);
comment on index crm.companies_owner is 'The own/team scope of every companies policy (owner_id = any (...)).';
create index companies_created_at on crm.companies (workspace_id, created_at, id);
comment on index crm.companies_created_at is 'The default list order (created_at, id) and its keyset cursor.';
create index companies_updated_at on crm.companies (workspace_id, updated_at, id);
comment on index crm.companies_updated_at is 'updated_since and sort=updated_at (sync clients).';
create index companies_name on crm.companies (workspace_id, name, id);
comment on index crm.companies_name is 'sort=name and the company_name lookups of imports.';
create unique index companies_domain_unique on crm.companies (workspace_id, domain);
comment on index crm.companies_domain_unique is 'A domain belongs to one company per workspace (API 409 duplicate, pointer /domain); import upserts match on it.';
create index companies_custom_fields on crm.companies using gin (custom_fields jsonb_path_ops);
comment on index crm.companies_custom_fields is 'filter[custom_fields.<key>]=value (containment @>).';
create index companies_search_trigram on crm.companies using gin (crm.company_search_text(name, domain, phone) gin_trgm_ops);
comment on index crm.companies_search_trigram is 'Search: substring and fuzzy (trigram) matches on name, domain and phone digits.';
create index companies_search_words on crm.companies using gin (to_tsvector('simple'::regconfig, crm.company_search_text(name, domain, phone)));
comment on index crm.companies_search_words is 'Search: full-text word and word-prefix matches.';
-- company_name links the company of that name, case-insensitively.
create index companies_name_lower on crm.companies (workspace_id, lower(name));
comment on index crm.companies_name_lower is 'Imports: the company_name pseudo-field finds a company by name, case-insensitively.';

create function crm.tg_companies__before_write() returns trigger
language plpgsql
as $$
begin
  new.domain := rtrim(lower(new.domain), '.');
  if tg_op = 'UPDATE' then
    new.created_at := old.created_at;
    new.created_by := old.created_by;
    if new is distinct from old then
      new.updated_by := crm.current_user_id();
    end if;
  end if;
  return new;
end
$$;
comment on function crm.tg_companies__before_write() is 'Stores domains lower-case without a trailing dot; keeps created_*; records updated_by when something changed.';
create trigger tg_companies__before_insert before insert on crm.companies
  for each row when (new.domain is distinct from rtrim(lower(new.domain), '.'))
  execute function crm.tg_companies__before_write();
create trigger tg_companies__before_update before update on crm.companies
  for each row execute function crm.tg_companies__before_write();
create trigger tg_companies__touch_updated_at before update on crm.companies
  for each row when (old.* is distinct from new.*) execute function crm.tg__touch_updated_at();

create function crm.tg_companies__write_events() returns trigger
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
create trigger tg_companies__events_insert after insert on crm.companies referencing new table as new_rows
  for each statement execute function crm.tg_companies__write_events();
create trigger tg_companies__events_update after update on crm.companies referencing old table as old_rows new table as new_rows
  for each statement execute function crm.tg_companies__write_events();
create trigger tg_companies__events_delete after delete on crm.companies referencing old table as old_rows
  for each statement execute function crm.tg_companies__write_events();

comment on table crm.companies is 'Companies (API.md section 5).';

-- Record policies (CONVENTIONS.md: select=view, insert=create on the new owner, update=update on
-- the old row and the new one, delete=delete; helpers evaluated once per statement), the same for
-- companies, contacts and deals.
--
-- Inside an import, the import grant decides whose records may be created (API.md section 4):
-- a permissive policy lets an import insert with the import grant, and a restrictive one holds
-- every insert of an import to the import scope, whatever the create grant says.
--
-- An import picks each new record's id before inserting (uuid_v7, or the file's own id in an upsert
-- on id, so an export re-imported into an empty workspace keeps its ids): that is how a batch maps
-- the rows it inserted back to their file rows, set-wise. The API's create never sends id.
--
-- The column defaults workspace_id, created_by and updated_by call the HMAC-checking context
-- helpers once per row (measured: about 170 µs a row, half of an import's insert time). An import
-- sends the values instead, computed once per statement; the restrictive *_insert_own_bookkeeping
-- policies (InitPlans, once per statement too) make sure nobody can send anything but the caller's
-- own context.
create policy companies_select_scoped on crm.companies for select to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and ((select crm.grant_scope('companies', 'view')) = 'all' or owner_id = any ((select crm.scope_owner_ids('companies', 'view'))::uuid[])));
comment on policy companies_select_scoped on crm.companies is 'companies:view: all, or the owners the own/team scope covers.';
create policy companies_select_created_now on crm.companies for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and created_by = (select crm.current_user_id()) and created_at = now());
comment on policy companies_select_created_now on crm.companies is 'A caller sees the rows it created in this same transaction (now() is the transaction start), so a create grant without view still answers 201 with the record; nothing else.';
create policy companies_insert_scoped on crm.companies for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id())
              and ((select crm.grant_scope('companies', 'create')) = 'all' or owner_id = any ((select crm.scope_owner_ids('companies', 'create'))::uuid[])));
comment on policy companies_insert_scoped on crm.companies is 'companies:create: the new owner must be within the scope.';
create policy companies_update_scoped on crm.companies for update to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and ((select crm.grant_scope('companies', 'update')) = 'all' or owner_id = any ((select crm.scope_owner_ids('companies', 'update'))::uuid[])))
  with check (workspace_id = (select crm.current_workspace_id())
              and ((select crm.grant_scope('companies', 'update')) = 'all' or owner_id = any ((select crm.scope_owner_ids('companies', 'update'))::uuid[])));
comment on policy companies_update_scoped on crm.companies is 'companies:update on the row before and after (an owner change must stay within the scope).';
create policy companies_delete_scoped on crm.companies for delete to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and ((select crm.grant_scope('companies', 'delete')) = 'all' or owner_id = any ((select crm.scope_owner_ids('companies', 'delete'))::uuid[])));
comment on policy companies_delete_scoped on crm.companies is 'companies:delete: all, or the owners the own/team scope covers.';
grant select, delete on crm.companies to crm_api;
grant insert (owner_id, name, domain, website, industry, phone, city, country, employee_count, annual_revenue, description, custom_fields),
      update (owner_id, name, domain, website, industry, phone, city, country, employee_count, annual_revenue, description, custom_fields)
   on crm.companies to crm_api;
create policy companies_insert_import on crm.companies for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.current_import_id()) is not null
              and ((select crm.grant_scope('companies', 'import')) = 'all' or owner_id = any ((select crm.scope_owner_ids('companies', 'import'))::uuid[])));
comment on policy companies_insert_import on crm.companies is 'An import creates companies (rows and company_name links) with companies:import.';
create policy companies_insert_import_scope on crm.companies as restrictive for insert to crm_api
  with check ((select crm.current_import_id()) is null
              or (select crm.grant_scope('companies', 'import')) = 'all' or owner_id = any ((select crm.scope_owner_ids('companies', 'import'))::uuid[]));
comment on policy companies_insert_import_scope on crm.companies is 'Inside an import, the new owner must be within the companies:import scope.';
create policy companies_insert_own_bookkeeping on crm.companies as restrictive for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id())
              and created_by is not distinct from (select crm.current_user_id()) and updated_by is not distinct from (select crm.current_user_id()));
comment on policy companies_insert_own_bookkeeping on crm.companies is 'created_by/updated_by, when sent, are the caller (imports send them to skip per-row defaults).';
grant insert (id) on crm.companies to crm_api;
grant insert (workspace_id, created_by, updated_by) on crm.companies to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Contacts
-- ---------------------------------------------------------------------------------------------

create table crm.contacts (
  workspace_id uuid not null default crm.current_workspace_id(),
  id uuid not null default crm.uuid_v7(),
  owner_id uuid not null default crm.current_user_id(),
  first_name text constraint contacts_first_name_length check (length(first_name) between 1 and 100),
  last_name text constraint contacts_last_name_length check (length(last_name) between 1 and 100),
  email text constraint contacts_email_format check (length(email) <= 254 and email ~ '^[^\s@]+@[^\s@]+\.[^\s@.]+$' and email = lower(email)),
  phone text constraint contacts_phone_format check (length(phone) <= 50 and phone ~* '^\+?[0-9 ().\-/]*[0-9][0-9 ().\-/]*( ?(x|ext\.?|#) ?[0-9]{1,10})?$'),
  job_title text constraint contacts_job_title_length check (length(job_title) between 1 and 200),
  city text constraint contacts_city_length check (length(city) between 1 and 100),
  country text constraint contacts_country_length check (length(country) between 1 and 100),
  company_id uuid,
  custom_fields jsonb not null default '{}'::jsonb constraint contacts_custom_fields_check check (crm.custom_fields_are_valid(custom_fields)),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  created_by uuid default crm.current_user_id(),
  updated_by uuid default crm.current_user_id(),
  primary key (workspace_id, id),
  constraint contacts_name_or_email check (first_name is not null or last_name is not null or email is not null),
  constraint contacts_owner_fkey foreign key (workspace_id, owner_id) references crm.memberships (workspace_id, user_id),
  constraint contacts_company_fkey foreign key (workspace_id, company_id) references crm.companies (workspace_id, id) on delete set null (company_id)
);
alter table crm.contacts enable row level security;
create index contacts_owner on crm.contacts (workspace_id, owner_id);
comment on index crm.contacts_owner is 'The own/team scope of every contacts policy (owner_id = any (...)).';
create index contacts_created_at on crm.contacts (workspace_id, created_at, id);
comment on index crm.contacts_created_at is 'The default list order (created_at, id) and its keyset cursor.';
create index contacts_updated_at on crm.contacts (workspace_id, updated_at, id);
comment on index crm.contacts_updated_at is 'updated_since and sort=updated_at (sync clients).';
create index contacts_company on crm.contacts (workspace_id, company_id);
comment on index crm.contacts_company is 'filter[company_id] and the ON DELETE SET NULL when a company is deleted.';
create index contacts_last_name on crm.contacts (workspace_id, last_name, id);
comment on index crm.contacts_last_name is 'sort=last_name.';
create unique index contacts_email_unique on crm.contacts (workspace_id, email);
comment on index crm.contacts_email_unique is 'An email belongs to one contact per workspace (API 409 duplicate, pointer /email); import upserts match on it.';
create index contacts_custom_fields on crm.contacts using gin (custom_fields jsonb_path_ops);
comment on index crm.contacts_custom_fields is 'filter[custom_fields.<key>]=value (containment @>).';
create index contacts_search_trigram on crm.contacts using gin (crm.contact_search_text(first_name, last_name, email, phone) gin_trgm_ops);
comment on index crm.contacts_search_trigram is 'Search: substring and fuzzy (trigram) matches on names, email and phone digits.';
create index contacts_search_words on crm.contacts using gin (to_tsvector('simple'::regconfig, crm.contact_search_text(first_name, last_name, email, phone)));
comment on index crm.contacts_search_words is 'Search: full-text word and word-prefix matches.';

create function crm.tg_contacts__before_write() returns trigger
language plpgsql
as $$
begin
  new.email := lower(new.email);
  if tg_op = 'UPDATE' then
    new.created_at := old.created_at;
    new.created_by := old.created_by;
    if new is distinct from old then
      new.updated_by := crm.current_user_id();
    end if;
  end if;
  return new;
end
$$;
comment on function crm.tg_contacts__before_write() is 'Stores emails lower-case; keeps created_*; records updated_by when something changed (the company check is tg__assert_company_visible, per statement).';
create trigger tg_contacts__before_insert before insert on crm.contacts
  for each row when (new.email is distinct from lower(new.email))
  execute function crm.tg_contacts__before_write();
create trigger tg_contacts__before_update before update on crm.contacts
  for each row execute function crm.tg_contacts__before_write();
create trigger tg_contacts__touch_updated_at before update on crm.contacts
  for each row when (old.* is distinct from new.*) execute function crm.tg__touch_updated_at();
create trigger tg_contacts__company_visible_insert after insert on crm.contacts referencing new table as new_rows
  for each statement execute function crm.tg__assert_company_visible();
create trigger tg_contacts__company_visible_update after update on crm.contacts referencing old table as old_rows new table as new_rows
  for each statement execute function crm.tg__assert_company_visible();

create function crm.tg_contacts__write_events() returns trigger
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
create trigger tg_contacts__events_insert after insert on crm.contacts referencing new table as new_rows
  for each statement execute function crm.tg_contacts__write_events();
create trigger tg_contacts__events_update after update on crm.contacts referencing old table as old_rows new table as new_rows
  for each statement execute function crm.tg_contacts__write_events();
create trigger tg_contacts__events_delete after delete on crm.contacts referencing old table as old_rows
  for each statement execute function crm.tg_contacts__write_events();

comment on table crm.contacts is 'People (API.md section 5); at least one of first name, last name or email.';
comment on column crm.contacts.company_id is 'The contact''s company (a visible one when set through the API); set to null when that company is deleted.';

-- Policies: as companies (above).
create policy contacts_select_scoped on crm.contacts for select to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and ((select crm.grant_scope('contacts', 'view')) = 'all' or owner_id = any ((select crm.scope_owner_ids('contacts', 'view'))::uuid[])));
comment on policy contacts_select_scoped on crm.contacts is 'contacts:view: all, or the owners the own/team scope covers.';
create policy contacts_select_created_now on crm.contacts for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and created_by = (select crm.current_user_id()) and created_at = now());
comment on policy contacts_select_created_now on crm.contacts is 'A caller sees the rows it created in this same transaction (now() is the transaction start), so a create grant without view still answers 201 with the record; nothing else.';
create policy contacts_insert_scoped on crm.contacts for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id())
              and ((select crm.grant_scope('contacts', 'create')) = 'all' or owner_id = any ((select crm.scope_owner_ids('contacts', 'create'))::uuid[])));
comment on policy contacts_insert_scoped on crm.contacts is 'contacts:create: the new owner must be within the scope.';
create policy contacts_update_scoped on crm.contacts for update to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and ((select crm.grant_scope('contacts', 'update')) = 'all' or owner_id = any ((select crm.scope_owner_ids('contacts', 'update'))::uuid[])))
  with check (workspace_id = (select crm.current_workspace_id())
              and ((select crm.grant_scope('contacts', 'update')) = 'all' or owner_id = any ((select crm.scope_owner_ids('contacts', 'update'))::uuid[])));
comment on policy contacts_update_scoped on crm.contacts is 'contacts:update on the row before and after (an owner change must stay within the scope).';
create policy contacts_delete_scoped on crm.contacts for delete to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and ((select crm.grant_scope('contacts', 'delete')) = 'all' or owner_id = any ((select crm.scope_owner_ids('contacts', 'delete'))::uuid[])));
comment on policy contacts_delete_scoped on crm.contacts is 'contacts:delete: all, or the owners the own/team scope covers.';
grant select, delete on crm.contacts to crm_api;
grant insert (owner_id, first_name, last_name, email, phone, job_title, city, country, company_id, custom_fields),
      update (owner_id, first_name, last_name, email, phone, job_title, city, country, company_id, custom_fields)
   on crm.contacts to crm_api;
create policy contacts_insert_import on crm.contacts for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.current_import_id()) is not null
              and ((select crm.grant_scope('contacts', 'import')) = 'all' or owner_id = any ((select crm.scope_owner_ids('contacts', 'import'))::uuid[])));
comment on policy contacts_insert_import on crm.contacts is 'An import creates contacts with contacts:import (the new owner within its scope).';
create policy contacts_insert_import_scope on crm.contacts as restrictive for insert to crm_api
  with check ((select crm.current_import_id()) is null
              or (select crm.grant_scope('contacts', 'import')) = 'all' or owner_id = any ((select crm.scope_owner_ids('contacts', 'import'))::uuid[]));
comment on policy contacts_insert_import_scope on crm.contacts is 'Inside an import, the new owner must be within the contacts:import scope.';
create policy contacts_insert_own_bookkeeping on crm.contacts as restrictive for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id())
              and created_by is not distinct from (select crm.current_user_id()) and updated_by is not distinct from (select crm.current_user_id()));
comment on policy contacts_insert_own_bookkeeping on crm.contacts is 'created_by/updated_by, when sent, are the caller (imports send them to skip per-row defaults).';
grant insert (id) on crm.contacts to crm_api;
grant insert (workspace_id, created_by, updated_by) on crm.contacts to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Deals
-- ---------------------------------------------------------------------------------------------

create table crm.deals (
  workspace_id uuid not null default crm.current_workspace_id(),
  id uuid not null default crm.uuid_v7(),
  owner_id uuid not null default crm.current_user_id(),
  name text not null constraint deals_name_length check (length(name) between 1 and 255),
  amount numeric(18, 2) constraint deals_amount_check check (amount >= 0),
  currency text not null default 'USD' constraint deals_currency_format check (currency ~ '^[A-Z]{3}$'),
  stage text not null,
  stage_changed_at timestamptz not null default now(),
  close_date date,
  company_id uuid,
  custom_fields jsonb not null default '{}'::jsonb constraint deals_custom_fields_check check (crm.custom_fields_are_valid(custom_fields)),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  created_by uuid default crm.current_user_id(),
  updated_by uuid default crm.current_user_id(),
  primary key (workspace_id, id),
  constraint deals_owner_fkey foreign key (workspace_id, owner_id) references crm.memberships (workspace_id, user_id),
  constraint deals_stage_fkey foreign key (workspace_id, stage) references crm.deal_stages (workspace_id, key) on update cascade,
  constraint deals_company_fkey foreign key (workspace_id, company_id) references crm.companies (workspace_id, id) on delete set null (company_id)
);
alter table crm.deals enable row level security;
create index deals_owner on crm.deals (workspace_id, owner_id);
comment on index crm.deals_owner is 'The own/team scope of every deals policy (owner_id = any (...)).';
create index deals_created_at on crm.deals (workspace_id, created_at, id);
comment on index crm.deals_created_at is 'The default list order (created_at, id) and its keyset cursor.';
create index deals_updated_at on crm.deals (workspace_id, updated_at, id);
comment on index crm.deals_updated_at is 'updated_since and sort=updated_at (sync clients).';
create index deals_stage on crm.deals (workspace_id, stage, created_at, id);
comment on index crm.deals_stage is 'The pipeline view: filter[stage] in the default order; also the stage foreign key.';
create index deals_amount on crm.deals (workspace_id, amount, id);
comment on index crm.deals_amount is 'sort=-amount and amount ranges.';
create index deals_company on crm.deals (workspace_id, company_id);
comment on index crm.deals_company is 'filter[company_id] and the ON DELETE SET NULL when a company is deleted.';
create index deals_custom_fields on crm.deals using gin (custom_fields jsonb_path_ops);
comment on index crm.deals_custom_fields is 'filter[custom_fields.<key>]=value (containment @>).';
create index deals_search_trigram on crm.deals using gin (crm.deal_search_text(name) gin_trgm_ops);
comment on index crm.deals_search_trigram is 'Search: substring and fuzzy (trigram) matches on the deal name.';
create index deals_search_words on crm.deals using gin (to_tsvector('simple'::regconfig, crm.deal_search_text(name)));
comment on index crm.deals_search_words is 'Search: full-text word and word-prefix matches.';

create function crm.tg_deals__before_write() returns trigger
language plpgsql
as $$
begin
  if new.stage is null then
    select s.key into new.stage from crm.deal_stages s where s.workspace_id = new.workspace_id order by s.position limit 1;
  end if;
  if tg_op = 'INSERT' then
    new.stage_changed_at := now();
  else
    new.created_at := old.created_at;
    new.created_by := old.created_by;
    new.stage_changed_at := case when new.stage is distinct from old.stage then now() else old.stage_changed_at end;
    if new is distinct from old then
      new.updated_by := crm.current_user_id();
    end if;
  end if;
  return new;
end
$$;
comment on function crm.tg_deals__before_write() is 'Defaults the stage to the workspace''s first; keeps stage_changed_at; records updated_by when something changed (the company check is tg__assert_company_visible, per statement).';
create trigger tg_deals__before_insert before insert on crm.deals
  for each row when (new.stage is null or new.stage_changed_at is distinct from now())
  execute function crm.tg_deals__before_write();
create trigger tg_deals__before_update before update on crm.deals
  for each row execute function crm.tg_deals__before_write();
create trigger tg_deals__touch_updated_at before update on crm.deals
  for each row when (old.* is distinct from new.*) execute function crm.tg__touch_updated_at();
create trigger tg_deals__company_visible_insert after insert on crm.deals referencing new table as new_rows
  for each statement execute function crm.tg__assert_company_visible();
create trigger tg_deals__company_visible_update after update on crm.deals referencing old table as old_rows new table as new_rows
  for each statement execute function crm.tg__assert_company_visible();

create function crm.tg_deals__write_events() returns trigger
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
create trigger tg_deals__events_insert after insert on crm.deals referencing new table as new_rows
  for each statement execute function crm.tg_deals__write_events();
create trigger tg_deals__events_update after update on crm.deals referencing old table as old_rows new table as new_rows
  for each statement execute function crm.tg_deals__write_events();
create trigger tg_deals__events_delete after delete on crm.deals referencing old table as old_rows
  for each statement execute function crm.tg_deals__write_events();

comment on table crm.deals is 'Deals (API.md section 5): money in numeric(18,2), the stage one of the workspace''s deal_stages.';
comment on column crm.deals.stage_changed_at is 'When the stage last changed (read-only, kept by tg_deals__before_write).';

-- Policies: as companies (above).
create policy deals_select_scoped on crm.deals for select to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and ((select crm.grant_scope('deals', 'view')) = 'all' or owner_id = any ((select crm.scope_owner_ids('deals', 'view'))::uuid[])));
comment on policy deals_select_scoped on crm.deals is 'deals:view: all, or the owners the own/team scope covers.';
create policy deals_select_created_now on crm.deals for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and created_by = (select crm.current_user_id()) and created_at = now());
comment on policy deals_select_created_now on crm.deals is 'A caller sees the rows it created in this same transaction (now() is the transaction start), so a create grant without view still answers 201 with the record; nothing else.';
create policy deals_insert_scoped on crm.deals for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id())
              and ((select crm.grant_scope('deals', 'create')) = 'all' or owner_id = any ((select crm.scope_owner_ids('deals', 'create'))::uuid[])));
comment on policy deals_insert_scoped on crm.deals is 'deals:create: the new owner must be within the scope.';
create policy deals_update_scoped on crm.deals for update to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and ((select crm.grant_scope('deals', 'update')) = 'all' or owner_id = any ((select crm.scope_owner_ids('deals', 'update'))::uuid[])))
  with check (workspace_id = (select crm.current_workspace_id())
              and ((select crm.grant_scope('deals', 'update')) = 'all' or owner_id = any ((select crm.scope_owner_ids('deals', 'update'))::uuid[])));
comment on policy deals_update_scoped on crm.deals is 'deals:update on the row before and after (an owner change must stay within the scope).';
create policy deals_delete_scoped on crm.deals for delete to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and ((select crm.grant_scope('deals', 'delete')) = 'all' or owner_id = any ((select crm.scope_owner_ids('deals', 'delete'))::uuid[])));
comment on policy deals_delete_scoped on crm.deals is 'deals:delete: all, or the owners the own/team scope covers.';
grant select, delete on crm.deals to crm_api;
grant insert (owner_id, name, amount, currency, stage, close_date, company_id, custom_fields),
      update (owner_id, name, amount, currency, stage, close_date, company_id, custom_fields)
   on crm.deals to crm_api;
create policy deals_insert_import on crm.deals for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.current_import_id()) is not null
              and ((select crm.grant_scope('deals', 'import')) = 'all' or owner_id = any ((select crm.scope_owner_ids('deals', 'import'))::uuid[])));
comment on policy deals_insert_import on crm.deals is 'An import creates deals with deals:import (the new owner within its scope).';
create policy deals_insert_import_scope on crm.deals as restrictive for insert to crm_api
  with check ((select crm.current_import_id()) is null
              or (select crm.grant_scope('deals', 'import')) = 'all' or owner_id = any ((select crm.scope_owner_ids('deals', 'import'))::uuid[]));
comment on policy deals_insert_import_scope on crm.deals is 'Inside an import, the new owner must be within the deals:import scope.';
create policy deals_insert_own_bookkeeping on crm.deals as restrictive for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id())
              and created_by is not distinct from (select crm.current_user_id()) and updated_by is not distinct from (select crm.current_user_id()));
comment on policy deals_insert_own_bookkeeping on crm.deals is 'created_by/updated_by, when sent, are the caller (imports send them to skip per-row defaults).';
grant insert (id) on crm.deals to crm_api;
grant insert (workspace_id, created_by, updated_by) on crm.deals to crm_api;

-- ---------------------------------------------------------------------------------------------
-- JSON shapes (the API's and the outbox's)
-- ---------------------------------------------------------------------------------------------

-- Each is one RETURN expression (SQL-standard body, stored parsed): inlined into the caller's query
-- without re-parsing function text, and the timestamps are crm.api_time's to_char written out so
-- there is no nested function to inline (measured: planning a one-deal read as crm_api went from
-- ~150 to ~125 µs). The rendering stays in exactly one place per type.
create function crm.company_json(c crm.companies) returns json
language sql stable parallel safe
return json_build_object(
    'id', c.id, 'name', c.name, 'domain', c.domain, 'website', c.website, 'industry', c.industry,
    'phone', c.phone, 'city', c.city, 'country', c.country, 'employee_count', c.employee_count,
    'annual_revenue', c.annual_revenue::text, 'description', c.description, 'owner_id', c.owner_id,
    'custom_fields', c.custom_fields,
    'created_at', to_char(c.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'updated_at', to_char(c.updated_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'created_by', c.created_by, 'updated_by', c.updated_by);
comment on function crm.company_json(crm.companies) is 'A company exactly as the API and webhooks show it (money as a decimal string, times in UTC with milliseconds as crm.api_time writes them).';
grant execute on function crm.company_json(crm.companies) to crm_api;

create function crm.contact_json(c crm.contacts) returns json
language sql stable parallel safe
return json_build_object(
    'id', c.id, 'first_name', c.first_name, 'last_name', c.last_name, 'email', c.email,
    'phone', c.phone, 'job_title', c.job_title, 'city', c.city, 'country', c.country,
    'company_id', c.company_id, 'owner_id', c.owner_id, 'custom_fields', c.custom_fields,
    'created_at', to_char(c.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'updated_at', to_char(c.updated_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'created_by', c.created_by, 'updated_by', c.updated_by);
comment on function crm.contact_json(crm.contacts) is 'A contact exactly as the API and webhooks show it (times as crm.api_time writes them).';
grant execute on function crm.contact_json(crm.contacts) to crm_api;

create function crm.deal_json(d crm.deals) returns json
language sql stable parallel safe
return json_build_object(
    'id', d.id, 'name', d.name, 'amount', d.amount::text, 'currency', d.currency, 'stage', d.stage,
    'stage_changed_at', to_char(d.stage_changed_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), 'close_date', d.close_date,
    'company_id', d.company_id, 'owner_id', d.owner_id, 'custom_fields', d.custom_fields,
    'created_at', to_char(d.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'updated_at', to_char(d.updated_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'created_by', d.created_by, 'updated_by', d.updated_by);
comment on function crm.deal_json(crm.deals) is 'A deal exactly as the API and webhooks show it (amount as a decimal string, times as crm.api_time writes them).';
grant execute on function crm.deal_json(crm.deals) to crm_api;

-- The outbox stores jsonb, and rendering json text for jsonb to parse again costs about a third of
-- an event. These render the same object straight into jsonb: the stored value is identical (same
-- keys, same values; jsonb orders keys itself). The API keeps its json functions (key order as
-- documented).
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

-- ---------------------------------------------------------------------------------------------
-- Deleting a workspace
-- ---------------------------------------------------------------------------------------------

-- The records go first (deals and contacts before companies, so no company_id is set to null on
-- the way), then the memberships go by their own cascade.
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
  'Deletes a workspace''s deals, contacts and companies before the workspace itself (the cascade a workspace foreign key would give: the record tables have none, their owner keys prove the workspace exists).';
create trigger tg_workspaces__delete_records before delete on crm.workspaces
  for each row execute function crm.tg_workspaces__delete_records();

-- ---------------------------------------------------------------------------------------------
-- Associations (many-to-many: contact-company, contact-deal, company-deal)
-- ---------------------------------------------------------------------------------------------

create table crm.associations (
  workspace_id uuid not null default crm.current_workspace_id() references crm.workspaces (id) on delete cascade,
  id uuid not null default crm.uuid_v7(),
  contact_id uuid,
  company_id uuid,
  deal_id uuid,
  created_at timestamptz not null default now(),
  created_by uuid default crm.current_user_id(),
  primary key (workspace_id, id),
  constraint associations_links_two check (num_nonnulls(contact_id, company_id, deal_id) = 2),
  constraint associations_contact_fkey foreign key (workspace_id, contact_id) references crm.contacts (workspace_id, id) on delete cascade,
  constraint associations_company_fkey foreign key (workspace_id, company_id) references crm.companies (workspace_id, id) on delete cascade,
  constraint associations_deal_fkey foreign key (workspace_id, deal_id) references crm.deals (workspace_id, id) on delete cascade
);
alter table crm.associations enable row level security;
create unique index associations_contact_company on crm.associations (workspace_id, contact_id, company_id) where deal_id is null;
comment on index crm.associations_contact_company is 'One link per contact and company; a contact''s companies.';
create unique index associations_contact_deal on crm.associations (workspace_id, contact_id, deal_id) where company_id is null;
comment on index crm.associations_contact_deal is 'One link per contact and deal; a contact''s deals.';
create unique index associations_company_deal on crm.associations (workspace_id, company_id, deal_id) where contact_id is null;
comment on index crm.associations_company_deal is 'One link per company and deal; a company''s deals.';
create index associations_company on crm.associations (workspace_id, company_id, contact_id);
comment on index crm.associations_company is 'A company''s contacts, and the cascade when a company is deleted.';
create index associations_deal on crm.associations (workspace_id, deal_id, contact_id, company_id);
comment on index crm.associations_deal is 'A deal''s contacts and companies, and the cascade when a deal is deleted.';
-- associations_contact_company and associations_contact_deal lead with contact_id but are partial,
-- so the contact cascade needs a plain index of its own.
create index associations_contact on crm.associations (workspace_id, contact_id);
comment on index crm.associations_contact is 'The cascade when a contact is deleted.';
comment on table crm.associations is 'Many-to-many links between two records of different types; exactly two of contact_id, company_id, deal_id are set.';

-- A link is visible, creatable and removable when both its ends are visible to the caller; the
-- API also requires update on the record it addresses (it locks that record with an UPDATE).
create policy associations_select_member on crm.associations for select to crm_api
  using (workspace_id = (select crm.current_workspace_id()));
comment on policy associations_select_member on crm.associations is 'Members see links; the API joins each link to the record at its other end, which RLS filters.';
create policy associations_insert_visible on crm.associations for insert to crm_api
  with check (workspace_id = (select crm.current_workspace_id())
              and (contact_id is null or exists (select from crm.contacts c where c.workspace_id = associations.workspace_id and c.id = associations.contact_id))
              and (company_id is null or exists (select from crm.companies c where c.workspace_id = associations.workspace_id and c.id = associations.company_id))
              and (deal_id is null or exists (select from crm.deals d where d.workspace_id = associations.workspace_id and d.id = associations.deal_id)));
comment on policy associations_insert_visible on crm.associations is 'A link may be made only between records the caller can see.';
create policy associations_delete_visible on crm.associations for delete to crm_api
  using (workspace_id = (select crm.current_workspace_id())
         and (contact_id is null or exists (select from crm.contacts c where c.workspace_id = associations.workspace_id and c.id = associations.contact_id))
         and (company_id is null or exists (select from crm.companies c where c.workspace_id = associations.workspace_id and c.id = associations.company_id))
         and (deal_id is null or exists (select from crm.deals d where d.workspace_id = associations.workspace_id and d.id = associations.deal_id)));
comment on policy associations_delete_visible on crm.associations is 'A link may be removed only when the caller can see both its ends (links to hidden records stay).';
grant select, delete on crm.associations to crm_api;
grant insert (contact_id, company_id, deal_id) on crm.associations to crm_api;

-- Association changes are one event for the record the API addressed (API.md section 5), which a
-- trigger on crm.associations cannot know; the API calls this after changing the links.
create function crm.write_associations_changed_event(record_type text, record_id uuid, changes jsonb) returns uuid
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_object jsonb;
  v_id uuid;
begin
  if v_workspace is null or crm.current_user_id() is null then
    raise exception 'no request context' using errcode = '42501';
  end if;
  if jsonb_typeof(changes) <> 'object' or changes = '{}'::jsonb then
    return null;
  end if;
  v_object := case record_type
    when 'contact' then (select crm.contact_json(c)::jsonb from crm.contacts c where c.workspace_id = v_workspace and c.id = record_id)
    when 'company' then (select crm.company_json(c)::jsonb from crm.companies c where c.workspace_id = v_workspace and c.id = record_id)
    when 'deal' then (select crm.deal_json(d)::jsonb from crm.deals d where d.workspace_id = v_workspace and d.id = record_id)
  end;
  if v_object is null then
    raise exception 'no such record' using errcode = 'CR404', hint = 'not_found';
  end if;
  insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
  values (v_workspace, record_type || '.updated', record_type, record_id,
          jsonb_build_object('object', v_object, 'associations_changed', changes), crm.event_actor())
  returning id into v_id;
  perform crm.enqueue_event_fan_out(array[v_id]);
  return v_id;
end
$$;
comment on function crm.write_associations_changed_event(text, uuid, jsonb) is
  'Outbox for association changes: {type}.updated of the addressed record with data.associations_changed. Only for a record of the caller''s workspace.';
revoke execute on function crm.write_associations_changed_event(text, uuid, jsonb) from public;
grant execute on function crm.write_associations_changed_event(text, uuid, jsonb) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Idempotency keys (POST with Idempotency-Key: same user, same workspace, 24 hours)
-- ---------------------------------------------------------------------------------------------

create table crm.idempotency_keys (
  workspace_id uuid not null default crm.current_workspace_id() references crm.workspaces (id) on delete cascade,
  user_id uuid not null default crm.current_user_id(),
  key text not null constraint idempotency_keys_key_length check (length(key) between 1 and 255),
  request_hash text not null,
  response_status integer,
  response_body text,
  response_headers jsonb not null default '{}'::jsonb,
  created_at timestamptz not null default now(),
  expires_at timestamptz not null default now() + interval '24 hours',
  primary key (workspace_id, user_id, key)
);
alter table crm.idempotency_keys enable row level security;
create index idempotency_keys_expires_at on crm.idempotency_keys (expires_at);
comment on index crm.idempotency_keys_expires_at is 'Housekeeping deletes expired keys.';
comment on table crm.idempotency_keys is
  'The first response to a POST with Idempotency-Key, replayed for 24 hours to the same user in the same workspace when the request is the same (request_hash), 409 otherwise.';
comment on column crm.idempotency_keys.response_body is 'The JSON text of the first answer exactly as sent (text, not jsonb, so a replay is byte-identical).';
comment on column crm.idempotency_keys.request_hash is 'sha256 of method, path and the body with sorted keys: the same request sent again hashes the same.';
create policy idempotency_keys_all_own on crm.idempotency_keys for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and user_id = (select crm.current_user_id()))
  with check (workspace_id = (select crm.current_workspace_id()) and user_id = (select crm.current_user_id()));
comment on policy idempotency_keys_all_own on crm.idempotency_keys is 'A caller sees and writes only their own keys in the current workspace (the primary key serves it).';
grant select on crm.idempotency_keys to crm_api;
grant insert (key, request_hash, response_status, response_body, response_headers),
      update (request_hash, response_status, response_body, response_headers, created_at, expires_at)
   on crm.idempotency_keys to crm_api;

-- Housekeeping: crm.housekeeping (000001_foundation.sql) runs every crm.prune_*(integer) function.
create function crm.prune_idempotency_keys(log_retention_days integer) returns bigint
language sql volatile
as $$
  with removed as (delete from crm.idempotency_keys where expires_at <= now() returning 1)
  select count(*) from removed
$$;
comment on function crm.prune_idempotency_keys(integer) is 'Removes idempotency keys past their 24 hours (crm.housekeeping runs it).';
