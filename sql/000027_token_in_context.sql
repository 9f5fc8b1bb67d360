-- A scoped token revokes only itself, and an app's access token only its own authorization, by
-- the database's word as well as the route's (API.md section 4a): the request context names the
-- calling token and, for an app's token, its grant, and the update policies of crm.tokens and
-- crm.oauth_grants read them.
--
-- Two fields are appended to the context (crm.put_context; both carriers, sql/000025): 10 the
-- calling token's id, 11 its OAuth grant's id, each as 32 hex digits or 0 (no token: a job acting
-- as a user; no grant: a personal token or a session). crm.current_token_id() and
-- crm.current_oauth_grant_id() read them, inlinable like the other helpers; only these two
-- policies call them, so no other statement reads further into the context than before.
--
-- The policies: the whole authority (an unscoped personal token, a session) updates every token
-- and grant of its user, as before; a scoped personal token only its own token row and no grant;
-- an app's access token only the token rows and the grant of its own authorization. The admin
-- branch of oauth_grants (workspace:admin revokes any connection of the workspace) is unchanged.
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

select crm.install_context_carrier('auto');
comment on function crm.current_token_id() is 'The id of the token that authenticated this transaction''s request, or null (a job acting as a user, no context). As of crm.put_context.';
comment on function crm.current_oauth_grant_id() is 'The OAuth grant of the access token that authenticated this request, or null (a personal token, a session, no context).';
revoke execute on function crm.current_token_id() from public;
grant execute on function crm.current_token_id() to crm_api;
revoke execute on function crm.current_oauth_grant_id() from public;
grant execute on function crm.current_oauth_grant_id() to crm_api;

-- The writer takes the calling token and its grant; without them (crm.set_context: jobs, imports)
-- both fields are 0.
drop function crm.put_context(uuid, uuid, text, text[], uuid);
create function crm.put_context(p_user_id uuid, p_workspace_id uuid, p_via text, p_scopes text[], p_oauth_app_id uuid,
                                 p_token_id uuid default null, p_oauth_grant_id uuid default null)
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
    coalesce(v_grants, ','), v_team_ids, coalesce(replace(p_token_id::text, '-', ''), '0'),
    coalesce(replace(p_oauth_grant_id::text, '-', ''), '0')));
  return true;
end
$$;
comment on function crm.put_context(uuid, uuid, text, text[], uuid, uuid, uuid) is
  'Writes the request context: user, workspace, OAuth app, via, token scopes, the active membership''s admin flag, its role''s grants narrowed by the scopes, the team when a grant is team, the calling token and its OAuth grant. Grants hold for the transaction as of this call. Internal.';
revoke execute on function crm.put_context(uuid, uuid, text, text[], uuid, uuid, uuid) from public;

-- Authentication passes the token and its grant; otherwise as in sql/000025.
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
    select t.id as token_id, t.kind, t.revoked_at, t.expires_at, t.last_used_at, t.scopes, t.oauth_app_id, t.oauth_grant_id,
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
    select c.token_id, c.kind, c.last_used_at, c.user_id, c.last_workspace_id, c.scopes, c.oauth_app_id, c.oauth_grant_id,
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
    select crm.put_context(a.user_id, a.workspace_id, p_via, a.scopes, a.oauth_app_id,
                           a.token_id, a.oauth_grant_id) as written,
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
    select t.id as token_id, t.user_id, t.last_used_at, t.scopes, t.oauth_app_id, t.oauth_grant_id, u.last_workspace_id
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
    select a.user_id, crm.put_context(a.user_id, p_workspace_id, p_via, a.scopes, a.oauth_app_id,
                                             a.token_id, a.oauth_grant_id) as written,
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

-- The calling token's kind decides which rows of its user it may change.
drop policy tokens_update_own on crm.tokens;
create policy tokens_update_own on crm.tokens as permissive for update to crm_api
  using (user_id = (select crm.current_user_id())
         and (((select crm.current_oauth_app_id()) is null and (select crm.current_scopes()) is null)
              or ((select crm.current_oauth_app_id()) is null and id = (select crm.current_token_id()))
              or (workspace_id = (select crm.current_workspace_id()) and oauth_grant_id = (select crm.current_oauth_grant_id()))))
  with check (user_id = (select crm.current_user_id())
              and (((select crm.current_oauth_app_id()) is null and (select crm.current_scopes()) is null)
                   or ((select crm.current_oauth_app_id()) is null and id = (select crm.current_token_id()))
                   or (workspace_id = (select crm.current_workspace_id()) and oauth_grant_id = (select crm.current_oauth_grant_id()))));
comment on policy tokens_update_own on crm.tokens is
  'A user revokes their own tokens and sessions with an unscoped token or a session; a scoped token only itself; an OAuth app''s access token only the tokens of its own authorization (crm.current_token_id, crm.current_oauth_grant_id).';

drop policy oauth_grants_update_own_or_admin on crm.oauth_grants;
create policy oauth_grants_update_own_or_admin on crm.oauth_grants as permissive for update to crm_api
  using ((user_id = (select crm.current_user_id())
          and (((select crm.current_oauth_app_id()) is null and (select crm.current_scopes()) is null)
               or (workspace_id = (select crm.current_workspace_id()) and id = (select crm.current_oauth_grant_id()))))
         or (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin'))))
  with check ((user_id = (select crm.current_user_id())
               and (((select crm.current_oauth_app_id()) is null and (select crm.current_scopes()) is null)
                    or (workspace_id = (select crm.current_workspace_id()) and id = (select crm.current_oauth_grant_id()))))
              or (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin'))));
comment on policy oauth_grants_update_own_or_admin on crm.oauth_grants is
  'A user disconnects the apps they connected with an unscoped token or a session; an OAuth app''s access token only its own authorization; a scoped personal token none of them; an admin disconnects any app in the current workspace (a scoped token needs workspace:admin).';
