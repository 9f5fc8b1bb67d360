-- The confinement check of single-statement reads, inlined, and stricter. Every single-statement
-- read (GET one, lists, search) evaluates crm.require_confined_role() once; as PL/pgSQL reading
-- pg_roles and pg_class it cost about 35 µs of PostgreSQL per read (measured in a loop, against 5 µs
-- for `select 1`). It is now a SQL expression PostgreSQL inlines into the statement (about 18 µs
-- less), so it has no SET clause and names everything by its schema; the refusal itself stays in
-- PL/pgSQL (crm.refuse_unconfined_role), called only when the check fails.
--
-- What it asks:
-- - row_security_active on crm.contacts: false for a superuser, a BYPASSRLS role, and the tables'
--   owner if FORCE ROW LEVEL SECURITY were ever dropped (the old check read rolsuper and
--   rolbypassrls from pg_roles);
-- - the privileges of crm_api, as before;
-- - not a member of crm_owner, in any way. The old check asked about the tables' owner itself, so a
--   login role granted both crm_api and crm_owner by mistake passed it and then read every row of
--   every workspace through the `_all_owner` policies, which apply to any member of crm_owner. The
--   owner is a member of crm_owner (000013), so it is still refused.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create function crm.refuse_unconfined_role() returns boolean
language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
  raise exception 'a read under row-level security must run as a role confined by it, not as %', current_user
    using errcode = '42501', hint = 'role_not_confined';
end
$$;
comment on function crm.refuse_unconfined_role() is
  'Raises 42501 (hint role_not_confined): crm.require_confined_role''s refusal (internal; crm_api calls that).';
revoke execute on function crm.refuse_unconfined_role() from public;
grant execute on function crm.refuse_unconfined_role() to crm_api;

create or replace function crm.require_confined_role() returns boolean
language sql stable
as $$
  select case when pg_catalog.row_security_active('crm.contacts'::pg_catalog.regclass)
               and pg_catalog.pg_has_role(current_user, 'crm_api', 'usage')
               and not pg_catalog.pg_has_role(current_user, 'crm_owner', 'member')
              then true
              else crm.refuse_unconfined_role()
         end
$$;
comment on function crm.require_confined_role() is
  'True when the current role is subject to the policies of crm_api and to no policy of crm_owner; raises 42501 (hint role_not_confined) otherwise. Inlined into the statement that asks.';
