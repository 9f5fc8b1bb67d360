-- Three holes from a review, closed:
--
-- 1. Another deployment's login roles reached this database. Roles are cluster-wide, grants are per
--    database: this database grants EXECUTE on crm.claim_sign_in to crm_runtime and
--    crm.begin_import_batch to crm_worker, and the login roles of every database in the cluster
--    (crm_runtime_<db>, crm_worker_<db>) are members of those same groups. With PUBLIC's default
--    CONNECT, another database's runtime login connected here and held this database's grants.
--    The groups cannot be made per database (every grant of the schema names them), so the door is
--    closed instead: PUBLIC (and any shared group, through which CONNECT would be inherited) loses
--    CONNECT on this database, and only its own login roles (and its owner, who keeps it) are
--    granted it, by crm.admit_to_database. GRANT and REVOKE ON DATABASE
--    take a name, not an expression, and this database's name is known only at run time: that
--    function is the one place that builds such a statement. It runs at every migration run and
--    whenever the service makes a login role (src/db/runtime-role.ts), not once here: a database
--    copied by CREATE DATABASE ... TEMPLATE, or restored without --create, comes with PUBLIC's
--    CONNECT again and without the grants to its login roles.
--
-- 2. With the embedded PostgreSQL the migrating owner is a superuser, so every SECURITY DEFINER
--    function ran as a superuser: one injection in a definer's body was the whole cluster. Objects
--    of crm and graphile-worker's queue that a superuser owns go to crm_owner (NOLOGIN, no
--    superuser, no BYPASSRLS; the `_all_owner` policies and GRANT SET ON PARAMETER name it), by
--    crm.disown_superuser_objects at every migration run, since later files and
--    crm.install_context_carrier create functions as the migrating role again. An owner that is no
--    superuser (a managed PostgreSQL) keeps its objects: they already run as no superuser.
--
-- 3. crm_api could update crm.users.password_hash. Nothing a request runs does (passwords are set
--    by crm.sign_up, crm.accept_invitation and the owner's CLI), so the grant goes.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

create function crm.admit_to_database(p_logins text[]) returns boolean
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_database name := current_database();
  v_login regrole;
begin
  -- Only the database's owner (or a member of it, or a superuser) may say who connects; anyone
  -- else migrating leaves it to a DBA (docs/operations.md) and is told so by the answer.
  if not pg_has_role(current_user, (select d.datdba from pg_database d where d.datname = v_database), 'usage') then
    return false;
  end if;
  -- Processes starting together would otherwise update the database's row at once ("tuple
  -- concurrently updated"); the grants below are skipped when already made.
  perform pg_advisory_xact_lock(727002);
  for v_login in select to_regrole(l) from unnest(p_logins) l where to_regrole(l) is not null loop
    if not exists (
      select from pg_database d, aclexplode(d.datacl) x
       where d.datname = v_database and x.grantee = v_login and x.privilege_type = 'CONNECT'
    ) then
      execute format('grant connect on database %I to %I', v_database, v_login::text);
    end if;
  end loop;
  if exists (
    select from pg_database d, aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) x
     where d.datname = v_database and x.grantee = 0 and x.privilege_type = 'CONNECT'
  ) then
    execute format('revoke connect on database %I from public', v_database);
  end if;
  -- CONNECT is inherited like any privilege: granted to a shared group (a DBA's slip), it would
  -- let in every database's logins again.
  if exists (
    select from pg_database d, aclexplode(d.datacl) x
     where d.datname = v_database and x.privilege_type = 'CONNECT'
       and x.grantee in (select r.oid from pg_roles r where r.rolname in ('crm_api', 'crm_owner', 'crm_runtime', 'crm_worker'))
  ) then
    execute format('revoke connect on database %I from crm_api, crm_owner, crm_runtime, crm_worker', v_database);
  end if;
  return true;
end
$$;
comment on function crm.admit_to_database(p_logins text[]) is
  'Grants CONNECT on this database to the given login roles (those that exist) and takes it from PUBLIC and the shared groups, so that no other database''s login roles (members of the same cluster-wide groups) connect here; answers false, changing nothing, when the caller may not (not the database''s owner). Run by migrate and by the service when it makes its login roles.';
revoke execute on function crm.admit_to_database(p_logins text[]) from public;

-- ALTER ... OWNER locks its table as ALTER TABLE does, and the service keeps serving while a
-- migration runs: like a migration file, it fails the run after waiting 5 s for a lock rather than
-- queue every request behind a long read (only the first run after an upgrade has tables to hand
-- over).
create function crm.disown_superuser_objects() returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
set lock_timeout = '5s'
as $$
declare
  v_statement text;
  v_count integer := 0;
begin
  -- Only a superuser can hand a superuser's objects away; the objects of an owner that is no
  -- superuser are left with it.
  if not (select r.rolsuper from pg_roles r where r.rolname = current_user) then
    return 0;
  end if;
  for v_statement in
    with schemas as (
      select n.oid from pg_namespace n where n.nspname in ('crm', 'graphile_worker')
    ), superusers as (
      select r.oid from pg_roles r where r.rolsuper
    )
    select format('alter schema %I owner to crm_owner', n.nspname)
      from pg_namespace n
     where n.oid in (select oid from schemas) and n.nspowner in (select oid from superusers)
    union all
    -- Indexes and the sequences a column owns follow their table; a composite type is a type.
    select format('alter %s %s owner to crm_owner',
                  case c.relkind when 'v' then 'view' when 'm' then 'materialized view'
                                 when 'S' then 'sequence' when 'f' then 'foreign table' else 'table' end,
                  c.oid::regclass)
      from pg_class c
     where c.relnamespace in (select oid from schemas) and c.relowner in (select oid from superusers)
       and c.relkind in ('r', 'p', 'v', 'm', 'S', 'f')
       and not exists (
         select from pg_depend d
          where d.classid = 'pg_class'::regclass and d.objid = c.oid
            and d.refclassid = 'pg_class'::regclass and d.deptype in ('a', 'i')
       )
    union all
    select format('alter %s %s owner to crm_owner',
                  case p.prokind when 'p' then 'procedure' when 'a' then 'aggregate' else 'function' end,
                  p.oid::regprocedure)
      from pg_proc p
     where p.pronamespace in (select oid from schemas) and p.proowner in (select oid from superusers)
    union all
    -- Array types follow their element type, a table's row type its table.
    select format('alter type %s owner to crm_owner', t.oid::regtype)
      from pg_type t
     where t.typnamespace in (select oid from schemas) and t.typowner in (select oid from superusers)
       and t.typtype in ('c', 'd', 'e', 'r')
       and (t.typtype <> 'c' or (select c.relkind from pg_class c where c.oid = t.typrelid) = 'c')
  loop
    execute v_statement;
    v_count := v_count + 1;
  end loop;
  return v_count;
end
$$;
comment on function crm.disown_superuser_objects() is
  'Gives crm_owner every object of crm and graphile_worker (the schemas included) that a superuser owns, so that no SECURITY DEFINER function runs as a superuser; answers how many it changed. Run by migrate after every migration run.';
revoke execute on function crm.disown_superuser_objects() from public;

revoke update (password_hash) on crm.users from crm_api;
comment on policy users_update_self on crm.users is 'A user changes only their own name (a password is set by the owner''s functions).';
