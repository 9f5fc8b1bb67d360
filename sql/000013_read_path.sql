-- The read path, cheaper: crm.authenticate without the two bookkeeping UPDATEs on most requests;
-- and tidier: one HMAC message, one membership-grant lookup.
-- Same answers as 000010; same proof (message, key, algorithm), so contexts set by crm.set_context
-- (crm.act_as) and by crm.authenticate verify alike. Figures: README, "Performance".

-- =============================================================================================
-- The proof's message, written once. A plain SQL function (no SECURITY DEFINER, no SET clause) whose
-- body is one expression: PostgreSQL inlines it into each caller, so it costs nothing to share.
-- Internal: crm_api has no EXECUTE (the message alone proves nothing without the key anyway).
create function crm.context_message(p_user_id text, p_workspace_id text) returns bytea
language sql stable
as $$
  select convert_to(p_user_id || '/' || p_workspace_id || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8')
$$;
comment on function crm.context_message(text, text) is
  'What crm.context_proof signs: user, workspace, backend pid and transaction start (ids as uuid text). Inlined into its callers; internal.';
revoke execute on function crm.context_message(text, text) from public;

create or replace function crm.context_proof(p_user_id uuid, p_workspace_id uuid) returns text
language sql stable security definer
set search_path = pg_catalog, public
as $$
  select encode(
    hmac(crm.context_message(p_user_id::text, p_workspace_id::text),
         (select value from crm.internal_secrets where name = 'context_proof'),
         'sha256'),
    'hex')
$$;

-- =============================================================================================
-- crm.verified_context: the same check, with the message from crm.context_message.
create or replace function crm.verified_context(out user_id uuid, out workspace_id uuid)
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_user text := current_setting('crm.user_id', true);
  v_workspace text := current_setting('crm.workspace_id', true);
  v_proof text := current_setting('crm.context_proof', true);
begin
  if v_proof is null or v_proof = '' or v_user !~ '^[0-9a-f-]{36}$' or v_workspace !~ '^[0-9a-f-]{36}$' then
    return;
  end if;
  if encode(hmac(crm.context_message(v_user, v_workspace),
                 (select s.value from crm.internal_secrets s where s.name = 'context_proof'),
                 'sha256'), 'hex') is distinct from v_proof then
    return;
  end if;
  user_id := v_user::uuid;
  workspace_id := v_workspace::uuid;
end
$$;
-- =============================================================================================
-- The widest scope a member's role grants for resource:action, shared by crm.grant_scope and
-- crm.scope_owner_ids. Takes the already verified user and workspace (no second HMAC check) and is
-- internal: crm_api has no EXECUTE, so nobody can ask it about another user.
create function crm.member_scope(p_user_id uuid, p_workspace_id uuid, p_resource text, p_action text) returns text
language sql stable
as $$
  select g.scope
    from crm.memberships m
    join crm.role_grants g on g.workspace_id = m.workspace_id and g.role_id = m.role_id
   where m.workspace_id = p_workspace_id and m.user_id = p_user_id
     and m.suspended_at is null and g.resource = p_resource and g.action = p_action
$$;
comment on function crm.member_scope(uuid, uuid, text, text) is
  'The scope (own, team, all) the member''s role grants for resource:action, or null (internal; callers verify the context first).';
revoke execute on function crm.member_scope(uuid, uuid, text, text) from public;

create or replace function crm.grant_scope(p_resource text, p_action text) returns text
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_context record := crm.verified_context();
begin
  if v_context.user_id is null then return null; end if;
  return crm.member_scope(v_context.user_id, v_context.workspace_id, p_resource, p_action);
end
$$;

create or replace function crm.scope_owner_ids(p_resource text, p_action text) returns uuid[]
language plpgsql stable security definer
set search_path = pg_catalog, public
as $$
declare
  v_context record := crm.verified_context();
begin
  if v_context.user_id is null then return '{}'; end if;
  return case crm.member_scope(v_context.user_id, v_context.workspace_id, p_resource, p_action)
           when 'own' then array[v_context.user_id]
           when 'team' then crm.team_user_ids(v_context.user_id, v_context.workspace_id)
           else '{}'::uuid[]
         end;
end
$$;

-- =============================================================================================
-- crm.authenticate's bookkeeping (the user's last workspace, the token's last use) changes a row
-- about once a minute per token, yet as UPDATE CTEs it opened, locked and initialised both tables
-- and their indexes on every request (measured: ~28 µs of its ~195 µs). It is now a function
-- called from a CASE only when something changes. Internal; runs with crm.authenticate's rights.
create function crm.touch_caller(p_user_id uuid, p_workspace_id uuid, p_set_workspace boolean, p_token_id uuid, p_touch_token boolean) returns boolean
language plpgsql volatile
as $$
begin
  if p_set_workspace then
    update crm.users set last_workspace_id = p_workspace_id where id = p_user_id;
  end if;
  if p_touch_token then
    update crm.tokens set last_used_at = now() where id = p_token_id;
  end if;
  return true;
end
$$;
comment on function crm.touch_caller(uuid, uuid, boolean, uuid, boolean) is
  'crm.authenticate''s bookkeeping: the user''s last workspace and the token''s last use, when they change (internal).';
revoke execute on function crm.touch_caller(uuid, uuid, boolean, uuid, boolean) from public;

create or replace function crm.authenticate(p_token_hash bytea, p_slug text, p_via text, p_rate_limit integer)
returns table (
  failure text,
  user_id uuid,
  workspace_id uuid,
  workspace_slug text,
  token_id uuid,
  token_kind text,
  is_admin boolean,
  rate_count integer,
  rate_reset_seconds integer
)
language sql volatile security definer
set search_path = pg_catalog, public
set plan_cache_mode = force_generic_plan
-- See 000010: the rate-limit counters' statistics see a small table; the key reads only this user's rows.
set enable_seqscan = off
as $$
  with caller as (
    select t.id as token_id, t.kind, t.revoked_at, t.expires_at, t.last_used_at,
           u.id as user_id, u.suspended_at, u.api_access, u.last_workspace_id
      from crm.tokens t join crm.users u on u.id = t.user_id
     where t.token_hash = p_token_hash
  ),
  -- The workspace named by the slug; without one, the last used, else the oldest joined, an active
  -- membership preferred over a suspended one.
  member as (
    select m.workspace_id, m.suspended_at, w.slug, r.is_admin
      from caller c
      join crm.memberships m on m.user_id = c.user_id
      join crm.workspaces w on w.id = m.workspace_id
      join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
     where p_slug is null or w.slug = p_slug
     order by (m.workspace_id = c.last_workspace_id) desc nulls last, (m.suspended_at is null) desc, m.joined_at
     limit 1
  ),
  verdict as (
    select c.token_id, c.kind, c.last_used_at, c.user_id, c.last_workspace_id, m.workspace_id, m.slug, m.is_admin,
           case
             when c.user_id is null then 'token_invalid'
             when c.revoked_at is not null then 'token_revoked'
             when c.expires_at <= now() then 'token_expired'
             -- A UI session works only through the UI (its cookie); copied into an Authorization
             -- header it is refused, so turning API access off cannot be side-stepped with it.
             when c.kind = 'session' and p_via is distinct from 'ui' then 'token_invalid'
             when c.suspended_at is not null then 'user_suspended'
             when c.kind = 'token' and not c.api_access then 'api_access_disabled'
             when m.workspace_id is null then 'workspace_not_found'
             when m.suspended_at is not null then 'user_suspended'
           end as failure
      from (select) as always_one_row
      left join caller c on true
      left join member m on true
  ),
  -- A request that passed the checks counts: this backend's counter goes up, and the other
  -- backends' counters for the same user and minute are added (this statement's snapshot does not
  -- see its own insert, so the new count comes from RETURNING).
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
  -- The proven context, exactly as crm.set_context sets it (same message, same key), and the
  -- bookkeeping when it changes. A CTE with volatile calls is materialized, so it runs once, and
  -- only for an admitted caller.
  context as materialized (
    select set_config('crm.user_id', a.user_id::text, true) as user_id,
           set_config('crm.workspace_id', a.workspace_id::text, true) as workspace_id,
           set_config('crm.via', coalesce(p_via, 'api'), true) as via,
           set_config('crm.context_proof', encode(hmac(
             crm.context_message(a.user_id::text, a.workspace_id::text),
             (select s.value from crm.internal_secrets s where s.name = 'context_proof'),
             'sha256'), 'hex'), true) as proof,
           case when a.last_workspace_id is distinct from a.workspace_id
                  or a.last_used_at is null or a.last_used_at < now() - interval '1 minute'
                then crm.touch_caller(a.user_id, a.workspace_id, a.last_workspace_id is distinct from a.workspace_id,
                                      a.token_id, a.last_used_at is null or a.last_used_at < now() - interval '1 minute')
                else true
           end as touched
      from admitted a
  )
  select coalesce(k.failure, case when k.rate_count > p_rate_limit then 'rate_limited' end),
         case when x.proof is not null and x.touched then a.user_id end,
         a.workspace_id, a.slug, a.token_id, a.kind, a.is_admin,
         k.rate_count,
         greatest(1, ceil(extract(epoch from (date_trunc('minute', now()) + interval '1 minute' - now())))::integer)
    from counted k
    left join admitted a on true
    left join context x on true
$$;

-- crm.authenticate returns one row; the default estimate (1000) made every single-statement read's
-- plan cost a thousand times its lateral query.
alter function crm.authenticate(bytea, text, text, integer) rows 1;
