-- Foundation: the roles the schema grants to, the extensions, the schema itself, and the tables
-- every area uses (the worker's heartbeats). The migration ledger (crm.schema_migrations,
-- crm.schema_definitions) is made by the migrator itself (src/db/migrate.ts) before any file.
-- The first migrations make every table and index of the schema by area, as they stood when the
-- numbered files were folded; later ones change them. Functions, views, policies, triggers, grants
-- and comments are not here: each is defined once in sql/definitions/ (sql/CONVENTIONS.md).

set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- The roles. crm_api is NOLOGIN: requests switch to it inside their transaction, so a request never
-- sees more than the policies allow, even through a bug in TypeScript. crm_runtime is the login role
-- requests run as (a member of crm_api, owning nothing; its limits are role settings, which no pooler
-- can drop). crm_owner owns the schema's objects and runs its SECURITY DEFINER functions; crm_worker
-- is the worker's login role, NOINHERIT: it holds only what is granted to it by name. The service
-- gives the login roles their passwords when it starts (src/db/runtime-role.ts).
do $$
begin
  if not exists (select from pg_roles where rolname = 'crm_api') then
    create role crm_api nologin;
  end if;
  if not exists (select from pg_roles where rolname = 'crm_runtime') then
    create role crm_runtime login inherit nosuperuser nobypassrls nocreatedb nocreaterole;
  end if;
  if not exists (select from pg_roles where rolname = 'crm_owner') then
    create role crm_owner nologin noinherit nosuperuser nobypassrls nocreatedb nocreaterole;
  end if;
  if not exists (select from pg_roles where rolname = 'crm_worker') then
    create role crm_worker login noinherit nosuperuser nobypassrls nocreatedb nocreaterole;
  end if;
end
$$;
grant crm_api to current_user;
grant crm_owner to current_user;
grant crm_api to crm_runtime;
grant crm_api to crm_worker;
alter role crm_runtime set statement_timeout = '30s';
alter role crm_runtime set idle_in_transaction_session_timeout = '60s';
-- A job transaction left open by a stuck task would hold its locks: ended after five minutes.
alter role crm_worker set idle_in_transaction_session_timeout = '5min';

-- The request context's fast carrier needs the owner to set backtrace_functions, which only a
-- superuser can grant (the embedded PostgreSQL's owner is one). Elsewhere the keyed proof carries it
-- (src/db/request-context.ts); a superuser may grant this later and migrate again.
do $$
begin
  if (select rolsuper from pg_catalog.pg_roles where rolname = current_user) then
    grant set on parameter backtrace_functions to crm_owner;
  end if;
end
$$;

-- pgcrypto: hmac() for the request-context proof and digest(); pg_trgm: fuzzy search. Both are
-- trusted extensions (PostgreSQL 13+), so a database owner without superuser can add them.
create extension if not exists pgcrypto;
create extension if not exists pg_trgm;

create schema if not exists crm;
comment on schema crm is 'CRM data and rules. Every table has row-level security; the API runs as crm_api.';

create table crm.worker_heartbeats (
  worker_id text not null,
  started_at timestamp with time zone default now() not null,
  beat_at timestamp with time zone default now() not null,
  host text,
  constraint worker_heartbeats_pkey PRIMARY KEY (worker_id)
);
alter table crm.worker_heartbeats enable row level security;
alter table crm.worker_heartbeats force row level security;
