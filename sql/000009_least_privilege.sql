-- Least privilege: what a connection must prove before it reads under row-level security.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- A single-statement read cannot switch its role (row-level security is decided when the
-- statement is planned), so it runs as its connection's login role and proves, inside the
-- statement, that this role is confined: not a superuser, no BYPASSRLS, not the tables' owner (or
-- one with its privileges), and with the privileges of crm_api, whose policies then apply. A
-- connection that a pooler or a wrong URL left as the owner is refused instead of reading every
-- workspace. The check reads cached catalogs and runs once per statement (an InitPlan).
create function crm.require_confined_role() returns boolean
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
  if exists (select from pg_roles where rolname = current_user and (rolsuper or rolbypassrls))
    or not pg_has_role(current_user, 'crm_api', 'usage')
    or pg_has_role(current_user, (select relowner from pg_class where oid = 'crm.contacts'::regclass), 'usage')
  then
    raise exception 'a read under row-level security must run as a role confined by it, not as %', current_user
      using errcode = '42501', hint = 'role_not_confined';
  end if;
  return true;
end
$$;
comment on function crm.require_confined_role() is
  'True when the current role is subject to the policies of crm_api; raises 42501 (hint role_not_confined) otherwise.';
revoke execute on function crm.require_confined_role() from public;
grant execute on function crm.require_confined_role() to crm_api;

-- The role requests run as: a member of crm_api (its grants and policies apply to it without a
-- SET ROLE), owning nothing, no superuser, no BYPASSRLS. Its limits are role settings, which the
-- server applies at every login, so no pooler can drop them. The service gives it its password
-- when it starts (src/db/runtime-role.ts); an operator who manages roles makes their own login role
-- a member of it instead (RUNTIME_DATABASE_URL).
do $$
begin
  if not exists (select from pg_roles where rolname = 'crm_runtime') then
    create role crm_runtime login inherit nosuperuser nobypassrls nocreatedb nocreaterole;
  end if;
end
$$;
alter role crm_runtime set statement_timeout = '30s';
alter role crm_runtime set idle_in_transaction_session_timeout = '60s';
grant crm_api to crm_runtime;

-- What requests do outside crm_api's transaction: /readyz compares the schema's number, and a
-- request that failed after authenticating is counted again after its rollback.
grant select (number) on crm.schema_migrations to crm_runtime;
grant execute on function crm.count_request(uuid) to crm_runtime;

-- EXECUTE on functions. PostgreSQL grants it to PUBLIC on every new function, so every function
-- of crm loses PUBLIC's grant here, and crm_api gets exactly those it could call until now except
-- the ones only the owner (the worker, sign-in, sign-up, housekeeping) calls. A function created
-- later revokes PUBLIC and grants crm_api by name where it is defined (CONVENTIONS.md).
do $$
declare
  v_function regprocedure;
begin
  for v_function in
    select p.oid::regprocedure from pg_proc p
    where p.pronamespace = 'crm'::regnamespace and p.prokind = 'f'
      and has_function_privilege('crm_api', p.oid, 'execute')
  loop
    execute format('grant execute on function %s to crm_api', v_function);
  end loop;
  for v_function in select p.oid::regprocedure from pg_proc p where p.pronamespace = 'crm'::regnamespace and p.prokind = 'f'
  loop
    execute format('revoke execute on function %s from public', v_function);
  end loop;
end
$$;

-- Only the worker (as the owner), housekeeping, sign-in and sign-up call these.
revoke execute on function
  crm.prune_tenancy(integer), crm.prune_idempotency_keys(integer), crm.prune_invitations(integer),
  crm.prune_webhook_deliveries(integer), crm.prune_imports(integer),
  crm.worker_heartbeat(text, text, interval), crm.worker_stopped(text),
  crm.add_webhook_delivery_jobs(crm.webhook_deliveries[], timestamptz, boolean),
  crm.webhook_first_attempts_to_send(uuid[], boolean), crm.webhook_deliveries_to_send(uuid, uuid, uuid[], integer[]),
  crm.continue_webhook_release(uuid, uuid),
  crm.issue_token(uuid, text, text, bytea, interval), crm.token_user(bytea),
  crm.free_workspace_slug(text)
from crm_api;

-- The plan of a workspace is the caller's business only through crm.require_webhook_access (its
-- own workspace); the trigger and the fan-out that also read it run as the owner.
revoke execute on function crm.webhooks_enabled(uuid) from crm_api;

-- The SECURITY DEFINER functions that name public on their search_path (for pgcrypto's hmac and
-- digest, installed there) get pg_temp last, so a temporary table cannot stand in for a table of
-- theirs, and nobody but the database owner may create in public, so nothing there can stand in
-- for a function of theirs either.
revoke create on schema public from public;
do $$
declare
  v_function regprocedure;
begin
  for v_function in
    select p.oid::regprocedure from pg_proc p
    where p.pronamespace = 'crm'::regnamespace and p.prosecdef
      and 'search_path=pg_catalog, public' = any (p.proconfig)
  loop
    execute format('alter function %s set search_path = pg_catalog, crm, public, pg_temp', v_function);
  end loop;
end
$$;

-- The event of an association change embeds the addressed record as the caller sees it: the
-- record must be visible to the caller under the view scope of its type, as the select policies
-- decide, not merely in the caller's workspace (the function reads as the owner).
create or replace function crm.write_associations_changed_event(record_type text, record_id uuid, changes jsonb) returns uuid
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
    when 'contact' then (
      select crm.contact_json(c)::jsonb from crm.contacts c
      where c.workspace_id = v_workspace and c.id = record_id
        and (crm.grant_scope('contacts', 'view') = 'all' or c.owner_id = any (crm.scope_owner_ids('contacts', 'view'))))
    when 'company' then (
      select crm.company_json(c)::jsonb from crm.companies c
      where c.workspace_id = v_workspace and c.id = record_id
        and (crm.grant_scope('companies', 'view') = 'all' or c.owner_id = any (crm.scope_owner_ids('companies', 'view'))))
    when 'deal' then (
      select crm.deal_json(d)::jsonb from crm.deals d
      where d.workspace_id = v_workspace and d.id = record_id
        and (crm.grant_scope('deals', 'view') = 'all' or d.owner_id = any (crm.scope_owner_ids('deals', 'view'))))
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
  'Outbox for association changes: {type}.updated of the addressed record with data.associations_changed. Only for a record the caller may view.';
