-- The request context carried where only the owner's code can put it, and the grants decided once
-- per request (DESIGN.md: the context carrier).
--
-- A built-in parameter whose context is superuser, granted with GRANT SET ON PARAMETER to
-- crm_owner, can be set with set_config(..., true) by the owner's SECURITY DEFINER functions and by
-- no one else: crm_api is refused through SET, SET LOCAL, set_config, a function's SET clause,
-- ALTER ROLE ... SET and the startup packet; RESET ALL and DISCARD ALL only clear it. It reverts at
-- commit, rollback and rollback to savepoint. Custom crm.* placeholders do not behave so.
-- backtrace_functions is such a parameter; it takes only [A-Za-z0-9_, \t\n], so every value in it
-- is hex or a fixed word. test/privilege/context-carrier.test.ts proves all of this.
--
-- crm.authenticate and crm.resume_identity (through crm.put_context) write the whole context once:
-- user, workspace, OAuth app, via, the token's scopes, the admin flag, the role's grants already
-- narrowed by the token's scopes, and the team when a grant needs it. The policy helpers are
-- inlinable SQL reads of it, so every policy inlines on PostgreSQL 15 to 18.
--
-- Where the grant cannot be made (a managed service that refuses it, or CONTEXT_CARRIER=keyed_proof),
-- the same text is kept in crm.context with an HMAC over it, this backend and this transaction in
-- crm.context_proof, as before; crm.context_text checks it. crm.install_context_carrier chooses,
-- and defines the reader, the writer and the helpers for the path chosen.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- Made once, by a superuser (the embedded PostgreSQL's owner is one). Elsewhere PostgreSQL answers a
-- warning or an error and the keyed proof stays (crm.install_context_carrier).
do $$
begin
  if (select rolsuper from pg_catalog.pg_roles where rolname = current_user) then
    grant set on parameter backtrace_functions to crm_owner;
  end if;
end
$$;

-- Fields, separated by one space (crm.context_field): 1 the word crm_context, 2 user, 3 workspace,
-- 4 OAuth app or 0, 5 via (hex), 6 the token's scopes (hex of the array's text) or n for an
-- unscoped token, 7 the role's admin flag (1 or 0), 8 the grants ",resource_action_scope,...",
-- 9 the team's user ids (comma-separated) when a grant is team, else 0. Uuids are written as their
-- 32 hex digits, which the uuid type reads back. The helpers read fields 2 to 9 directly: on the
-- carrier path nothing but the owner's code (or a superuser) can have put a value there.

-- The carrier path's reader; crm.install_context_carrier replaces it with the keyed proof's when
-- the owner cannot set the parameter.
create function crm.context_text() returns text
language sql stable
return case when pg_catalog.split_part(pg_catalog.current_setting('backtrace_functions'), ' ', 1) = 'crm_context'
            then pg_catalog.current_setting('backtrace_functions') end;
comment on function crm.context_text() is
  'This transaction''s request context as crm.put_context wrote it, or null. Inlined (carrier: backtrace_functions, which only the owner''s code can set) or SECURITY DEFINER (keyed proof: crm.context checked against its HMAC); crm.install_context_carrier decides.';
revoke execute on function crm.context_text() from public;
grant execute on function crm.context_text() to crm_api;

create function crm.context_field(p_field integer) returns text
language sql stable
return pg_catalog.split_part(crm.context_text(), ' ', p_field);
comment on function crm.context_field(integer) is 'One field of the request context (null without one); the fields are listed in sql/000025_context_carrier.sql.';
revoke execute on function crm.context_field(integer) from public;
grant execute on function crm.context_field(integer) to crm_api;

-- The carrier path's writer (owner only: it runs inside the owner's SECURITY DEFINER functions).
create function crm.write_context(p_context text) returns void
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  perform set_config('backtrace_functions', p_context, true);
end
$$;
comment on function crm.write_context(text) is 'Writes the request context for the rest of the transaction (carrier or keyed proof, as crm.install_context_carrier chose). Internal.';
revoke execute on function crm.write_context(text) from public;

-- Chooses the carrier when the owner may set the parameter, unless p_mode is keyed_proof, and
-- defines the reader, the writer and the policy helpers for it; answers the path in use. Nothing is
-- redefined while the path stays the same.
--
-- The helpers are SQL functions with a return body, not SECURITY DEFINER, without SET clauses, so
-- PostgreSQL inlines them into every policy. Each reads its fields from the context in one level
-- (%1$s below): planning a statement inlines every helper of its policies, and each nested
-- function would be one more inlining step per statement planned.
create function crm.install_context_carrier(p_mode text) returns text
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_carrier boolean := p_mode is distinct from 'keyed_proof'
                       and pg_catalog.has_parameter_privilege('backtrace_functions', 'SET');
  v_installed boolean := (select position('backtrace_functions' in pg_catalog.pg_get_function_sqlbody(p.oid)) > 0
                            from pg_catalog.pg_proc p where p.oid = 'crm.current_user_id()'::regprocedure);
  v_source text;
begin
  if p_mode is not null and p_mode not in ('auto', 'keyed_proof') then
    raise exception 'context carrier mode must be auto or keyed_proof, not %', p_mode;
  end if;
  if v_carrier is not distinct from v_installed then
    return case when v_carrier then 'parameter' else 'keyed_proof' end;
  end if;
  if v_carrier then
    v_source := 'pg_catalog.current_setting(''backtrace_functions'')';
    create or replace function crm.context_text() returns text
    language sql stable
    return case when pg_catalog.split_part(pg_catalog.current_setting('backtrace_functions'), ' ', 1) = 'crm_context'
                then pg_catalog.current_setting('backtrace_functions') end;
    create or replace function crm.write_context(p_context text) returns void
    language plpgsql
    set search_path = pg_catalog, crm, pg_temp
    as $body$
    begin
      perform set_config('backtrace_functions', p_context, true);
    end
    $body$;
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
    create or replace function crm.write_context(p_context text) returns void
    language plpgsql
    set search_path = pg_catalog, crm, pg_temp
    as $body$
    begin
      perform set_config('crm.context', p_context, true);
      perform set_config('crm.context_proof', encode(public.hmac(
        convert_to(p_context || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8'),
        (select k.value from crm.internal_secrets k where k.name = 'context_proof'), 'sha256'), 'hex'), true);
    end
    $body$;
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
revoke execute on function crm.install_context_carrier(text) from public;

select crm.install_context_carrier('auto');
comment on function crm.grant_scope(text, text) is
  'The scope (own, team, all) the current member''s role grants for resource:action, or null; null too when the token''s scopes do not cover the action. As of the request''s authentication (crm.put_context).';
comment on function crm.scope_owner_ids(text, text) is
  'The owners whose records the current member''s scope for resource:action covers: {me} for own, the team (me included) for team, {} for all or no grant. As of the request''s authentication.';

-- What the helpers read, written once per transaction: the member's active membership gives the
-- admin flag and the grants, narrowed here by the token's scopes; the team only when a grant is
-- team. PL/pgSQL: its statements are planned once per connection, on every version.
create function crm.put_context(p_user_id uuid, p_workspace_id uuid, p_via text, p_scopes text[], p_oauth_app_id uuid)
returns boolean
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_admin boolean;
  v_grants text;
  v_team boolean;
  v_team_ids text := '0';
begin
  select r.is_admin,
         coalesce(',' || string_agg(g.resource || '_' || g.action || '_' || g.scope, ',') || ',', ','),
         coalesce(bool_or(g.scope = 'team'), false)
    into v_admin, v_grants, v_team
    from crm.memberships m
    join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
    left join crm.role_grants g on g.workspace_id = m.workspace_id and g.role_id = m.role_id
                               and crm.scopes_cover(p_scopes, g.resource, g.action)
   where m.workspace_id = p_workspace_id and m.user_id = p_user_id and m.suspended_at is null
   group by r.is_admin;
  if v_team then
    v_team_ids := array_to_string(array(select replace(t::text, '-', '') from unnest(crm.team_user_ids(p_user_id, p_workspace_id)) t), ',');
  end if;
  perform crm.write_context(concat_ws(' ', 'crm_context', replace(p_user_id::text, '-', ''), replace(p_workspace_id::text, '-', ''),
    coalesce(replace(p_oauth_app_id::text, '-', ''), '0'), encode(convert_to(coalesce(p_via, 'api'), 'UTF8'), 'hex'),
    coalesce(encode(convert_to(p_scopes::text, 'UTF8'), 'hex'), 'n'), case when v_admin then '1' else '0' end,
    coalesce(v_grants, ','), v_team_ids));
  return true;
end
$$;
comment on function crm.put_context(uuid, uuid, text, text[], uuid) is
  'Writes the request context: user, workspace, OAuth app, via, token scopes, the active membership''s admin flag, its role''s grants narrowed by the scopes, and the team when a grant is team. Grants hold for the transaction as of this call. Internal.';
revoke execute on function crm.put_context(uuid, uuid, text, text[], uuid) from public;

create or replace function crm.set_context(p_user_id uuid, p_workspace_id uuid, p_via text, p_scopes text[], p_oauth_app_id uuid)
returns void
language plpgsql security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  perform crm.put_context(p_user_id, p_workspace_id, p_via, p_scopes, p_oauth_app_id);
end
$$;

-- The helpers are defined by crm.install_context_carrier (above), one level deep each.

-- Import batches: the import id and its proof are set by crm.begin_import_batch; only a transaction
-- that has one pays for the check.
create function crm.proven_import_id() returns uuid
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_import text := nullif(current_setting('crm.import_id', true), '');
begin
  if v_import is null or v_import !~ '^[0-9a-f-]{36}$' or crm.current_user_id() is null then
    return null;
  end if;
  if crm.import_proof(v_import::uuid) is distinct from current_setting('crm.import_proof', true) then
    return null;
  end if;
  return v_import::uuid;
end
$$;
comment on function crm.proven_import_id() is 'The import id crm.begin_import_batch set when its proof checks out, else null (crm.current_import_id).';
revoke execute on function crm.proven_import_id() from public;
grant execute on function crm.proven_import_id() to crm_api;

create or replace function crm.current_import_id() returns uuid
language sql stable
return case when nullif(pg_catalog.current_setting('crm.import_id', true), '') is not null then crm.proven_import_id() end;

-- These read other members' rows, so they run as the owner: PL/pgSQL, planned once per connection.
create or replace function crm.current_team_user_ids() returns uuid[]
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  return case when crm.current_user_id() is not null then crm.team_user_ids(crm.current_user_id(), crm.current_workspace_id()) end;
end
$$;

create or replace function crm.colleague_ids() returns uuid[]
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  return array(select m.user_id from crm.memberships m where m.workspace_id = crm.current_workspace_id());
end
$$;

create or replace function crm.my_workspace_ids() returns uuid[]
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  return array(select m.workspace_id from crm.memberships m
                where m.user_id = crm.current_user_id()
                  and (crm.current_oauth_app_id() is null or m.workspace_id = crm.current_workspace_id()));
end
$$;

create or replace function crm.verified_context(out user_id uuid, out workspace_id uuid, out scopes text[], out oauth_app_id uuid)
language plpgsql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  user_id := crm.current_user_id();
  workspace_id := crm.current_workspace_id();
  scopes := case when user_id is not null then crm.current_scopes() end;
  oauth_app_id := crm.current_oauth_app_id();
end
$$;

-- The scope tests name the scopes once: PostgreSQL does not inline a function whose argument is a
-- sub-select, as policies pass (select crm.current_scopes()), when the body reads it twice.
create or replace function crm.scopes_cover(p_scopes text[], p_resource text, p_action text) returns boolean
language sql immutable parallel safe
return coalesce(p_scopes operator(pg_catalog.&&) array[p_resource || ':write',
                                                       case when p_action in ('view', 'export') then p_resource || ':read' end], true);

create or replace function crm.scopes_cover_link(p_scopes text[], p_contact_id uuid, p_company_id uuid, p_deal_id uuid) returns boolean
language sql immutable parallel safe
return coalesce(p_scopes operator(pg_catalog.&&) array[case when p_contact_id is not null then 'contacts:write' end,
                                                       case when p_company_id is not null then 'companies:write' end,
                                                       case when p_deal_id is not null then 'deals:write' end], true);

create or replace function crm.scopes_include(p_scopes text[], p_scope text) returns boolean
language sql immutable parallel safe
return coalesce(p_scope = any (p_scopes), true);

create or replace function crm.proven_context()
returns table (user_id uuid, workspace_id uuid, scopes text[], oauth_app_id uuid)
language sql stable rows 1
as $$
  select crm.current_user_id(), crm.current_workspace_id(),
         case when crm.current_user_id() is not null then crm.current_scopes() end, crm.current_oauth_app_id()
$$;
comment on function crm.proven_context() is
  'The (user, workspace, token scopes, OAuth app) of this transaction''s context; nulls without one (internal).';

-- ---------------------------------------------------------------------------------------------
-- Authentication: PL/pgSQL (planned once per connection on every version), the context written
-- by crm.put_context. The queries are 000016's.
-- ---------------------------------------------------------------------------------------------

create or replace function crm.authenticate(p_token_hash bytea, p_slug text, p_via text, p_rate_limit integer)
returns table (failure text, user_id uuid, workspace_id uuid, workspace_slug text, token_id uuid, token_kind text,
               is_admin boolean, rate_count integer, rate_reset_seconds integer, scopes text[], oauth_app_id uuid,
               access_version bigint)
language plpgsql security definer rows 1
set search_path = pg_catalog, crm, pg_temp
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
#variable_conflict use_column
begin
  return query
  with caller as (
    select t.id as token_id, t.kind, t.revoked_at, t.expires_at, t.last_used_at, t.scopes, t.oauth_app_id,
           t.workspace_id as bound_workspace_id,
           u.id as user_id, u.suspended_at, u.api_access, u.last_workspace_id
      from crm.tokens t join crm.users u on u.id = t.user_id
     where t.token_hash = p_token_hash
  ),
  -- The workspace named by the slug; without one, the last used, else the oldest joined, an active
  -- membership preferred over a suspended one. A bound token knows only its workspace.
  member as (
    select m.workspace_id, m.suspended_at, m.access_version, w.slug, r.is_admin
      from caller c
      join crm.memberships m on m.user_id = c.user_id
      join crm.workspaces w on w.id = m.workspace_id
      join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
     where (p_slug is null or w.slug = p_slug)
       and (c.bound_workspace_id is null or m.workspace_id = c.bound_workspace_id)
     order by (m.workspace_id = c.last_workspace_id) desc nulls last, (m.suspended_at is null) desc, m.joined_at
     limit 1
  ),
  verdict as (
    select c.token_id, c.kind, c.last_used_at, c.user_id, c.last_workspace_id, c.scopes, c.oauth_app_id,
           m.workspace_id, m.slug, m.is_admin, m.access_version,
           case
             when c.user_id is null then 'token_invalid'
             when c.revoked_at is not null then 'token_revoked'
             when c.expires_at <= now() then 'token_expired'
             -- A UI session works only through the UI (its cookie); copied into an Authorization
             -- header it is refused, so turning API access off cannot be side-stepped with it.
             when c.kind = 'session' and p_via is distinct from 'ui' then 'token_invalid'
             when c.suspended_at is not null then 'user_suspended'
             when c.kind in ('token', 'oauth') and not c.api_access then 'api_access_disabled'
             when m.workspace_id is null then 'workspace_not_found'
             when m.suspended_at is not null then 'user_suspended'
           end as failure
      from (select) as always_one_row
      left join caller c on true
      left join member m on true
  ),
  -- A request that passed the checks counts: this backend's counter goes up, and the other
  -- counters for the same user and minute are added (this statement's snapshot does not see its
  -- own insert, so the new count comes from RETURNING). Counted per user, whatever the token.
  bumped as (
    insert into crm.rate_limit_counters as rc (user_id, window_start, backend_pid, count)
    select v.user_id, date_trunc('minute', now()), pg_backend_pid(), 1 from verdict v where v.failure is null
    on conflict (user_id, window_start, backend_pid) do update set count = rc.count + 1
    returning rc.count
  ),
  counted as (
    select v.*, (select b.count from bumped b) + coalesce((
             select sum(o.count)::integer from crm.rate_limit_counters o
              where o.user_id = v.user_id and o.window_start = date_trunc('minute', now()) and o.backend_pid <> pg_backend_pid()), 0) as rate_count
      from verdict v
  ),
  admitted as materialized (
    select k.* from counted k where k.failure is null and k.rate_count <= p_rate_limit
  ),
  -- The context and the bookkeeping when it changes. A CTE with volatile calls is materialized,
  -- so it runs once, and only for an admitted caller.
  context as materialized (
    select crm.put_context(a.user_id, a.workspace_id, p_via, a.scopes, a.oauth_app_id) as written,
           case when a.last_workspace_id is distinct from a.workspace_id
                  or a.last_used_at is null or a.last_used_at < now() - interval '1 minute'
                then crm.touch_caller(a.user_id, a.workspace_id, a.last_workspace_id is distinct from a.workspace_id,
                                      a.token_id, a.last_used_at is null or a.last_used_at < now() - interval '1 minute')
                else true
           end as touched
      from admitted a
  )
  select coalesce(k.failure, case when k.rate_count > p_rate_limit then 'rate_limited' end),
         case when x.written and x.touched then a.user_id end,
         a.workspace_id, a.slug, a.token_id, a.kind, a.is_admin,
         k.rate_count,
         greatest(1, ceil(extract(epoch from (date_trunc('minute', now()) + interval '1 minute' - now())))::integer),
         a.scopes, a.oauth_app_id, a.access_version
    from counted k
    left join admitted a on true
    left join context x on true;
end
$$;

create or replace function crm.resume_identity(p_token_hash bytea, p_workspace_id uuid, p_access_version bigint, p_via text,
                                               p_follows_last_workspace boolean)
returns table (failure text, user_id uuid)
language plpgsql security definer rows 1
set search_path = pg_catalog, crm, pg_temp
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
#variable_conflict use_column
begin
  return query
  with admitted as materialized (
    select t.id as token_id, t.user_id, t.last_used_at, t.scopes, t.oauth_app_id, u.last_workspace_id
      from crm.tokens t
      join crm.users u on u.id = t.user_id
      join crm.memberships m on m.workspace_id = p_workspace_id and m.user_id = t.user_id
     where t.token_hash = p_token_hash
       and t.revoked_at is null and t.expires_at > now()
       and (t.kind <> 'session' or p_via = 'ui')
       and (t.workspace_id is null or t.workspace_id = p_workspace_id)
       and u.suspended_at is null
       and (t.kind = 'session' or u.api_access)
       and m.access_version = p_access_version
       and (not p_follows_last_workspace or u.last_workspace_id = p_workspace_id)
  ),
  -- The context as crm.authenticate writes it, and the same bookkeeping.
  context as materialized (
    select a.user_id, crm.put_context(a.user_id, p_workspace_id, p_via, a.scopes, a.oauth_app_id) as written,
           case when a.last_workspace_id is distinct from p_workspace_id
                  or a.last_used_at is null or a.last_used_at < now() - interval '1 minute'
                then crm.touch_caller(a.user_id, p_workspace_id, a.last_workspace_id is distinct from p_workspace_id,
                                      a.token_id, a.last_used_at is null or a.last_used_at < now() - interval '1 minute')
                else true
           end as touched
      from admitted a
  )
  select case when x.written and x.touched then null else 'stale' end,
         case when x.written and x.touched then x.user_id end
    from (select) as always_one_row
    left join context x on true;
end
$$;
