-- crm.resume_identity in steps: one lookup of the token, its user and the membership into a
-- record, then plain PL/pgSQL conditions, instead of one statement of materialized CTEs.
--
-- A cached identity's request runs this function on every request (a GET one, a list, a write in
-- one statement). The one statement of sql/000029 cost the executor's set-up of four plan nodes per
-- call, and the kept context went through crm.put_stored_context, a second PL/pgSQL call, only to
-- be a boolean in a CTE. Measured on PostgreSQL 18 with the bench's data, one connection, named
-- statements, µs per call round trip included (60 of them): 99-102 before, 93-95 in steps.
-- The stored context is written by crm.write_context directly, so crm.put_stored_context goes.
--
-- The answers are the same: null and the user when the token, the user and the membership still
-- hold and the context was written; 'stale' (nothing set) otherwise. The lookup uses the unique
-- indexes on token_hash, users' key and memberships' key, so its plan needs neither
-- force_generic_plan nor enable_seqscan = off, whose per-call setting and restoring cost too.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.resume_identity(p_token_hash bytea, p_workspace_id uuid, p_access_version bigint, p_via text,
                                               p_follows_last_workspace boolean)
returns table (failure text, user_id uuid)
language plpgsql security definer rows 1
set search_path = pg_catalog, crm, pg_temp
as $$
#variable_conflict use_column
declare
  v_caller record;
  v_due boolean;
begin
  select t.id as token_id, t.user_id, t.last_used_at, t.scopes, t.oauth_app_id, t.oauth_grant_id, u.last_workspace_id,
         t.context, t.context_key
    into v_caller
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
     and (not p_follows_last_workspace or u.last_workspace_id = p_workspace_id);
  failure := 'stale';
  if not found then
    return next;
    return;
  end if;
  -- The context as crm.authenticate kept it for this workspace, access version and via, when the
  -- token holds it; otherwise computed as crm.authenticate does (and not stored: a standby runs
  -- this too, and writes nothing).
  if v_caller.context_key = crm.context_cache_key(p_workspace_id, p_access_version, p_via) then
    perform crm.write_context(v_caller.context);
  elsif not crm.put_context(v_caller.user_id, p_workspace_id, p_via, v_caller.scopes, v_caller.oauth_app_id,
                            v_caller.token_id, v_caller.oauth_grant_id) then
    return next;
    return;
  end if;
  -- The same bookkeeping: the last workspace, and the token's last use once a minute.
  v_due := v_caller.last_used_at is null or v_caller.last_used_at < now() - interval '1 minute';
  if (v_caller.last_workspace_id is distinct from p_workspace_id or v_due)
     and not crm.touch_caller(v_caller.user_id, p_workspace_id, v_caller.last_workspace_id is distinct from p_workspace_id,
                              v_caller.token_id, v_due) then
    return next;
    return;
  end if;
  failure := null;
  user_id := v_caller.user_id;
  return next;
end
$$;

drop function crm.put_stored_context(text);
