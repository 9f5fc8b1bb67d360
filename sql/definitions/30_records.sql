-- Records: contacts, companies, deals, deal stages, associations, custom fields, idempotency keys,
-- search.
-- Applied by `crm migrate` whenever a file of sql/definitions/ changes, as a whole and in file order
-- (sql/CONVENTIONS.md): edit the definition here; it is the only one.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.tg__assert_company_visible()
 returns trigger
 language plpgsql
as $function$
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
$function$;
comment on function crm.tg__assert_company_visible() is
  'Statement trigger of contacts and deals: refuses (422, pointer /company_id) the whole statement when a row it '
  'inserted, or whose company_id it changed, names a company the caller cannot see.';
grant execute on function crm.tg__assert_company_visible() to crm_api;

create or replace function crm.tg_contacts__before_write()
 returns trigger
 language plpgsql
as $function$
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
$function$;
comment on function crm.tg_contacts__before_write() is
  'Stores emails lower-case; keeps created_*; records updated_by when something changed (the company check is '
  'tg__assert_company_visible, per statement).';
grant execute on function crm.tg_contacts__before_write() to crm_api;

create or replace function crm.tg_contacts__write_events()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
    ), diffed as materialized ( -- once a row: inlined, the CTE copied json_changes' call into each use
      select c.workspace_id, c.id, jsonb_build_object('object', c.object, 'previous_attributes', crm.json_changes(c.before, c.object)) as data
        from changed c
    ), written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor, changes)
      select d.workspace_id, 'contact.updated', 'contact', d.id, d.data, v_actor, (select h.changes from crm.event_changes('contact.updated', d.data) h)
        from diffed d where d.data -> 'previous_attributes' <> '{}'::jsonb order by d.id
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
$function$;
comment on function crm.tg_contacts__write_events() is
  'Outbox: contact.created/updated/deleted for every row the statement wrote (no event for an update that changed '
  'nothing); objects rendered by crm.contact_jsonb.';
grant execute on function crm.tg_contacts__write_events() to crm_api;

create or replace function crm.contact_json(c crm.contacts)
 returns json
 language sql
 stable parallel safe
return json_build_object('id', (c).id, 'first_name', (c).first_name, 'last_name', (c).last_name, 'email', (c).email,
                         'phone', (c).phone, 'job_title', (c).job_title, 'city', (c).city, 'country', (c).country,
                         'company_id', (c).company_id, 'owner_id', (c).owner_id, 'custom_fields', (c).custom_fields,
                         'created_at',
                         to_char(((c).created_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                         'updated_at',
                         to_char(((c).updated_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                         'created_by', (c).created_by, 'updated_by', (c).updated_by);
comment on function crm.contact_json(c crm.contacts) is
  'A contact exactly as the API and webhooks show it (times as crm.api_time writes them).';
grant execute on function crm.contact_json(c crm.contacts) to crm_api;

create or replace function crm.contact_jsonb(c crm.contacts)
 returns jsonb
 language sql
 stable parallel safe
return jsonb_build_object('id', (c).id, 'first_name', (c).first_name, 'last_name', (c).last_name, 'email', (c).email,
                          'phone', (c).phone, 'job_title', (c).job_title, 'city', (c).city, 'country', (c).country,
                          'company_id', (c).company_id, 'owner_id', (c).owner_id, 'custom_fields', (c).custom_fields,
                          'created_at',
                          to_char(((c).created_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                          'updated_at',
                          to_char(((c).updated_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                          'created_by', (c).created_by, 'updated_by', (c).updated_by);
comment on function crm.contact_jsonb(c crm.contacts) is
  'crm.contact_json(c)::jsonb without the json text in between (the outbox stores jsonb).';
grant execute on function crm.contact_jsonb(c crm.contacts) to crm_api;

create or replace function crm.tg_companies__before_write()
 returns trigger
 language plpgsql
as $function$
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
$function$;
comment on function crm.tg_companies__before_write() is
  'Stores domains lower-case without a trailing dot; keeps created_*; records updated_by when something changed.';
grant execute on function crm.tg_companies__before_write() to crm_api;

create or replace function crm.tg_companies__write_events()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
    ), diffed as materialized ( -- once a row: inlined, the CTE copied json_changes' call into each use
      select c.workspace_id, c.id, jsonb_build_object('object', c.object, 'previous_attributes', crm.json_changes(c.before, c.object)) as data
        from changed c
    ), written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor, changes)
      select d.workspace_id, 'company.updated', 'company', d.id, d.data, v_actor, (select h.changes from crm.event_changes('company.updated', d.data) h)
        from diffed d where d.data -> 'previous_attributes' <> '{}'::jsonb order by d.id
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
$function$;
comment on function crm.tg_companies__write_events() is
  'Outbox: company.created/updated/deleted for every row the statement wrote (no event for an update that changed '
  'nothing); objects rendered by crm.company_jsonb.';
grant execute on function crm.tg_companies__write_events() to crm_api;

create or replace function crm.company_json(c crm.companies)
 returns json
 language sql
 stable parallel safe
return json_build_object('id', (c).id, 'name', (c).name, 'domain', (c).domain, 'website', (c).website, 'industry',
                         (c).industry, 'phone', (c).phone, 'city', (c).city, 'country', (c).country, 'employee_count',
                         (c).employee_count, 'annual_revenue', ((c).annual_revenue)::text, 'description',
                         (c).description, 'owner_id', (c).owner_id, 'custom_fields', (c).custom_fields, 'created_at',
                         to_char(((c).created_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                         'updated_at',
                         to_char(((c).updated_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                         'created_by', (c).created_by, 'updated_by', (c).updated_by);
comment on function crm.company_json(c crm.companies) is
  'A company exactly as the API and webhooks show it (money as a decimal string, times in UTC with milliseconds as '
  'crm.api_time writes them).';
grant execute on function crm.company_json(c crm.companies) to crm_api;

create or replace function crm.company_jsonb(c crm.companies)
 returns jsonb
 language sql
 stable parallel safe
return jsonb_build_object('id', (c).id, 'name', (c).name, 'domain', (c).domain, 'website', (c).website, 'industry',
                          (c).industry, 'phone', (c).phone, 'city', (c).city, 'country', (c).country, 'employee_count',
                          (c).employee_count, 'annual_revenue', ((c).annual_revenue)::text, 'description',
                          (c).description, 'owner_id', (c).owner_id, 'custom_fields', (c).custom_fields, 'created_at',
                          to_char(((c).created_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                          'updated_at',
                          to_char(((c).updated_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                          'created_by', (c).created_by, 'updated_by', (c).updated_by);
comment on function crm.company_jsonb(c crm.companies) is
  'crm.company_json(c)::jsonb without the json text in between (the outbox stores jsonb).';
grant execute on function crm.company_jsonb(c crm.companies) to crm_api;

create or replace function crm.known_deal_stage(p_workspace_id uuid, p_stage text)
 returns text
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if p_stage is null or exists (select from crm.deal_stages s where s.workspace_id = p_workspace_id and s.key = p_stage) then
    return p_stage;
  end if;
  -- The foreign key refuses it too, but its message cannot name the stages the caller may use.
  raise exception using
    errcode = 'CR422',
    message = format('stage must be one of %s',
      (select string_agg(s.key, ', ' order by s.position) from crm.deal_stages s where s.workspace_id = p_workspace_id)),
    detail = '/stage';
end
$function$;
comment on function crm.known_deal_stage(p_workspace_id uuid, p_stage text) is
  'The stage when the workspace has it (or null); else 422 "stage must be one of <its stages>" at /stage. '
  'Called by tg_deals__before_write and by the API''s inserts, which that trigger skips when a stage is given.';
grant execute on function crm.known_deal_stage(p_workspace_id uuid, p_stage text) to crm_api;

create or replace function crm.tg_deals__before_write()
 returns trigger
 language plpgsql
as $function$
begin
  if new.stage is null then
    select s.key into new.stage from crm.deal_stages s where s.workspace_id = new.workspace_id order by s.position limit 1;
  elsif tg_op = 'INSERT' or new.stage is distinct from old.stage then
    perform crm.known_deal_stage(new.workspace_id, new.stage);
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
$function$;
comment on function crm.tg_deals__before_write() is
  'Defaults the stage to the workspace''s first and refuses one it does not have (crm.known_deal_stage); keeps stage_changed_at; records updated_by when something changed '
  '(the company check is tg__assert_company_visible, per statement).';
grant execute on function crm.tg_deals__before_write() to crm_api;

create or replace function crm.tg_deals__write_events()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
    ), diffed as materialized ( -- once a row: inlined, the CTE copied json_changes' call into each use
      select c.workspace_id, c.id, jsonb_build_object('object', c.object, 'previous_attributes', crm.json_changes(c.before, c.object)) as data
        from changed c
    ), written as (
      insert into crm.events (workspace_id, event, record_type, record_id, data, actor, changes)
      select d.workspace_id, 'deal.updated', 'deal', d.id, d.data, v_actor, (select h.changes from crm.event_changes('deal.updated', d.data) h)
        from diffed d where d.data -> 'previous_attributes' <> '{}'::jsonb order by d.id
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
$function$;
comment on function crm.tg_deals__write_events() is
  'Outbox: deal.created/updated/deleted for every row the statement wrote; a stage change is a deal.updated with '
  'previous_attributes.stage; objects rendered by crm.deal_jsonb.';
grant execute on function crm.tg_deals__write_events() to crm_api;

create or replace function crm.deal_json(d crm.deals)
 returns json
 language sql
 stable parallel safe
return json_build_object('id', (d).id, 'name', (d).name, 'amount', ((d).amount)::text, 'currency', (d).currency,
                         'stage', (d).stage, 'stage_changed_at',
                         to_char(
                           ((d).stage_changed_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                         'close_date', (d).close_date, 'company_id', (d).company_id, 'owner_id', (d).owner_id,
                         'custom_fields', (d).custom_fields, 'created_at',
                         to_char(((d).created_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                         'updated_at',
                         to_char(((d).updated_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                         'created_by', (d).created_by, 'updated_by', (d).updated_by);
comment on function crm.deal_json(d crm.deals) is
  'A deal exactly as the API and webhooks show it (amount as a decimal string, times as crm.api_time writes them).';
grant execute on function crm.deal_json(d crm.deals) to crm_api;

create or replace function crm.deal_jsonb(d crm.deals)
 returns jsonb
 language sql
 stable parallel safe
return jsonb_build_object('id', (d).id, 'name', (d).name, 'amount', ((d).amount)::text, 'currency', (d).currency,
                          'stage', (d).stage, 'stage_changed_at',
                          to_char(
                            ((d).stage_changed_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                          'close_date', (d).close_date, 'company_id', (d).company_id, 'owner_id', (d).owner_id,
                          'custom_fields', (d).custom_fields, 'created_at',
                          to_char(((d).created_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                          'updated_at',
                          to_char(((d).updated_at AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text),
                          'created_by', (d).created_by, 'updated_by', (d).updated_by);
comment on function crm.deal_jsonb(d crm.deals) is
  'crm.deal_json(d)::jsonb without the json text in between (the outbox stores jsonb).';
grant execute on function crm.deal_jsonb(d crm.deals) to crm_api;

create or replace function crm.record_permits(record_type text, record_id uuid, action text)
 returns boolean
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  -- The helpers as sub-selects, as in the policies: evaluated once, and never folded by the
  -- planner's estimates (an unused arm of crm.scope_owner_ids would be cast and fail).
  return case record_type
    when 'contact' then exists (
      select from crm.contacts r
       where r.workspace_id = crm.current_workspace_id() and r.id = record_id
         and ((select crm.grant_scope('contacts', action)) = 'all'
              or r.owner_id = any ((select crm.scope_owner_ids('contacts', action))::uuid[])))
    when 'company' then exists (
      select from crm.companies r
       where r.workspace_id = crm.current_workspace_id() and r.id = record_id
         and ((select crm.grant_scope('companies', action)) = 'all'
              or r.owner_id = any ((select crm.scope_owner_ids('companies', action))::uuid[])))
    when 'deal' then exists (
      select from crm.deals r
       where r.workspace_id = crm.current_workspace_id() and r.id = record_id
         and ((select crm.grant_scope('deals', action)) = 'all'
              or r.owner_id = any ((select crm.scope_owner_ids('deals', action))::uuid[])))
    else false
  end;
end
$function$;
comment on function crm.record_permits(record_type text, record_id uuid, action text) is
  'Whether the caller''s grants (narrowed by the token''s scopes) allow the action on the record of the caller''s '
  'workspace, as the record''s policies decide. For SECURITY DEFINER functions, which pass the policies.';

create or replace function crm.write_associations_changed_event(record_type text, record_id uuid, changes jsonb)
 returns uuid
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_object jsonb;
  v_checked jsonb := '{}'::jsonb;
  v_key text;
  v_value jsonb;
  v_other text;
  v_added uuid[];
  v_removed uuid[];
  v_id uuid;
begin
  if v_workspace is null or crm.current_user_id() is null then
    raise exception 'no request context' using errcode = '42501';
  end if;
  if record_type is null or record_type not in ('contact', 'company', 'deal') then
    raise exception 'no such record type' using errcode = 'CR404', hint = 'not_found';
  end if;
  if not crm.record_permits(record_type, record_id, 'update') then
    if crm.record_permits(record_type, record_id, 'view') then
      raise exception 'your role does not allow updating this %', record_type using errcode = 'CR403', hint = 'forbidden';
    end if;
    raise exception 'no such record' using errcode = 'CR404', hint = 'not_found';
  end if;
  if changes is null or jsonb_typeof(changes) <> 'object' then
    raise exception 'associations_changed must be an object' using errcode = 'CR422', hint = 'validation_failed';
  end if;
  for v_key, v_value in select e.key, e.value from jsonb_each(changes) e loop
    v_other := case v_key when 'contacts' then 'contact' when 'companies' then 'company' when 'deals' then 'deal' end;
    if v_other is null or v_other = record_type
       or jsonb_typeof(v_value) <> 'object'
       or (select array_agg(k order by k) from jsonb_object_keys(v_value) k) is distinct from array['added', 'removed']
       or jsonb_typeof(v_value -> 'added') <> 'array' or jsonb_typeof(v_value -> 'removed') <> 'array'
       or jsonb_array_length(v_value -> 'added') + jsonb_array_length(v_value -> 'removed') > 2000
       or exists (select from jsonb_array_elements((v_value -> 'added') || (v_value -> 'removed')) e
                   where jsonb_typeof(e) <> 'string'
                      or e #>> '{}' !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$') then
      raise exception 'associations_changed.%: expected {"added": [ids], "removed": [ids]} for another record type', v_key
        using errcode = 'CR422', hint = 'validation_failed';
    end if;
    v_added := array(select (e #>> '{}')::uuid from jsonb_array_elements(v_value -> 'added') e);
    v_removed := array(select (e #>> '{}')::uuid from jsonb_array_elements(v_value -> 'removed') e);
    if (select count(distinct x) from unnest(v_added || v_removed) x) <> cardinality(v_added || v_removed)
       or exists (select from unnest(v_added || v_removed) x where not crm.record_permits(v_other, x, 'view'))
       or exists (select from unnest(v_added) x
                   where not exists (select from crm.associations a
                                      where a.workspace_id = v_workspace
                                        and case record_type when 'contact' then a.contact_id when 'company' then a.company_id else a.deal_id end = record_id
                                        and case v_other when 'contact' then a.contact_id when 'company' then a.company_id else a.deal_id end = x))
       or exists (select from unnest(v_removed) x
                   where exists (select from crm.associations a
                                  where a.workspace_id = v_workspace
                                    and case record_type when 'contact' then a.contact_id when 'company' then a.company_id else a.deal_id end = record_id
                                    and case v_other when 'contact' then a.contact_id when 'company' then a.company_id else a.deal_id end = x)) then
      raise exception 'associations_changed.% does not match the links of the %', v_key, record_type
        using errcode = 'CR422', hint = 'validation_failed';
    end if;
    if cardinality(v_added) + cardinality(v_removed) > 0 then
      v_checked := v_checked || jsonb_build_object(v_key, jsonb_build_object('added', to_jsonb(v_added), 'removed', to_jsonb(v_removed)));
    end if;
  end loop;
  if v_checked = '{}'::jsonb then
    return null;
  end if;
  v_object := case record_type
    when 'contact' then (select crm.contact_json(c)::jsonb from crm.contacts c where c.workspace_id = v_workspace and c.id = record_id)
    when 'company' then (select crm.company_json(c)::jsonb from crm.companies c where c.workspace_id = v_workspace and c.id = record_id)
    when 'deal' then (select crm.deal_json(d)::jsonb from crm.deals d where d.workspace_id = v_workspace and d.id = record_id)
  end;
  insert into crm.events (workspace_id, event, record_type, record_id, data, actor, changes)
  select v_workspace, record_type || '.updated', record_type, record_id, x.data, crm.event_actor(),
         (select h.changes from crm.event_changes(record_type || '.updated', x.data) h)
    from (select jsonb_build_object('object', v_object, 'associations_changed', v_checked) as data offset 0) x
  returning id into v_id;
  perform crm.enqueue_event_fan_out(array[v_id]);
  return v_id;
end
$function$;
comment on function crm.write_associations_changed_event(record_type text, record_id uuid, changes jsonb) is
  'Outbox for association changes: {type}.updated of the addressed record with data.associations_changed, built from '
  'the change after checking it against the links as they are now. Only for a record the caller may update, and ids '
  'of records the caller may view.';
grant execute on function crm.write_associations_changed_event(record_type text, record_id uuid, changes jsonb)
  to crm_api;

create or replace function crm.prune_idempotency_keys(log_retention_days integer)
 returns bigint
 language sql
as $function$
  with removed as (delete from crm.idempotency_keys where expires_at <= now() returning 1)
  select count(*) from removed
$function$;
comment on function crm.prune_idempotency_keys(log_retention_days integer) is
  'Removes idempotency keys past their 24 hours (crm.housekeeping runs it).';

comment on table crm.contacts is 'People (docs/api.md section 5); at least one of first name, last name or email.';
comment on column crm.contacts.company_id is
  'The contact''s company (a visible one when set through the API); set to null when that company is deleted.';
create policy contacts_all_owner on crm.contacts as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy contacts_all_owner on crm.contacts is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy contacts_delete_scoped on crm.contacts as permissive for delete to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('contacts'::text, 'delete'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('contacts'::text, 'delete'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy contacts_delete_scoped on crm.contacts is
  'contacts:delete: all, or the owners the own/team scope covers.';
create policy contacts_insert_import on crm.contacts as permissive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (( SELECT crm.current_import_id() AS current_import_id) IS NOT NULL)
     AND ((( SELECT crm.grant_scope('contacts'::text, 'import'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('contacts'::text, 'import'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy contacts_insert_import on crm.contacts is
  'An import creates contacts with contacts:import (the new owner within its scope).';
create policy contacts_insert_import_scope on crm.contacts as restrictive for insert to crm_api
  with check (
    ((( SELECT crm.current_import_id() AS current_import_id) IS NULL)
     OR (( SELECT crm.grant_scope('contacts'::text, 'import'::text) AS grant_scope) = 'all'::text)
     OR (owner_id = ANY (( SELECT crm.scope_owner_ids('contacts'::text, 'import'::text) AS scope_owner_ids)::uuid[])))
  );
comment on policy contacts_insert_import_scope on crm.contacts is
  'Inside an import, the new owner must be within the contacts:import scope.';
create policy contacts_insert_own_bookkeeping on crm.contacts as restrictive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (NOT (created_by IS DISTINCT FROM ( SELECT crm.current_user_id() AS current_user_id)))
     AND (NOT (updated_by IS DISTINCT FROM ( SELECT crm.current_user_id() AS current_user_id))))
  );
comment on policy contacts_insert_own_bookkeeping on crm.contacts is
  'created_by/updated_by, when sent, are the caller (imports send them to skip per-row defaults).';
create policy contacts_insert_scoped on crm.contacts as permissive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('contacts'::text, 'create'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('contacts'::text, 'create'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy contacts_insert_scoped on crm.contacts is 'contacts:create: the new owner must be within the scope.';
create policy contacts_select_created_now on crm.contacts as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (created_by = ( SELECT crm.current_user_id() AS current_user_id))
     AND (created_at = now()))
  );
comment on policy contacts_select_created_now on crm.contacts is
  'A caller sees the rows it created in this same transaction (now() is the transaction start), so a create grant '
  'without view still answers 201 with the record; nothing else.';
create policy contacts_select_scoped on crm.contacts as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('contacts'::text, 'view'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('contacts'::text, 'view'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy contacts_select_scoped on crm.contacts is
  'contacts:view: all, or the owners the own/team scope covers.';
create policy contacts_update_scoped on crm.contacts as permissive for update to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('contacts'::text, 'update'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('contacts'::text, 'update'::text) AS scope_owner_ids)::uuid[]))))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('contacts'::text, 'update'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('contacts'::text, 'update'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy contacts_update_scoped on crm.contacts is
  'contacts:update on the row before and after (an owner change must stay within the scope).';
grant select, delete on crm.contacts to crm_api;
grant insert (workspace_id, id, owner_id, first_name, last_name, email, phone, job_title, city, country, company_id, custom_fields, created_by, updated_by)
  on crm.contacts
  to crm_api;
grant update (owner_id, first_name, last_name, email, phone, job_title, city, country, company_id, custom_fields)
  on crm.contacts
  to crm_api;
comment on index crm.contacts_company is 'filter[company_id] and the ON DELETE SET NULL when a company is deleted.';
comment on index crm.contacts_created_at is 'The default list order (created_at, id) and its keyset cursor.';
comment on index crm.contacts_custom_fields is 'filter[custom_fields.<key>]=value (containment @>).';
comment on index crm.contacts_email_unique is
  'An email belongs to one contact per workspace (API 409 duplicate, pointer /email); import upserts match on it.';
comment on index crm.contacts_last_name is 'sort=last_name.';
comment on index crm.contacts_owner is 'The own/team scope of every contacts policy (owner_id = any (...)).';
comment on index crm.contacts_search_trigram is
  'Search: substring and fuzzy (trigram) matches on names, email and phone digits.';
comment on index crm.contacts_search_words is 'Search: full-text word and word-prefix matches.';
comment on index crm.contacts_updated_at is 'updated_since and sort=updated_at (sync clients).';
CREATE TRIGGER tg_contacts__before_insert BEFORE INSERT ON crm.contacts
  FOR EACH ROW
  WHEN ((new.email IS DISTINCT FROM lower(new.email)))
  EXECUTE FUNCTION crm.tg_contacts__before_write();
CREATE TRIGGER tg_contacts__before_update BEFORE UPDATE ON crm.contacts
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_contacts__before_write();
CREATE TRIGGER tg_contacts__company_visible_insert AFTER INSERT ON crm.contacts
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg__assert_company_visible();
CREATE TRIGGER tg_contacts__company_visible_update AFTER UPDATE ON crm.contacts
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg__assert_company_visible();
CREATE TRIGGER tg_contacts__events_delete AFTER DELETE ON crm.contacts
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_contacts__write_events();
CREATE TRIGGER tg_contacts__events_insert AFTER INSERT ON crm.contacts
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_contacts__write_events();
CREATE TRIGGER tg_contacts__events_update AFTER UPDATE ON crm.contacts
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_contacts__write_events();
CREATE TRIGGER tg_contacts__touch_updated_at BEFORE UPDATE ON crm.contacts
  FOR EACH ROW
  WHEN ((old.* IS DISTINCT FROM new.*))
  EXECUTE FUNCTION crm.tg__touch_updated_at();

comment on table crm.companies is 'Companies (docs/api.md section 5).';
create policy companies_all_owner on crm.companies as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy companies_all_owner on crm.companies is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy companies_delete_scoped on crm.companies as permissive for delete to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('companies'::text, 'delete'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('companies'::text, 'delete'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy companies_delete_scoped on crm.companies is
  'companies:delete: all, or the owners the own/team scope covers.';
create policy companies_insert_import on crm.companies as permissive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (( SELECT crm.current_import_id() AS current_import_id) IS NOT NULL)
     AND ((( SELECT crm.grant_scope('companies'::text, 'import'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('companies'::text, 'import'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy companies_insert_import on crm.companies is
  'An import creates companies (rows and company_name links) with companies:import.';
create policy companies_insert_import_scope on crm.companies as restrictive for insert to crm_api
  with check (
    ((( SELECT crm.current_import_id() AS current_import_id) IS NULL)
     OR (( SELECT crm.grant_scope('companies'::text, 'import'::text) AS grant_scope) = 'all'::text)
     OR (owner_id = ANY (( SELECT crm.scope_owner_ids('companies'::text, 'import'::text) AS scope_owner_ids)::uuid[])))
  );
comment on policy companies_insert_import_scope on crm.companies is
  'Inside an import, the new owner must be within the companies:import scope.';
create policy companies_insert_own_bookkeeping on crm.companies as restrictive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (NOT (created_by IS DISTINCT FROM ( SELECT crm.current_user_id() AS current_user_id)))
     AND (NOT (updated_by IS DISTINCT FROM ( SELECT crm.current_user_id() AS current_user_id))))
  );
comment on policy companies_insert_own_bookkeeping on crm.companies is
  'created_by/updated_by, when sent, are the caller (imports send them to skip per-row defaults).';
create policy companies_insert_scoped on crm.companies as permissive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('companies'::text, 'create'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('companies'::text, 'create'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy companies_insert_scoped on crm.companies is
  'companies:create: the new owner must be within the scope.';
create policy companies_select_created_now on crm.companies as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (created_by = ( SELECT crm.current_user_id() AS current_user_id))
     AND (created_at = now()))
  );
comment on policy companies_select_created_now on crm.companies is
  'A caller sees the rows it created in this same transaction (now() is the transaction start), so a create grant '
  'without view still answers 201 with the record; nothing else.';
create policy companies_select_scoped on crm.companies as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('companies'::text, 'view'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('companies'::text, 'view'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy companies_select_scoped on crm.companies is
  'companies:view: all, or the owners the own/team scope covers.';
create policy companies_update_scoped on crm.companies as permissive for update to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('companies'::text, 'update'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('companies'::text, 'update'::text) AS scope_owner_ids)::uuid[]))))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('companies'::text, 'update'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('companies'::text, 'update'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy companies_update_scoped on crm.companies is
  'companies:update on the row before and after (an owner change must stay within the scope).';
grant select, delete on crm.companies to crm_api;
grant insert (workspace_id, id, owner_id, name, domain, website, industry, phone, city, country, employee_count, annual_revenue, description, custom_fields, created_by, updated_by)
  on crm.companies
  to crm_api;
grant update (owner_id, name, domain, website, industry, phone, city, country, employee_count, annual_revenue, description, custom_fields)
  on crm.companies
  to crm_api;
comment on index crm.companies_created_at is 'The default list order (created_at, id) and its keyset cursor.';
comment on index crm.companies_custom_fields is 'filter[custom_fields.<key>]=value (containment @>).';
comment on index crm.companies_domain_unique is
  'A domain belongs to one company per workspace (API 409 duplicate, pointer /domain); import upserts match on it.';
comment on index crm.companies_name is 'sort=name and the company_name lookups of imports.';
comment on index crm.companies_name_lower is
  'Imports: the company_name pseudo-field finds a company by name, case-insensitively.';
comment on index crm.companies_owner is 'The own/team scope of every companies policy (owner_id = any (...)).';
comment on index crm.companies_search_trigram is
  'Search: substring and fuzzy (trigram) matches on name, domain and phone digits.';
comment on index crm.companies_search_words is 'Search: full-text word and word-prefix matches.';
comment on index crm.companies_updated_at is 'updated_since and sort=updated_at (sync clients).';
CREATE TRIGGER tg_companies__before_insert BEFORE INSERT ON crm.companies
  FOR EACH ROW
  WHEN ((new.domain IS DISTINCT FROM rtrim(lower(new.domain), '.'::text)))
  EXECUTE FUNCTION crm.tg_companies__before_write();
CREATE TRIGGER tg_companies__before_update BEFORE UPDATE ON crm.companies
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_companies__before_write();
CREATE TRIGGER tg_companies__events_delete AFTER DELETE ON crm.companies
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_companies__write_events();
CREATE TRIGGER tg_companies__events_insert AFTER INSERT ON crm.companies
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_companies__write_events();
CREATE TRIGGER tg_companies__events_update AFTER UPDATE ON crm.companies
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_companies__write_events();
CREATE TRIGGER tg_companies__touch_updated_at BEFORE UPDATE ON crm.companies
  FOR EACH ROW
  WHEN ((old.* IS DISTINCT FROM new.*))
  EXECUTE FUNCTION crm.tg__touch_updated_at();

comment on table crm.deals is
  'Deals (docs/api.md section 5): money in numeric(18,2), the stage one of the workspace''s deal_stages.';
comment on column crm.deals.stage_changed_at is
  'When the stage last changed (read-only, kept by tg_deals__before_write).';
create policy deals_all_owner on crm.deals as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy deals_all_owner on crm.deals is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy deals_delete_scoped on crm.deals as permissive for delete to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('deals'::text, 'delete'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('deals'::text, 'delete'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy deals_delete_scoped on crm.deals is 'deals:delete: all, or the owners the own/team scope covers.';
create policy deals_insert_import on crm.deals as permissive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (( SELECT crm.current_import_id() AS current_import_id) IS NOT NULL)
     AND ((( SELECT crm.grant_scope('deals'::text, 'import'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('deals'::text, 'import'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy deals_insert_import on crm.deals is
  'An import creates deals with deals:import (the new owner within its scope).';
create policy deals_insert_import_scope on crm.deals as restrictive for insert to crm_api
  with check (
    ((( SELECT crm.current_import_id() AS current_import_id) IS NULL)
     OR (( SELECT crm.grant_scope('deals'::text, 'import'::text) AS grant_scope) = 'all'::text)
     OR (owner_id = ANY (( SELECT crm.scope_owner_ids('deals'::text, 'import'::text) AS scope_owner_ids)::uuid[])))
  );
comment on policy deals_insert_import_scope on crm.deals is
  'Inside an import, the new owner must be within the deals:import scope.';
create policy deals_insert_own_bookkeeping on crm.deals as restrictive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (NOT (created_by IS DISTINCT FROM ( SELECT crm.current_user_id() AS current_user_id)))
     AND (NOT (updated_by IS DISTINCT FROM ( SELECT crm.current_user_id() AS current_user_id))))
  );
comment on policy deals_insert_own_bookkeeping on crm.deals is
  'created_by/updated_by, when sent, are the caller (imports send them to skip per-row defaults).';
create policy deals_insert_scoped on crm.deals as permissive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('deals'::text, 'create'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('deals'::text, 'create'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy deals_insert_scoped on crm.deals is 'deals:create: the new owner must be within the scope.';
create policy deals_select_created_now on crm.deals as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (created_by = ( SELECT crm.current_user_id() AS current_user_id))
     AND (created_at = now()))
  );
comment on policy deals_select_created_now on crm.deals is
  'A caller sees the rows it created in this same transaction (now() is the transaction start), so a create grant '
  'without view still answers 201 with the record; nothing else.';
create policy deals_select_scoped on crm.deals as permissive for select to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('deals'::text, 'view'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (( SELECT crm.scope_owner_ids('deals'::text, 'view'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy deals_select_scoped on crm.deals is 'deals:view: all, or the owners the own/team scope covers.';
create policy deals_update_scoped on crm.deals as permissive for update to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('deals'::text, 'update'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('deals'::text, 'update'::text) AS scope_owner_ids)::uuid[]))))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((( SELECT crm.grant_scope('deals'::text, 'update'::text) AS grant_scope) = 'all'::text)
          OR (owner_id = ANY (
                ( SELECT crm.scope_owner_ids('deals'::text, 'update'::text) AS scope_owner_ids)::uuid[]))))
  );
comment on policy deals_update_scoped on crm.deals is
  'deals:update on the row before and after (an owner change must stay within the scope).';
grant select, delete on crm.deals to crm_api;
grant insert (workspace_id, id, owner_id, name, amount, currency, stage, close_date, company_id, custom_fields, created_by, updated_by)
  on crm.deals
  to crm_api;
grant update (owner_id, name, amount, currency, stage, close_date, company_id, custom_fields) on crm.deals to crm_api;
comment on index crm.deals_amount is 'sort=-amount and amount ranges.';
comment on index crm.deals_company is 'filter[company_id] and the ON DELETE SET NULL when a company is deleted.';
comment on index crm.deals_created_at is 'The default list order (created_at, id) and its keyset cursor.';
comment on index crm.deals_custom_fields is 'filter[custom_fields.<key>]=value (containment @>).';
comment on index crm.deals_owner is 'The own/team scope of every deals policy (owner_id = any (...)).';
comment on index crm.deals_search_trigram is 'Search: substring and fuzzy (trigram) matches on the deal name.';
comment on index crm.deals_search_words is 'Search: full-text word and word-prefix matches.';
comment on index crm.deals_stage is
  'The pipeline view: filter[stage] in the default order; also the stage foreign key.';
comment on index crm.deals_updated_at is 'updated_since and sort=updated_at (sync clients).';
CREATE TRIGGER tg_deals__before_insert BEFORE INSERT ON crm.deals
  FOR EACH ROW
  WHEN (((new.stage IS NULL) OR (new.stage_changed_at IS DISTINCT FROM now())))
  EXECUTE FUNCTION crm.tg_deals__before_write();
CREATE TRIGGER tg_deals__before_update BEFORE UPDATE ON crm.deals
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_deals__before_write();
CREATE TRIGGER tg_deals__company_visible_insert AFTER INSERT ON crm.deals
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg__assert_company_visible();
CREATE TRIGGER tg_deals__company_visible_update AFTER UPDATE ON crm.deals
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg__assert_company_visible();
CREATE TRIGGER tg_deals__events_delete AFTER DELETE ON crm.deals
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_deals__write_events();
CREATE TRIGGER tg_deals__events_insert AFTER INSERT ON crm.deals
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_deals__write_events();
CREATE TRIGGER tg_deals__events_update AFTER UPDATE ON crm.deals
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_deals__write_events();
CREATE TRIGGER tg_deals__touch_updated_at BEFORE UPDATE ON crm.deals
  FOR EACH ROW
  WHEN ((old.* IS DISTINCT FROM new.*))
  EXECUTE FUNCTION crm.tg__touch_updated_at();

comment on table crm.deal_stages is
  'The pipeline of a workspace, in position order; a deal''s stage is one of these keys.';
create policy deal_stages_all_owner on crm.deal_stages as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy deal_stages_all_owner on crm.deal_stages is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy deal_stages_select_member on crm.deal_stages as permissive for select to crm_api
  using ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id)));
comment on policy deal_stages_select_member on crm.deal_stages is 'Every member of a workspace sees its pipeline.';
grant select on crm.deal_stages to crm_api;

comment on table crm.associations is
  'Many-to-many links between two records of different types; exactly two of contact_id, company_id, deal_id are set.';
create policy associations_all_owner on crm.associations as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy associations_all_owner on crm.associations is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy associations_delete_scopes on crm.associations as restrictive for delete to crm_api
  using (crm.scopes_cover_link(( SELECT crm.current_scopes() AS current_scopes), contact_id, company_id, deal_id));
comment on policy associations_delete_scopes on crm.associations is
  'A scoped token unlinks records only with write on one end''s type.';
create policy associations_delete_visible on crm.associations as permissive for delete to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((contact_id IS NULL)
          OR (EXISTS ( SELECT
                       FROM crm.contacts c
                       WHERE ((c.workspace_id = associations.workspace_id) AND (c.id = associations.contact_id)))))
     AND ((company_id IS NULL)
          OR (EXISTS ( SELECT
                       FROM crm.companies c
                       WHERE ((c.workspace_id = associations.workspace_id) AND (c.id = associations.company_id)))))
     AND ((deal_id IS NULL)
          OR (EXISTS ( SELECT
                       FROM crm.deals d
                       WHERE ((d.workspace_id = associations.workspace_id) AND (d.id = associations.deal_id))))))
  );
comment on policy associations_delete_visible on crm.associations is
  'A link may be removed only when the caller can see both its ends (links to hidden records stay).';
create policy associations_insert_scopes on crm.associations as restrictive for insert to crm_api
  with check (crm.scopes_cover_link(( SELECT crm.current_scopes() AS current_scopes), contact_id, company_id, deal_id));
comment on policy associations_insert_scopes on crm.associations is
  'A scoped token links records only with write on one end''s type.';
create policy associations_insert_visible on crm.associations as permissive for insert to crm_api
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ((contact_id IS NULL)
          OR (EXISTS ( SELECT
                       FROM crm.contacts c
                       WHERE ((c.workspace_id = associations.workspace_id) AND (c.id = associations.contact_id)))))
     AND ((company_id IS NULL)
          OR (EXISTS ( SELECT
                       FROM crm.companies c
                       WHERE ((c.workspace_id = associations.workspace_id) AND (c.id = associations.company_id)))))
     AND ((deal_id IS NULL)
          OR (EXISTS ( SELECT
                       FROM crm.deals d
                       WHERE ((d.workspace_id = associations.workspace_id) AND (d.id = associations.deal_id))))))
  );
comment on policy associations_insert_visible on crm.associations is
  'A link may be made only between records the caller can see.';
create policy associations_select_member on crm.associations as permissive for select to crm_api
  using ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id)));
comment on policy associations_select_member on crm.associations is
  'Members see links; the API joins each link to the record at its other end, which RLS filters.';
grant select, delete on crm.associations to crm_api;
grant insert (contact_id, company_id, deal_id) on crm.associations to crm_api;
comment on index crm.associations_company is 'A company''s contacts, and the cascade when a company is deleted.';
comment on index crm.associations_company_deal is 'One link per company and deal; a company''s deals.';
comment on index crm.associations_contact is 'The cascade when a contact is deleted.';
comment on index crm.associations_contact_company is 'One link per contact and company; a contact''s companies.';
comment on index crm.associations_contact_deal is 'One link per contact and deal; a contact''s deals.';
comment on index crm.associations_deal is 'A deal''s contacts and companies, and the cascade when a deal is deleted.';

comment on table crm.idempotency_keys is
  'The first response to a POST with Idempotency-Key, replayed for 24 hours to the same user in the same workspace '
  'when the request is the same (request_hash), 409 otherwise.';
comment on column crm.idempotency_keys.request_hash is
  'sha256 of method, path and the body with sorted keys: the same request sent again hashes the same.';
comment on column crm.idempotency_keys.response_body is
  'The JSON text of the first answer exactly as sent (text, not jsonb, so a replay is byte-identical).';
create policy idempotency_keys_all_own on crm.idempotency_keys as permissive for all to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (user_id = ( SELECT crm.current_user_id() AS current_user_id)))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND (user_id = ( SELECT crm.current_user_id() AS current_user_id)))
  );
comment on policy idempotency_keys_all_own on crm.idempotency_keys is
  'A caller sees and writes only their own keys in the current workspace (the primary key serves it).';
create policy idempotency_keys_all_owner on crm.idempotency_keys as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy idempotency_keys_all_owner on crm.idempotency_keys is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
grant select on crm.idempotency_keys to crm_api;
grant insert (key, request_hash, response_status, response_body, response_headers) on crm.idempotency_keys to crm_api;
grant update (request_hash, response_status, response_body, response_headers, created_at, expires_at)
  on crm.idempotency_keys
  to crm_api;
comment on index crm.idempotency_keys_expires_at is 'Housekeeping deletes expired keys.';
