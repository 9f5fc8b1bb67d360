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
