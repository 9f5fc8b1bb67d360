-- An import stops once the credential that started it is withdrawn. The import records the token
-- that queued it, and every batch checks, before it lands anything, that the token is not revoked,
-- that its OAuth grant (an app's connection) is not revoked and that the user's API access is on,
-- as crm.authenticate does for a request; the job then fails with a code saying why
-- (imports.failure_code), instead of landing the rest of the file.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

alter table crm.imports add column token_id uuid;
comment on column crm.imports.token_id is 'The token that queued the import (crm.queue_import); every batch stops the import once it is revoked, its OAuth grant revoked, or its user''s API access off. Null for imports queued before this column.';

alter table crm.imports add column failure_code text;
comment on column crm.imports.failure_code is 'Why a failed import stopped, as an API error code (token_revoked, grant_revoked, api_access_disabled, member_inactive, import_grant_missing, import_file_invalid), or null.';
grant select (failure_code) on crm.imports to crm_api;

drop function crm.queue_import(uuid, jsonb, text, text, boolean);
create function crm.queue_import(p_import_id uuid, p_mapping jsonb, p_mode text, p_match_on text, p_dry_run boolean, p_token_id uuid)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_context record := crm.verified_context();
  v_workspace uuid := v_context.workspace_id;
  v_record_type text;
  v_status text;
  v_dry_run boolean;
  v_available boolean;
begin
  -- The token named must be the caller's own, live, with the scopes and app the context proves:
  -- the import is bound to the credential the request came with.
  if not exists (select from crm.tokens t
                  where t.id = p_token_id and t.user_id = v_context.user_id
                    and t.revoked_at is null and t.expires_at > now()
                    and t.scopes is not distinct from v_context.scopes
                    and t.oauth_app_id is not distinct from v_context.oauth_app_id) then
    raise exception 'the token of this request is not the caller''s' using errcode = 'CR401', hint = 'token_invalid';
  end if;
  select i.record_type, i.status, i.dry_run, (i.staged or i.file_bytes is not null)
    into v_record_type, v_status, v_dry_run, v_available
    from crm.imports i
   where i.workspace_id = v_workspace and i.id = p_import_id and i.user_id = v_context.user_id
     for update;
  if not found then
    raise exception 'no such import' using errcode = 'CR404', hint = 'not_found';
  end if;
  if crm.grant_scope(v_record_type, 'import') is null then
    raise exception 'your role has no % import grant', v_record_type using errcode = 'CR403', hint = 'forbidden';
  end if;
  if p_mode = 'upsert' and crm.grant_scope(v_record_type, 'update') is null then
    raise exception 'an upsert needs the % update grant', v_record_type using errcode = 'CR403', hint = 'forbidden';
  end if;
  -- A file runs once for real; after a dry run it may run again (for real or dry).
  if not (v_status = 'uploaded' or (v_status in ('completed', 'failed') and v_dry_run)) then
    raise exception 'this import has already been started (status %)', v_status using errcode = 'CR409', hint = 'import_already_started';
  end if;
  if not v_available then
    raise exception 'the file of this import has been removed; upload it again' using errcode = 'CR409', hint = 'import_file_removed';
  end if;
  delete from crm.import_errors e where e.workspace_id = v_workspace and e.import_id = p_import_id;
  update crm.imports i
     set status = 'queued', mapping = p_mapping, mode = p_mode, match_on = p_match_on, dry_run = p_dry_run,
         last_row_done = 0, created = 0, updated = 0, skipped = 0, failed = 0, companies_created = 0,
         failure = null, failure_code = null, queued_at = now(), started_at = null, finished_at = null,
         token_scopes = v_context.scopes, oauth_app_id = v_context.oauth_app_id, token_id = p_token_id
   where i.workspace_id = v_workspace and i.id = p_import_id;
  perform graphile_worker.add_job('process_import',
    json_build_object('workspace_id', v_workspace, 'import_id', p_import_id),
    max_attempts => 5, job_key => 'process_import:' || p_import_id::text);
end
$$;
comment on function crm.queue_import(uuid, jsonb, text, text, boolean, uuid) is
  'Starts an import: checks the import grant (and update for upsert) of the caller, records the options, the token (which must be the caller''s own, live, with the proven scopes and app) and its scopes and app, and adds the process_import job in the same transaction.';
revoke execute on function crm.queue_import(uuid, jsonb, text, text, boolean, uuid) from public;
grant execute on function crm.queue_import(uuid, jsonb, text, text, boolean, uuid) to crm_api;

create or replace function crm.begin_import_batch(p_workspace_id uuid, p_import_id uuid)
returns table (status text, record_type text, columns text[], mapping jsonb, mode text, match_on text, dry_run boolean, last_row_done integer)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_user uuid;
  v_scopes text[];
  v_app uuid;
  v_token uuid;
  v_withdrawn text;
begin
  -- Column by column: never drags the file (file_bytes) into the function.
  select i.user_id, i.token_scopes, i.oauth_app_id, i.token_id, i.status, i.record_type, i.columns, i.mapping, i.mode, i.match_on, i.dry_run, i.last_row_done
    into v_user, v_scopes, v_app, v_token, status, record_type, columns, mapping, mode, match_on, dry_run, last_row_done
    from crm.imports i where i.workspace_id = p_workspace_id and i.id = p_import_id
     for update;
  if not found then
    raise exception 'no such import' using errcode = 'CR404', hint = 'not_found';
  end if;
  if not exists (select from crm.memberships m join crm.users u on u.id = m.user_id
                  where m.workspace_id = p_workspace_id and m.user_id = v_user
                    and m.suspended_at is null and u.suspended_at is null) then
    raise exception 'the importing member is suspended or has left the workspace' using errcode = 'CR403', hint = 'member_inactive';
  end if;
  -- The credential that queued the import, as crm.authenticate judges a request's: a revoked
  -- grant first (it revokes its tokens too, and is the cause), then the token (gone or revoked),
  -- then API access (tokens and app tokens; a UI session is not an API credential). Expiry does
  -- not stop an import: it was started while the token was valid, and nobody withdrew it.
  select case
           when g.revoked_at is not null then 'grant_revoked'
           when v_token is not null and (t.id is null or t.revoked_at is not null) then 'token_revoked'
           when coalesce(t.kind, 'token') in ('token', 'oauth') and not u.api_access then 'api_access_disabled'
         end
    into v_withdrawn
    from crm.users u
    left join crm.tokens t on t.id = v_token and t.user_id = u.id
    left join crm.oauth_grants g on g.workspace_id = t.workspace_id and g.id = t.oauth_grant_id
   where u.id = v_user;
  if v_withdrawn = 'grant_revoked' then
    raise exception 'the app connection that started this import was revoked' using errcode = 'CR403', hint = v_withdrawn;
  elsif v_withdrawn = 'token_revoked' then
    raise exception 'the token that started this import was revoked' using errcode = 'CR403', hint = v_withdrawn;
  elsif v_withdrawn = 'api_access_disabled' then
    raise exception 'the importing user''s API access was turned off' using errcode = 'CR403', hint = v_withdrawn;
  end if;
  perform crm.set_context(v_user, p_workspace_id, 'import', v_scopes, v_app);
  perform set_config('crm.import_id', p_import_id::text, true);
  perform set_config('crm.import_proof', crm.import_proof(p_import_id), true);
  if crm.grant_scope(record_type, 'import') is null then
    raise exception 'the importing member''s role has no % import grant', record_type using errcode = 'CR403', hint = 'import_grant_missing';
  end if;
  if mode = 'upsert' and crm.grant_scope(record_type, 'update') is null then
    raise exception 'the importing member''s role has no % update grant (needed for upsert)', record_type using errcode = 'CR403', hint = 'import_grant_missing';
  end if;
  if status = 'queued' then
    update crm.imports i set status = 'processing', started_at = coalesce(i.started_at, now())
     where i.workspace_id = p_workspace_id and i.id = p_import_id;
    status := 'processing';
  end if;
  return next;
end
$$;
comment on function crm.begin_import_batch(uuid, uuid) is
  'Worker only: opens an import batch as the importing user (via import, within the scopes of the token that queued it), after checking membership, the token that queued it (not revoked, its OAuth grant not revoked, API access on) and grants; locks the import row. Refusals are CR403 with the failure code as hint.';

drop function crm.complete_import(uuid, uuid, text, text);
create function crm.complete_import(p_workspace_id uuid, p_import_id uuid, p_status text, p_failure text, p_failure_code text default null)
returns void
language sql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  update crm.imports set status = p_status, failure = p_failure, failure_code = p_failure_code, finished_at = now()
   where workspace_id = p_workspace_id and id = p_import_id;
  -- After a real run only the rows errors.csv needs are kept; a dry run keeps all for the real run.
  delete from crm.import_rows r
   using crm.imports i
   where i.workspace_id = p_workspace_id and i.id = p_import_id and p_status = 'completed' and not i.dry_run
     and r.workspace_id = i.workspace_id and r.import_id = i.id
     and not exists (select from crm.import_errors e where e.workspace_id = r.workspace_id and e.import_id = r.import_id and e.row = r.row);
$$;
comment on function crm.complete_import(uuid, uuid, text, text, text) is
  'Worker only: ends an import (completed or failed, with the failure''s message and code) and drops staged rows no longer needed.';
revoke execute on function crm.complete_import(uuid, uuid, text, text, text) from public;
grant execute on function crm.complete_import(uuid, uuid, text, text, text) to crm_worker;
