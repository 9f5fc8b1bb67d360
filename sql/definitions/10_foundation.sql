-- Foundation: ids by time, the API's timestamps, the worker's heartbeats, the job queue's grants, housekeeping.
-- Applied by `crm migrate` whenever a file of sql/definitions/ changes, as a whole and in file order
-- (sql/CONVENTIONS.md): edit the definition here; it is the only one.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

grant usage on schema crm to crm_api;
grant usage on schema crm to crm_worker;

create or replace function crm.uuid_v7_floor(t timestamp with time zone)
 returns uuid
 language sql
 immutable parallel safe
as $function$
  select (lpad(to_hex((extract(epoch from t) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid
$function$;
comment on function crm.uuid_v7_floor(t timestamp with time zone) is
  'The lowest crm.uuid_v7() value of a millisecond (deliveries_24h counts by id range).';
grant execute on function crm.uuid_v7_floor(t timestamp with time zone) to crm_api;

create or replace function crm.api_time(value timestamp with time zone)
 returns text
 language sql
 stable parallel safe
return to_char((value AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'::text);
comment on function crm.api_time(value timestamp with time zone) is
  'A timestamp as the API writes it: RFC 3339, UTC, milliseconds (2026-11-22T03:00:21.123Z). The JSON functions below '
  'spell the same to_char out inline (one inlining step less per query).';
grant execute on function crm.api_time(value timestamp with time zone) to crm_api;

create or replace function crm.tg__touch_updated_at()
 returns trigger
 language plpgsql
as $function$
begin
  new.updated_at := now();
  return new;
end
$function$;
comment on function crm.tg__touch_updated_at() is 'BEFORE UPDATE trigger: sets updated_at to the transaction time.';

create or replace function crm.worker_heartbeat(p_worker_id text, p_host text, p_stale_after interval)
 returns text[]
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_dead text[];
begin
  insert into crm.worker_heartbeats as h (worker_id, host) values (p_worker_id, p_host)
  on conflict (worker_id) do update set beat_at = now();
  with stale as (
    delete from crm.worker_heartbeats h where h.beat_at < now() - p_stale_after returning h.worker_id
  )
  select array_agg(worker_id) into v_dead from (
    select worker_id from stale
    union
    select j.locked_by from graphile_worker._private_jobs j
     where j.locked_by is not null and j.locked_at < now() - p_stale_after
       and not exists (select 1 from crm.worker_heartbeats h where h.worker_id = j.locked_by)
    union
    select q.locked_by from graphile_worker._private_job_queues q
     where q.locked_by is not null and q.locked_at < now() - p_stale_after
       and not exists (select 1 from crm.worker_heartbeats h where h.worker_id = q.locked_by)
  ) dead;
  if v_dead is not null then
    perform graphile_worker.force_unlock_workers(v_dead);
  end if;
  return coalesce(v_dead, '{}');
end
$function$;
comment on function crm.worker_heartbeat(p_worker_id text, p_host text, p_stale_after interval) is
  'Records a beat of one worker pool and force-unlocks the jobs of pools silent for longer than p_stale_after; '
  'returns the ids it unlocked.';
grant execute on function crm.worker_heartbeat(p_worker_id text, p_host text, p_stale_after interval) to crm_worker;

create or replace function crm.worker_stopped(p_worker_id text)
 returns void
 language sql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  delete from crm.worker_heartbeats where worker_id = p_worker_id
$function$;
comment on function crm.worker_stopped(p_worker_id text) is
  'A pool that shut down cleanly (its jobs already released) leaves the heartbeat table.';
grant execute on function crm.worker_stopped(p_worker_id text) to crm_worker;

create or replace function crm.grant_job_queue_to_worker()
 returns void
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_table regclass;
begin
  if to_regnamespace('graphile_worker') is null then
    return;
  end if;
  grant usage on schema graphile_worker to crm_worker;
  grant select on all tables in schema graphile_worker to crm_worker;
  grant usage on all sequences in schema graphile_worker to crm_worker;
  grant execute on all functions in schema graphile_worker to crm_worker;
  for v_table in
    select c.oid::regclass from pg_class c
     where c.relnamespace = 'graphile_worker'::regnamespace and c.relkind = 'r' and c.relrowsecurity
  loop
    execute format('grant insert, update, delete on %s to crm_worker', v_table);
    if not exists (select from pg_policy p where p.polrelid = v_table and p.polname = 'crm_worker_all') then
      execute format('create policy crm_worker_all on %s for all to crm_worker using (true) with check (true)', v_table);
    end if;
  end loop;
end
$function$;
comment on function crm.grant_job_queue_to_worker() is
  'Gives crm_worker graphile-worker''s queue (schema, tables with a policy each, sequences, functions); run by '
  'migrate after graphile-worker''s migrations.';

create or replace function crm.admit_to_database(p_logins text[])
 returns boolean
 language plpgsql
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
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
$function$;
comment on function crm.admit_to_database(p_logins text[]) is
  'Grants CONNECT on this database to the given login roles (those that exist) and takes it from PUBLIC and the '
  'shared groups, so that no other database''s login roles (members of the same cluster-wide groups) connect here; '
  'answers false, changing nothing, when the caller may not (not the database''s owner). Run by migrate and by the '
  'service when it makes its login roles.';

create or replace function crm.disown_superuser_objects()
 returns integer
 language plpgsql
 set search_path to 'pg_catalog', 'pg_temp'
 set lock_timeout to '5s'
as $function$
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
$function$;
comment on function crm.disown_superuser_objects() is
  'Gives crm_owner every object of crm and graphile_worker (the schemas included) that a superuser owns, so that no '
  'SECURITY DEFINER function runs as a superuser; answers how many it changed. Run by migrate after every migration '
  'run.';

create or replace function crm.housekeeping(log_retention_days integer)
 returns table(step text, removed bigint)
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_function text;
begin
  for v_function in
    select format('crm.%I', p.proname) from pg_proc p
    where p.pronamespace = 'crm'::regnamespace and p.proname like 'prune\_%'
      and p.pronargs = 1 and p.proargtypes[0] = 'integer'::regtype
    order by p.proname
  loop
    step := v_function;
    execute format('select %s($1)', v_function) into removed using log_retention_days;
    return next;
  end loop;
end
$function$;
comment on function crm.housekeeping(log_retention_days integer) is
  'Removes expired rows (tokens, idempotency keys, old delivery logs); returns a count per step. Events are never '
  'removed: record history (crm.record_history) reads every change from them; the events feed shows the last '
  'EVENTS_RETENTION_DAYS of them.';
grant execute on function crm.housekeeping(log_retention_days integer) to crm_worker;

grant select (number) on crm.schema_migrations to crm_runtime;
grant select (name, variant) on crm.schema_definitions to crm_runtime;

comment on table crm.worker_heartbeats is
  'One row per live graphile-worker pool (its locked_by id); the owner role only.';
create policy worker_heartbeats_all_owner on crm.worker_heartbeats as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy worker_heartbeats_all_owner on crm.worker_heartbeats is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
