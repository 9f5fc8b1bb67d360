-- crm.write_associations_changed_event, the outbox of a PUT of a record's associations, asked only
-- that the caller might view the record and wrote the caller's `changes` into the event as given:
-- a read-only member could put a `{type}.updated` event of any record they see into every webhook,
-- saying whatever they liked. It now needs update on the record (the grant the PUT needs), and the
-- event's `associations_changed` is built by the function from a change it checks against the
-- links as they are now: each key one of the record's other types, each id a record of that type
-- the caller may view, every `added` id linked to the record, every `removed` one not linked, no
-- id twice. Anything else is refused (CR422 validation_failed). What it can then say is what the
-- caller could have done for real in the same transaction: link or unlink records it sees on a
-- record it may update.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

create function crm.record_permits(record_type text, record_id uuid, action text) returns boolean
  language plpgsql stable
  set search_path = pg_catalog, crm, pg_temp
as $$
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
$$;
comment on function crm.record_permits(text, uuid, text) is
  'Whether the caller''s grants (narrowed by the token''s scopes) allow the action on the record of the caller''s workspace, as the record''s policies decide. For SECURITY DEFINER functions, which pass the policies.';
revoke execute on function crm.record_permits(text, uuid, text) from public;

create or replace function crm.write_associations_changed_event(record_type text, record_id uuid, changes jsonb) returns uuid
  language plpgsql security definer
  set search_path = pg_catalog, crm, pg_temp
as $$
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
  insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
  values (v_workspace, record_type || '.updated', record_type, record_id,
          jsonb_build_object('object', v_object, 'associations_changed', v_checked), crm.event_actor())
  returning id into v_id;
  perform crm.enqueue_event_fan_out(array[v_id]);
  return v_id;
end
$$;
comment on function crm.write_associations_changed_event(text, uuid, jsonb) is
  'Outbox for association changes: {type}.updated of the addressed record with data.associations_changed, built from the change after checking it against the links as they are now. Only for a record the caller may update, and ids of records the caller may view.';
