-- crm.resume_identity writes no bookkeeping (the token's last use, the user's last workspace) in a
-- read-only transaction on the primary.
--
-- A long read (an export, an errors.csv) keeps its transaction open for as long as its client
-- reads, up to EXPORT_TIMEOUT_MS. Its authentication used to write the bookkeeping in that
-- transaction, so the token's row (and, after a change of workspace, the user's) stayed locked
-- until the stream ended: DELETE /api/tokens/{id} of that token waited for it and answered 503 when
-- its statement timed out, the token went on working, and its other requests waited too once their
-- own bookkeeping was due. The API now authenticates such a request in a short transaction of its
-- own first (which writes the bookkeeping and counts the request), then runs the long read in a
-- transaction it declares read-only, which has no transaction id and so can lock no row. This
-- function, called there, leaves the bookkeeping to that short transaction instead of failing on
-- its write.
--
-- A standby's transaction is read-only too, but there nothing changes: the write still fails, and
-- the read goes to the primary as before. The setting is read only when bookkeeping is due (once a
-- minute per token), so a request that has none to write costs what it did.
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
  -- The same bookkeeping: the last workspace, and the token's last use once a minute. Not in a
  -- read-only transaction on the primary (a long read's, whose request wrote it in a short
  -- transaction before): a row lock there would last as long as the read.
  v_due := v_caller.last_used_at is null or v_caller.last_used_at < now() - interval '1 minute';
  if (v_caller.last_workspace_id is distinct from p_workspace_id or v_due)
     and not (current_setting('transaction_read_only') = 'on' and not pg_is_in_recovery())
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

comment on function crm.resume_identity(p_token_hash bytea, p_workspace_id uuid, p_access_version bigint, p_via text, p_follows_last_workspace boolean) is
  'A cached identity''s authentication: sets the proven context when the token is still valid and the membership''s access_version is the cached one; user_id is the token''s user. Otherwise failure = ''stale'', nothing is set, and the caller authenticates with crm.authenticate. Writes the last-used bookkeeping when due, except in a read-only transaction on the primary (a long read, authenticated in a short transaction first).';
