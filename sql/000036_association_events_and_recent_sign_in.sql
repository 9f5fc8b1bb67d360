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
--
-- Turning two-factor on and creating a token that lasts more than a day need a recent sign-in: a
-- stolen session cookie must not lock its owner out with its own TOTP secret, nor mint a 365-day
-- token that outlives the session's revocation. crm.tokens.authenticated_at is when the holder of
-- a credential last proved who they are: the moment of a sign-in (password, and the second factor
-- when it is on) for a token or session issued without a request context, and, for a token made
-- in a request (POST /api/tokens, an invitation accepted with a bearer), the calling token's own,
-- so a token cannot refresh its proof by minting another. Tokens issued before this file get
-- -infinity: none of them counts as a recent sign-in. Recent is within 10 minutes
-- (crm.is_recent_sign_in). Refused with CR403 reauthentication_required.
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

-- ---------------------------------------------------------------------------------------------
-- Recent sign-in

-- squawk-ignore adding-not-nullable-field
alter table crm.tokens add column authenticated_at timestamp with time zone not null default '-infinity';
alter table crm.tokens alter column authenticated_at set default now();
comment on column crm.tokens.authenticated_at is
  'When the holder last proved who they are: the sign-in that issued it, or the calling token''s own for a token made in a request (-infinity for tokens issued before 000036). Turning two-factor on and tokens past a day need it within 10 minutes.';
grant select (authenticated_at) on crm.tokens to crm_api;

create function crm.is_recent_sign_in(authenticated_at timestamp with time zone) returns boolean
  language sql stable
  return authenticated_at > now() - interval '10 minutes';
comment on function crm.is_recent_sign_in(timestamp with time zone) is
  'Whether a sign-in at this time is recent enough to turn two-factor on or create a token that lasts more than a day: within 10 minutes.';
revoke execute on function crm.is_recent_sign_in(timestamp with time zone) from public;
grant execute on function crm.is_recent_sign_in(timestamp with time zone) to crm_api;

create function crm.signed_in_recently() returns boolean
  language plpgsql stable
  set search_path = pg_catalog, crm, pg_temp
as $$
begin
  return coalesce((select crm.is_recent_sign_in(t.authenticated_at) from crm.tokens t where t.id = crm.current_token_id()), false);
end
$$;
comment on function crm.signed_in_recently() is
  'Whether the calling token or session comes from a sign-in within the last 10 minutes (false without a request context). The pages ask it before offering what needs one.';
revoke execute on function crm.signed_in_recently() from public;
grant execute on function crm.signed_in_recently() to crm_api;

create function crm.tg_tokens__authenticated_at() returns trigger
  language plpgsql
  set search_path = pg_catalog, crm, pg_temp
as $$
begin
  if crm.current_token_id() is null then
    -- A sign-in, a sign-up or the OAuth token endpoint: issued on a proof made now (the default).
    new.authenticated_at := now();
    return new;
  end if;
  new.authenticated_at := coalesce((select t.authenticated_at from crm.tokens t where t.id = crm.current_token_id()), '-infinity');
  -- Requests insert as crm_api; an invitation accepted with a bearer (the owner's function) issues
  -- a token no longer-lived than that bearer, its own rule.
  if current_user = 'crm_api' and new.kind = 'token' and new.expires_at > now() + interval '1 day'
     and not crm.is_recent_sign_in(new.authenticated_at) then
    raise exception 'a token that lasts more than a day needs a sign-in within the last 10 minutes'
      using errcode = 'CR403', hint = 'reauthentication_required';
  end if;
  return new;
end
$$;
comment on function crm.tg_tokens__authenticated_at() is
  'Sets a new token''s authenticated_at (now for a sign-in, the calling token''s own in a request) and refuses a request''s token that lasts more than a day without a recent sign-in (CR403 reauthentication_required).';
revoke execute on function crm.tg_tokens__authenticated_at() from public;
create trigger tg_tokens__authenticated_at before insert on crm.tokens
  for each row execute function crm.tg_tokens__authenticated_at();

create function crm.tg_user_totp__recent_sign_in() returns trigger
  language plpgsql
  set search_path = pg_catalog, crm, pg_temp
as $$
begin
  -- In a request only: the owner's own SQL (an operator, a fixture) is no request.
  if old.confirmed_at is null and new.confirmed_at is not null and crm.current_token_id() is not null
     and not crm.signed_in_recently() then
    raise exception 'turning two-factor on needs a sign-in within the last 10 minutes'
      using errcode = 'CR403', hint = 'reauthentication_required';
  end if;
  return new;
end
$$;
comment on function crm.tg_user_totp__recent_sign_in() is
  'Refuses turning two-factor on (confirmed_at set) in a request whose token or session does not come from a sign-in within the last 10 minutes (CR403 reauthentication_required).';
revoke execute on function crm.tg_user_totp__recent_sign_in() from public;
create trigger tg_user_totp__recent_sign_in before update of confirmed_at on crm.user_totp
  for each row execute function crm.tg_user_totp__recent_sign_in();
