-- crm.write_context, which crm.authenticate and crm.resume_identity call once per request to set
-- the request context, becomes an SQL function with a return body (it was PL/pgSQL with a SET
-- clause). PostgreSQL inlines such a function into its caller's PERFORM: the call becomes the
-- set_config call itself, evaluated as a simple expression, without a PL/pgSQL call and its
-- search_path save and restore. It now returns set_config's text, which PERFORM discards.
--
-- Measured with pgbench (PostgreSQL 15, 200,000 deals, two clients, three rounds of 5 s in
-- turns, µs per statement): crm.resume_identity's lookup and context write as a statement of its
-- own 36.4 with the PL/pgSQL writer, 33.9 with this one, the same as set_config written in place.
--
-- On the keyed-proof path (sql/000025) the writer stays PL/pgSQL, answering text too: its key is
-- read by a sub-select, and PostgreSQL never inlines a function whose body holds one.
--
-- crm.install_context_carrier defines the writer of the path in use; this version also defines it
-- again when the writer there still answers void (a database migrated before this file), on
-- either path, and redefines the policy helpers only when the path changed, as before.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.install_context_carrier(p_mode text) returns text
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_carrier boolean := p_mode is distinct from 'keyed_proof'
                       and pg_catalog.has_parameter_privilege('backtrace_functions', 'SET');
  -- Read from the newest helper: a database that lacks it (migrated before it existed) gets every
  -- helper defined again, whichever path it is on.
  v_installed boolean := (select position('backtrace_functions' in pg_catalog.pg_get_function_sqlbody(p.oid)) > 0
                            from pg_catalog.pg_proc p where p.oid = pg_catalog.to_regprocedure('crm.current_oauth_grant_id()'));
  -- The writer as sql/000032 defines it, answering text (before, void).
  v_writer_current boolean := coalesce((select p.prorettype = 'pg_catalog.text'::pg_catalog.regtype
                                          from pg_catalog.pg_proc p where p.oid = pg_catalog.to_regprocedure('crm.write_context(text)')), false);
  v_source text;
begin
  if p_mode is not null and p_mode not in ('auto', 'keyed_proof') then
    raise exception 'context carrier mode must be auto or keyed_proof, not %', p_mode;
  end if;
  if v_carrier is not distinct from v_installed and v_writer_current then
    return case when v_carrier then 'parameter' else 'keyed_proof' end;
  end if;
  -- The writer is dropped and made again: its return type changed (void, then text) in
  -- sql/000032, and CREATE OR REPLACE cannot change one. Nothing depends on it by catalog: its
  -- callers are PL/pgSQL.
  drop function if exists crm.write_context(text);
  if v_carrier then
    v_source := 'pg_catalog.current_setting(''backtrace_functions'')';
    create or replace function crm.context_text() returns text
    language sql stable
    return case when pg_catalog.split_part(pg_catalog.current_setting('backtrace_functions'), ' ', 1) = 'crm_context'
                then pg_catalog.current_setting('backtrace_functions') end;
    create function crm.write_context(p_context text) returns text
    language sql volatile
    return pg_catalog.set_config('backtrace_functions', p_context, true);
  else
    v_source := 'crm.context_text()';
    -- The proof binds the text to this backend and this transaction's start, with a key crm_api
    -- cannot read: settings set by hand, or copied from another transaction, prove nothing.
    create or replace function crm.context_text() returns text
    language sql stable security definer
    set search_path = pg_catalog, crm, pg_temp
    as $body$
      select c.t from (select current_setting('crm.context', true) as t) c
       where encode(public.hmac(convert_to(c.t || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8'),
                                (select k.value from crm.internal_secrets k where k.name = 'context_proof'), 'sha256'), 'hex')
             = current_setting('crm.context_proof', true)
    $body$;
    -- PL/pgSQL here: the key is read by a sub-select, and a function whose body holds one is
    -- never inlined (a plain SQL function would be planned on every call before PostgreSQL 18).
    create function crm.write_context(p_context text) returns text
    language plpgsql
    set search_path = pg_catalog, crm, pg_temp
    as $body$
    begin
      perform set_config('crm.context', p_context, true);
      return set_config('crm.context_proof', encode(public.hmac(
        convert_to(p_context || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8'),
        (select k.value from crm.internal_secrets k where k.name = 'context_proof'), 'sha256'), 'hex'), true);
    end
    $body$;
  end if;
  comment on function crm.write_context(text) is
    'Writes the request context for the rest of the transaction (carrier or keyed proof, as crm.install_context_carrier chose); answers set_config''s text. Internal.';
  revoke execute on function crm.write_context(text) from public;
  if v_carrier is not distinct from v_installed then
    return case when v_carrier then 'parameter' else 'keyed_proof' end;
  end if;
  execute format($ddl$
    create or replace function crm.current_user_id() returns uuid
    language sql stable
    return nullif(pg_catalog.split_part(%1$s, ' ', 2), '')::uuid;

    create or replace function crm.current_workspace_id() returns uuid
    language sql stable
    return nullif(pg_catalog.split_part(%1$s, ' ', 3), '')::uuid;

    create or replace function crm.current_oauth_app_id() returns uuid
    language sql stable
    return nullif(nullif(pg_catalog.split_part(%1$s, ' ', 4), '0'), '')::uuid;

    create or replace function crm.current_via() returns text
    language sql stable
    return coalesce(pg_catalog.convert_from(pg_catalog.decode(nullif(pg_catalog.split_part(%1$s, ' ', 5), ''), 'hex'), 'UTF8'), 'system');

    -- Without a context: the empty list, which allows nothing; null for an unscoped token.
    create or replace function crm.current_scopes() returns text[]
    language sql stable
    return case coalesce(pg_catalog.split_part(%1$s, ' ', 6), '')
             when '' then '{}'::text[]
             when 'n' then null
             else pg_catalog.convert_from(pg_catalog.decode(pg_catalog.split_part(%1$s, ' ', 6), 'hex'), 'UTF8')::text[]
           end;

    create or replace function crm.grant_scope(p_resource text, p_action text) returns text
    language sql stable
    return nullif(pg_catalog.split_part(pg_catalog.split_part(pg_catalog.split_part(%1$s, ' ', 8),
                                                              ',' || p_resource || '_' || p_action || '_', 2), ',', 1), '');

    create or replace function crm.scope_owner_ids(p_resource text, p_action text) returns uuid[]
    language sql stable
    return case pg_catalog.split_part(pg_catalog.split_part(pg_catalog.split_part(%1$s, ' ', 8),
                                                            ',' || p_resource || '_' || p_action || '_', 2), ',', 1)
             when 'own' then array[nullif(pg_catalog.split_part(%1$s, ' ', 2), '')::uuid]
             when 'team' then pg_catalog.string_to_array(pg_catalog.split_part(%1$s, ' ', 9), ',')::uuid[]
             else '{}'::uuid[]
           end;

    create or replace function crm.current_token_id() returns uuid
    language sql stable
    return nullif(nullif(pg_catalog.split_part(%1$s, ' ', 10), '0'), '')::uuid;

    create or replace function crm.current_oauth_grant_id() returns uuid
    language sql stable
    return nullif(nullif(pg_catalog.split_part(%1$s, ' ', 11), '0'), '')::uuid;

    create or replace function crm.is_admin() returns boolean
    language sql stable
    return coalesce(pg_catalog.split_part(%1$s, ' ', 7) = '1', false);

    create or replace function crm.is_admin_for(p_scope text) returns boolean
    language sql stable
    return coalesce(pg_catalog.split_part(%1$s, ' ', 7) = '1'
                    and (pg_catalog.split_part(%1$s, ' ', 6) = 'n'
                         or p_scope = any (pg_catalog.convert_from(pg_catalog.decode(
                                             nullif(nullif(pg_catalog.split_part(%1$s, ' ', 6), 'n'), ''), 'hex'), 'UTF8')::text[])),
                    false);
  $ddl$, v_source);
  return case when v_carrier then 'parameter' else 'keyed_proof' end;
end
$$;
comment on function crm.install_context_carrier(text) is
  'Makes the request context travel in backtrace_functions when the owner may set it (GRANT SET ON PARAMETER ... TO crm_owner) and p_mode is not keyed_proof, else in crm.context with its keyed proof, and defines the policy helpers that read it; answers parameter or keyed_proof. Run by every migration run.';

comment on function crm.install_context_carrier(text) is
  'Makes the request context travel in backtrace_functions when the owner may set it (GRANT SET ON PARAMETER ... TO crm_owner) and p_mode is not keyed_proof, else in crm.context with its keyed proof, and defines the writer (crm.write_context) and the policy helpers that read it; answers parameter or keyed_proof. Run by every migration run.';

-- This database's path, with the new writer.
select crm.install_context_carrier(case when pg_catalog.strpos(pg_catalog.pg_get_function_sqlbody('crm.current_oauth_grant_id()'::pg_catalog.regprocedure),
                                                                 'backtrace_functions') > 0
                                          then 'auto' else 'keyed_proof' end);
