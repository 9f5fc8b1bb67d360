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

-- =============================================================================================
-- Webhook operations: test events and recoveries are limited per subscription, and redeliver
-- sends again only a delivery that has finished (dead or delivered).

create table crm.webhook_operation_counts (
  workspace_id uuid not null,
  subscription_id uuid not null,
  operation text not null,
  window_ends_at timestamptz not null,
  count integer not null,
  constraint webhook_operation_counts_pkey primary key (workspace_id, subscription_id, operation),
  constraint webhook_operation_counts_subscription_fkey foreign key (workspace_id, subscription_id)
    references crm.webhook_subscriptions (workspace_id, id) on delete cascade,
  constraint webhook_operation_counts_operation_known check (operation in ('test', 'recover')),
  constraint webhook_operation_counts_count_positive check (count >= 1)
);
alter table crm.webhook_operation_counts enable row level security;
alter table crm.webhook_operation_counts force row level security;
comment on table crm.webhook_operation_counts is 'Test events and recoveries a subscription has had in its current fixed window (crm.claim_webhook_operation); written only by the SECURITY DEFINER functions of those operations, so no request role has a policy or grant.';
create policy webhook_operation_counts_all_owner on crm.webhook_operation_counts for all to crm_owner using (true) with check (true);
comment on policy webhook_operation_counts_all_owner on crm.webhook_operation_counts is 'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of requests or jobs is a member of crm_owner.';

-- Claimed inside the operation's transaction, after its checks: a refused or failed operation
-- rolls its claim back, so only what was done counts.
create function crm.claim_webhook_operation(p_workspace_id uuid, p_subscription_id uuid, p_operation text, p_allowance integer, p_window interval)
returns void
language plpgsql volatile
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_window_ends_at timestamptz;
begin
  insert into crm.webhook_operation_counts as c (workspace_id, subscription_id, operation, window_ends_at, count)
  values (p_workspace_id, p_subscription_id, p_operation, now() + p_window, 1)
  on conflict (workspace_id, subscription_id, operation) do update
    set count = case when c.window_ends_at <= now() then 1 else c.count + 1 end,
        window_ends_at = case when c.window_ends_at <= now() then now() + p_window else c.window_ends_at end
    where c.window_ends_at <= now() or c.count < p_allowance
  returning c.window_ends_at into v_window_ends_at;
  if v_window_ends_at is null then
    -- Refused: the row is locked by the statement above and read again with a fresh snapshot.
    select c.window_ends_at into v_window_ends_at from crm.webhook_operation_counts c
     where c.workspace_id = p_workspace_id and c.subscription_id = p_subscription_id and c.operation = p_operation;
    raise exception 'a subscription may have % % every %; retry later', p_allowance,
      case p_operation when 'test' then 'test events' else 'recoveries' end, p_window
      using errcode = 'CR429', hint = 'rate_limited',
            detail = greatest(1, ceil(extract(epoch from v_window_ends_at - now())))::integer::text;
  end if;
end
$$;
comment on function crm.claim_webhook_operation(uuid, uuid, text, integer, interval) is
  'Counts one test event or recovery of a subscription in its fixed window, or raises CR429 rate_limited with the seconds until the window ends as detail (called by the SECURITY DEFINER functions of those operations).';
revoke execute on function crm.claim_webhook_operation(uuid, uuid, text, integer, interval) from public;

create or replace function crm.send_webhook_test_event(p_subscription_id uuid, p_event text)
returns uuid
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_data jsonb;
  v_event_id uuid := crm.uuid_v7();
  v_delivery crm.webhook_deliveries;
begin
  perform crm.require_webhook_access();
  v_data := crm.webhook_sample_event_data(v_workspace, p_event);
  -- A key-share lock keeps the subscription from being deleted until the delivery exists.
  perform 1 from crm.webhook_subscriptions s where s.workspace_id = v_workspace and s.id = p_subscription_id for key share;
  if not found then
    raise exception 'no such webhook subscription' using errcode = 'CR404', hint = 'not_found';
  end if;
  -- A test goes out at once even while paused: 20 a minute per subscription, so the endpoint
  -- cannot be used to make the sender flood an address.
  perform crm.claim_webhook_operation(v_workspace, p_subscription_id, 'test', 20, interval '1 minute');
  insert into crm.webhook_deliveries (workspace_id, id, subscription_id, event_id, event, record_type, record_id, status,
                                      next_attempt_at, generation, is_test, test_event)
  values (v_workspace, crm.webhook_delivery_id(v_event_id, p_subscription_id), p_subscription_id, v_event_id, p_event,
          split_part(p_event, '.', 1), (v_data -> 'object' ->> 'id')::uuid, 'pending', now(),
          -- The generation a job carries starts at 2, as everywhere a job is added to a row.
          2, true, jsonb_build_object('data', v_data, 'actor', crm.event_actor()))
  returning * into v_delivery;
  perform crm.add_webhook_delivery_jobs(array[v_delivery], now());
  return v_delivery.id;
end
$$;
comment on function crm.send_webhook_test_event(uuid, text) is
  'A test delivery of a sample event to a subscription (API.md section 7: POST .../test), sent at once even while paused; at most 20 a minute per subscription (CR429); returns its delivery id.';

create or replace function crm.recover_webhook_deliveries(p_subscription_id uuid, p_since timestamptz, p_until timestamptz default null)
returns integer
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_status text;
  v_count integer;
  v_pending crm.webhook_deliveries[];
begin
  perform crm.require_webhook_access();
  select s.status into v_status from crm.webhook_subscriptions s
   where s.workspace_id = v_workspace and s.id = p_subscription_id for share;
  if not found then
    raise exception 'no such webhook subscription' using errcode = 'CR404', hint = 'not_found';
  end if;
  perform crm.check_webhook_recovery_window(p_since, p_until);
  -- Each recovery may start thousands of cycles again: 10 an hour per subscription.
  perform crm.claim_webhook_operation(v_workspace, p_subscription_id, 'recover', 10, interval '1 hour');
  with recovered as (
    update crm.webhook_deliveries d
       set status = case when v_status = 'active' then 'pending' else 'held' end,
           cycle_attempts = 0, generation = d.generation + 1, completed_at = null, in_release = false,
           next_attempt_at = case when v_status = 'active' then now() end, updated_at = now()
     where d.workspace_id = v_workspace and d.subscription_id = p_subscription_id
       and d.completed_at >= p_since and d.status = 'dead' and not d.is_test
       and d.created_at >= p_since and d.created_at < coalesce(p_until, now())
    returning d.*
  )
  select count(*), array_agg(r order by r.event_id) filter (where r.status = 'pending') into v_count, v_pending from recovered r;
  perform crm.add_webhook_delivery_jobs(v_pending, now());
  return v_count;
end
$$;
comment on function crm.recover_webhook_deliveries(uuid, timestamptz, timestamptz) is
  'API.md section 7, POST .../recover: a fresh cycle for every dead delivery created in [since, until) (until defaults to now), sent oldest first (held while paused); at most 10 an hour per subscription (CR429); returns how many.';

create or replace function crm.redeliver_webhook(p_subscription_id uuid, p_delivery_id uuid)
returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_workspace uuid := crm.current_workspace_id();
  v_status text;
  v_delivery crm.webhook_deliveries;
begin
  perform crm.require_webhook_access();
  select d.status into v_status from crm.webhook_deliveries d
   where d.workspace_id = v_workspace and d.subscription_id = p_subscription_id and d.id = p_delivery_id
     for update;
  if not found then
    raise exception 'no such delivery' using errcode = 'CR404', hint = 'not_found';
  end if;
  -- Only a finished delivery starts a fresh cycle (API.md section 7): one still pending, retrying
  -- or held has attempts left, and a reset would give it 7 more every time (retries for ever).
  if v_status not in ('dead', 'delivered') then
    raise exception 'only a dead or delivered delivery can be sent again; this one is %', v_status
      using errcode = 'CR409', hint = 'delivery_not_finished';
  end if;
  update crm.webhook_deliveries d
     set status = case when s.status = 'active' or d.is_test then 'pending' else 'held' end,
         cycle_attempts = 0, generation = d.generation + 1, completed_at = null, in_release = false,
         next_attempt_at = case when s.status = 'active' or d.is_test then now() end
    from crm.webhook_subscriptions s
   where d.workspace_id = v_workspace and d.subscription_id = p_subscription_id and d.id = p_delivery_id
     and s.workspace_id = d.workspace_id and s.id = d.subscription_id
  returning d.* into v_delivery;
  if v_delivery.status = 'pending' then
    perform crm.add_webhook_delivery_jobs(array[v_delivery], now());
  end if;
end
$$;
comment on function crm.redeliver_webhook(uuid, uuid) is
  'A fresh cycle of 7 attempts for a dead or delivered delivery, same delivery_id, the first at once (held when the subscription is paused); any other status is CR409 delivery_not_finished.';
