-- Runtime confinement: no request and no job runs as the tables' owner (API.md section 10).
--
-- Who runs what:
--   the owner (DATABASE_URL)  migrations, the crm CLI, and every SECURITY DEFINER function
--   crm_runtime (login)       requests: as itself before a caller is known (sign-in, two-factor,
--                             sign-up, accepting an invitation: the functions of this file), as
--                             crm_api inside a request transaction, and single-statement reads
--   crm_worker (login)        the graphile-worker runner and its tasks: graphile-worker's queue,
--                             the worker-only functions, and crm_api inside an import batch
-- Neither login role is a superuser, owns anything, bypasses row-level security or may become the
-- owner. Every table of crm forces row-level security on its owner too; the owner's own policy
-- (to crm_owner) says so by name.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- ---------------------------------------------------------------------------------------------
-- Roles
-- ---------------------------------------------------------------------------------------------

-- crm_owner names the tables' owner in policies: with FORCE ROW LEVEL SECURITY the owner, unless it
-- is a superuser or BYPASSRLS, obeys policies like any role, and the SECURITY DEFINER functions
-- run as the owner. A group role gives that policy a name that is the same in every deployment
-- (the migrating role's own name is not). Only the migrating role is made a member.
--
-- crm_worker: the worker's login role, created like crm_runtime (the service sets its password at
-- start, src/db/runtime-role.ts). NOINHERIT: it holds only what is granted to it by name below
-- (and graphile-worker's queue, crm.grant_job_queue_to_worker); it is a member of crm_api only to
-- switch to it inside an import batch, where the importing user's proven context applies.
do $$
begin
  if not exists (select from pg_roles where rolname = 'crm_owner') then
    create role crm_owner nologin noinherit nosuperuser nobypassrls nocreatedb nocreaterole;
  end if;
  if not exists (select from pg_roles where rolname = 'crm_worker') then
    create role crm_worker login noinherit nosuperuser nobypassrls nocreatedb nocreaterole;
  end if;
end
$$;
grant crm_owner to current_user;
grant crm_api to crm_worker;
-- A job transaction left open by a stuck task would hold its locks: ended after five minutes.
alter role crm_worker set idle_in_transaction_session_timeout = '5min';

-- ---------------------------------------------------------------------------------------------
-- Sign-in tickets: a password check is made once per claimed attempt
-- ---------------------------------------------------------------------------------------------

create unlogged table crm.sign_in_tickets (
  -- Random, not crm.uuid_v7(): a ticket must not be guessable from the time it was made.
  id uuid primary key default gen_random_uuid(),
  email text not null,
  window_id uuid not null,
  expires_at timestamptz not null
);
alter table crm.sign_in_tickets enable row level security;
-- Serves crm.prune_sign_in_tickets.
create index sign_in_tickets_expires_at_idx on crm.sign_in_tickets (expires_at);
comment on table crm.sign_in_tickets is
  'One row per sign-in attempt claimed by crm.claim_sign_in and not yet checked by crm.sign_in, which uses it up: a password is checked once per claimed attempt. Unlogged: after a crash the attempts in flight are simply refused.';

-- ---------------------------------------------------------------------------------------------
-- Every table forces row-level security, and the owner's access is a policy of its own
-- ---------------------------------------------------------------------------------------------

-- Cross-workspace access is intended for the owner alone: migrations, the crm CLI, and the
-- SECURITY DEFINER functions, each of which states its own rule (a proven context, a hashed
-- secret, a worker-only grant). A table added later forces row-level security and gets this
-- policy where it is created (sql/CONVENTIONS.md); test/privilege/confinement.test.ts checks
-- every table.
do $$
declare
  v_table regclass;
  v_name text;
begin
  for v_table, v_name in
    select c.oid::regclass, c.relname from pg_class c
     where c.relnamespace = 'crm'::regnamespace and c.relkind = 'r' and c.relrowsecurity
     order by c.relname
  loop
    execute format('alter table %s force row level security', v_table);
    execute format('create policy %I on %s for all to crm_owner using (true) with check (true)', v_name || '_all_owner', v_table);
    execute format('comment on policy %I on %s is %L', v_name || '_all_owner', v_table,
      'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of requests or jobs is a member of crm_owner.');
  end loop;
end
$$;

-- ---------------------------------------------------------------------------------------------
-- Search paths: pg_catalog, crm, pg_temp; extension functions schema-qualified
-- ---------------------------------------------------------------------------------------------

-- The import proof calls pgcrypto by its schema.
create or replace function crm.import_proof(p_import_id uuid) returns text
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select encode(
    public.hmac(convert_to('import/' || p_import_id::text || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8'),
                (select value from crm.internal_secrets where name = 'context_proof'),
                'sha256'),
    'hex')
$$;

-- Every function that pins a search path pins this one: no public (where pgcrypto and pg_trgm
-- live), pg_temp last (a temporary table cannot stand in for a table of ours). The three
-- functions that call pgcrypto's hmac unqualified are defined with public.hmac and this search
-- path by 000011_scoped_access.sql.
do $$
declare
  v_function regprocedure;
begin
  for v_function in
    select p.oid::regprocedure from pg_proc p
     where p.pronamespace = 'crm'::regnamespace
       and exists (select from unnest(p.proconfig) s where s like 'search_path=%' and s <> 'search_path=pg_catalog, crm, pg_temp')
       and p.proname not in ('context_proof', 'verified_context', 'authenticate')
  loop
    execute format('alter function %s set search_path = pg_catalog, crm, pg_temp', v_function);
  end loop;
end
$$;

-- ---------------------------------------------------------------------------------------------
-- Before sign-in (crm_runtime): narrow functions instead of the owner's connection
-- ---------------------------------------------------------------------------------------------

-- Step 1 of a sign-in: claims an attempt for the email (crm.claim_attempt: refused past 5 in 15
-- minutes, before any check, so concurrent guesses beyond the allowance are never checked) and
-- answers what the service needs to derive the key of the password it was given: the stored
-- hash's parameters and salt, never the key. Null parameters (unknown email, no password): the
-- service derives against a decoy, so both refusals take the same time. The ticket names the
-- claim; crm.sign_in takes it once.
create function crm.claim_sign_in(p_email text)
returns table (allowed boolean, retry_after_seconds integer, ticket uuid, password_params text)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_window uuid;
begin
  select c.allowed, c.retry_after_seconds, c.window_id into allowed, retry_after_seconds, v_window
    from crm.claim_attempt('sign_in', p_email) c;
  if allowed then
    -- Five minutes: far beyond one scrypt, even queued behind many (a ticket allows one check only).
    insert into crm.sign_in_tickets (email, window_id, expires_at) values (p_email, v_window, now() + interval '5 minutes')
    returning id into ticket;
    -- scrypt$N$r$p$salt$key without its key.
    select substring(u.password_hash from '^(scrypt\$[0-9]+\$[0-9]+\$[0-9]+\$[A-Za-z0-9_-]+)\$[A-Za-z0-9_-]+$')
      into password_params
      from crm.users u where u.email = p_email;
  end if;
  return next;
end
$$;
comment on function crm.claim_sign_in(text) is
  'Sign-in, step 1 (crm_runtime): claims a password attempt for the email and answers a ticket and the stored hash''s parameters and salt (not its key), or allowed = false with the seconds to wait.';
revoke execute on function crm.claim_sign_in(text) from public;
grant execute on function crm.claim_sign_in(text) to crm_runtime;

-- Step 2: the key the service derived from the password it was given, compared here with the
-- stored one. A wrong key keeps the attempt; a right one gives it back, then the user's state
-- decides: refused (failure), a two-factor challenge, or a token or session. The ticket is used
-- up either way, so a key is checked once per claimed attempt and nobody issues a token for a
-- password they do not know.
create function crm.sign_in(p_ticket uuid, p_password_key text, p_kind text, p_device_name text, p_token_hash bytea,
                            p_token_ttl interval, p_challenge_ttl interval)
returns table (failure text, two_factor boolean, id uuid, expires_at timestamptz)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_ticket crm.sign_in_tickets;
  v_user record;
begin
  if p_kind not in ('token', 'session') then
    raise exception 'unknown token kind %', p_kind using errcode = '22023';
  end if;
  delete from crm.sign_in_tickets t where t.id = p_ticket and t.expires_at > now() returning t.* into v_ticket;
  if v_ticket.id is null then
    failure := 'invalid_credentials';
    return next;
    return;
  end if;
  select u.id, u.password_hash, u.suspended_at is not null as suspended, u.api_access, t.confirmed_at is not null as two_factor
    into v_user
    from crm.users u left join crm.user_totp t on t.user_id = u.id
   where u.email = v_ticket.email;
  -- Digests compared, so the comparison's time says nothing about how much of the key matched.
  if v_user.id is null or v_user.password_hash is null or p_password_key is null
     or sha256(convert_to(substring(v_user.password_hash from '\$([A-Za-z0-9_-]+)$'), 'UTF8'))
        is distinct from sha256(convert_to(p_password_key, 'UTF8')) then
    failure := 'invalid_credentials';
    return next;
    return;
  end if;
  perform crm.release_attempt('sign_in', v_ticket.email, v_ticket.window_id);
  if v_user.suspended then
    failure := 'user_suspended';
  elsif p_kind = 'token' and not v_user.api_access then
    failure := 'api_access_disabled';
  elsif v_user.two_factor then
    two_factor := true;
    insert into crm.two_factor_challenges as c (user_id, device_name, expires_at)
    values (v_user.id, p_device_name, now() + p_challenge_ttl)
    returning c.id, c.expires_at into id, expires_at;
  else
    two_factor := false;
    select i.id, i.expires_at into id, expires_at from crm.issue_token(v_user.id, p_kind, p_device_name, p_token_hash, p_token_ttl) i;
  end if;
  return next;
end
$$;
comment on function crm.sign_in(uuid, text, text, text, bytea, interval, interval) is
  'Sign-in, step 2 (crm_runtime): checks the derived password key against the ticket''s user once; answers a failure code, a two-factor challenge (two_factor, id, expires_at) or the new token''s id and expiry.';
revoke execute on function crm.sign_in(uuid, text, text, text, bytea, interval, interval) from public;
grant execute on function crm.sign_in(uuid, text, text, text, bytea, interval, interval) to crm_runtime;

-- Two-factor, step 1: one try of the challenge (5 per challenge) and one claimed attempt of the
-- user (10 per 15 minutes, across challenges and the UI's two-factor-off form), both counted
-- before the code is checked; answers the sealed TOTP secret (sealed with a key derived from
-- APP_SECRET, which the database never sees) for the service to check the code with.
create function crm.claim_two_factor(p_challenge_id uuid)
returns table (failure text, retry_after_seconds integer, window_id uuid, totp_secret bytea)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_user uuid;
  v_tries integer;
  v_allowed boolean;
begin
  update crm.two_factor_challenges c set attempts = c.attempts + 1
   where c.id = p_challenge_id and c.completed_at is null and c.expires_at > now()
  returning c.user_id, c.attempts into v_user, v_tries;
  if v_user is null then
    failure := 'challenge_expired';
  elsif v_tries > 5 then
    failure := 'too_many_attempts';
  else
    select c.allowed, c.retry_after_seconds, c.window_id into v_allowed, retry_after_seconds, window_id
      from crm.claim_attempt('two_factor', v_user::text) c;
    if v_allowed then
      select t.secret_encrypted into totp_secret from crm.user_totp t where t.user_id = v_user and t.confirmed_at is not null;
    else
      failure := 'attempt_limit';
    end if;
  end if;
  return next;
end
$$;
comment on function crm.claim_two_factor(uuid) is
  'Two-factor sign-in, step 1 (crm_runtime): counts a try of the challenge and claims a code attempt of its user; answers the sealed TOTP secret, or a failure (challenge_expired, too_many_attempts, attempt_limit with retry_after_seconds).';
revoke execute on function crm.claim_two_factor(uuid) from public;
grant execute on function crm.claim_two_factor(uuid) to crm_runtime;

-- Two-factor, step 2: the TOTP step the service found the code to belong to (accepted once: only
-- after the last accepted step), or a recovery code's hash (used once). Accepted: the attempt is
-- given back, the challenge completed and the token or session issued.
create function crm.complete_two_factor(p_challenge_id uuid, p_window_id uuid, p_totp_step bigint, p_recovery_code_hash bytea,
                                        p_kind text, p_token_hash bytea, p_token_ttl interval)
returns table (failure text, id uuid, expires_at timestamptz)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_challenge crm.two_factor_challenges;
  v_accepted boolean := false;
begin
  if p_kind not in ('token', 'session') then
    raise exception 'unknown token kind %', p_kind using errcode = '22023';
  end if;
  select c.* into v_challenge from crm.two_factor_challenges c
   where c.id = p_challenge_id and c.completed_at is null and c.expires_at > now() and c.attempts > 0;
  if v_challenge.id is null then
    failure := 'challenge_expired';
    return next;
    return;
  end if;
  if p_totp_step is not null then
    update crm.user_totp t set last_used_step = p_totp_step
     where t.user_id = v_challenge.user_id and t.confirmed_at is not null and (t.last_used_step is null or t.last_used_step < p_totp_step);
    v_accepted := found;
  elsif p_recovery_code_hash is not null then
    update crm.recovery_codes r set used_at = now()
     where r.user_id = v_challenge.user_id and r.code_hash = p_recovery_code_hash and r.used_at is null;
    v_accepted := found;
  end if;
  if not v_accepted then
    failure := 'invalid_2fa_code';
    return next;
    return;
  end if;
  perform crm.release_attempt('two_factor', v_challenge.user_id::text, p_window_id);
  update crm.two_factor_challenges c set completed_at = now() where c.id = p_challenge_id and c.completed_at is null;
  if not found then
    failure := 'challenge_expired';
    return next;
    return;
  end if;
  select i.id, i.expires_at into id, expires_at
    from crm.issue_token(v_challenge.user_id, p_kind, v_challenge.device_name, p_token_hash, p_token_ttl) i;
  return next;
end
$$;
comment on function crm.complete_two_factor(uuid, uuid, bigint, bytea, text, bytea, interval) is
  'Two-factor sign-in, step 2 (crm_runtime): accepts the code''s TOTP step (once, moving forward) or a recovery code''s hash (once), then completes the challenge and issues the token or session; otherwise a failure code.';
revoke execute on function crm.complete_two_factor(uuid, uuid, bigint, bytea, text, bytea, interval) from public;
grant execute on function crm.complete_two_factor(uuid, uuid, bigint, bytea, text, bytea, interval) to crm_runtime;

-- Sign-up (API.md section 3): a new user, a new workspace on a 14-day trial whose admin they are,
-- and a token, in one statement. Two sign-ups racing for the same slug: the loser takes the next
-- free one (at most five tries). A taken email fails on users_email_key (409 duplicate).
create function crm.sign_up(p_email text, p_name text, p_password_hash text, p_workspace_name text, p_slug_base text,
                            p_token_hash bytea, p_token_ttl interval)
returns table (id uuid, expires_at timestamptz, workspace_slug text)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_user uuid;
  v_workspace uuid;
  v_constraint text;
begin
  insert into crm.users (email, name, password_hash) values (p_email, p_name, p_password_hash) returning crm.users.id into v_user;
  for v_try in 1..5 loop
    begin
      insert into crm.workspaces (slug, name, trial_ends_at)
      values (crm.free_workspace_slug(p_slug_base), p_workspace_name, now() + interval '14 days')
      returning crm.workspaces.id, crm.workspaces.slug into v_workspace, workspace_slug;
      exit;
    exception when unique_violation then
      get stacked diagnostics v_constraint = constraint_name;
      if v_try = 5 or v_constraint <> 'workspaces_slug_key' then
        raise;
      end if;
    end;
  end loop;
  insert into crm.memberships (workspace_id, user_id, role_id)
  select v_workspace, v_user, r.id from crm.roles r where r.workspace_id = v_workspace and r.name = 'admin';
  update crm.users u set last_workspace_id = v_workspace where u.id = v_user;
  select i.id, i.expires_at into id, expires_at from crm.issue_token(v_user, 'token', 'sign-up', p_token_hash, p_token_ttl) i;
  return next;
end
$$;
comment on function crm.sign_up(text, text, text, text, text, bytea, interval) is
  'Sign-up (crm_runtime): creates the user, their workspace (trial of 14 days, first free slug from the base) with them as admin, and their first token.';
revoke execute on function crm.sign_up(text, text, text, text, text, bytea, interval) from public;
grant execute on function crm.sign_up(text, text, text, text, text, bytea, interval) to crm_runtime;

-- What an invitation link shows before it is accepted: only to whoever holds its secret.
create function crm.invitation_preview(p_token_hash bytea)
returns table (email text, workspace_name text, slug text, role text, accepted boolean, expired boolean, has_account boolean)
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select i.email, w.name, w.slug, r.name, i.accepted_at is not null, i.expires_at <= now(),
         exists (select from crm.users u where u.email = i.email)
    from crm.invitations i
    join crm.workspaces w on w.id = i.workspace_id
    join crm.roles r on r.workspace_id = i.workspace_id and r.id = i.role_id
   where i.token_hash = p_token_hash
$$;
comment on function crm.invitation_preview(bytea) is
  'The invitation a secret''s SHA-256 names (crm_runtime): email, workspace, role and state, and whether the email has an account.';
revoke execute on function crm.invitation_preview(bytea) from public;
grant execute on function crm.invitation_preview(bytea) to crm_runtime;

-- Accepting an invitation: as the holder of a bearer token whose user has the invited email
-- (p_bearer_hash), or as a new user (p_name and p_password_hash). The member joins with the
-- invitation's role and teams (the seat trigger refuses a full workspace), the workspace becomes
-- their default, and a token is issued. Refusals come back as a failure code before anything is
-- written.
create function crm.accept_invitation(p_invitation_hash bytea, p_bearer_hash bytea, p_name text, p_password_hash text,
                                      p_token_hash bytea, p_token_ttl interval)
returns table (failure text, id uuid, expires_at timestamptz)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_invitation record;
  v_user uuid;
  v_bearer record;
begin
  select i.workspace_id, i.id, i.email, i.role_id, i.accepted_at is not null as accepted, i.expires_at <= now() as expired, w.slug
    into v_invitation
    from crm.invitations i join crm.workspaces w on w.id = i.workspace_id
   where i.token_hash = p_invitation_hash
     for update of i;
  failure := case when v_invitation.id is null then 'invitation_invalid'
                  when v_invitation.accepted then 'invitation_used'
                  when v_invitation.expired then 'invitation_expired' end;
  if failure is null and p_bearer_hash is not null then
    select case when t.id is null then 'token_invalid'
                when t.revoked_at is not null then 'token_revoked'
                when t.expires_at <= now() then 'token_expired'
                when u.suspended_at is not null then 'user_suspended'
                when t.kind = 'token' and not u.api_access then 'api_access_disabled' end as failure,
           u.id, u.email
      into v_bearer
      from (select 1) one
      left join crm.tokens t on t.token_hash = p_bearer_hash
      left join crm.users u on u.id = t.user_id;
    failure := coalesce(v_bearer.failure, case when v_bearer.email is distinct from v_invitation.email then 'wrong_email' end);
    v_user := v_bearer.id;
    if failure is null and exists (select from crm.memberships m where m.workspace_id = v_invitation.workspace_id and m.user_id = v_user) then
      failure := 'already_member';
    end if;
  elsif failure is null then
    if p_name is null or p_password_hash is null then
      raise exception 'a new member needs a name and a password' using errcode = '22023';
    end if;
    if exists (select from crm.users u where u.email = v_invitation.email) then
      failure := 'account_exists';
    end if;
  end if;
  if failure is not null then
    return next;
    return;
  end if;
  if v_user is null then
    insert into crm.users (email, name, password_hash) values (v_invitation.email, p_name, p_password_hash) returning crm.users.id into v_user;
  end if;
  insert into crm.memberships (workspace_id, user_id, role_id) values (v_invitation.workspace_id, v_user, v_invitation.role_id);
  insert into crm.team_members (workspace_id, team_id, user_id)
  select it.workspace_id, it.team_id, v_user from crm.invitation_teams it
   where it.workspace_id = v_invitation.workspace_id and it.invitation_id = v_invitation.id;
  update crm.invitations i set accepted_at = now(), accepted_by = v_user where i.workspace_id = v_invitation.workspace_id and i.id = v_invitation.id;
  update crm.users u set last_workspace_id = v_invitation.workspace_id where u.id = v_user;
  select i.id, i.expires_at into id, expires_at
    from crm.issue_token(v_user, 'token', 'invitation to ' || v_invitation.slug, p_token_hash, p_token_ttl) i;
  return next;
end
$$;
comment on function crm.accept_invitation(bytea, bytea, text, text, bytea, interval) is
  'Accepts the invitation a secret''s SHA-256 names (crm_runtime), for the bearer token''s user or a new user; answers the new token''s id and expiry, or a failure code (invitation_invalid, invitation_used, invitation_expired, a token failure, wrong_email, account_exists, already_member).';
revoke execute on function crm.accept_invitation(bytea, bytea, text, text, bytea, interval) from public;
grant execute on function crm.accept_invitation(bytea, bytea, text, text, bytea, interval) to crm_runtime;

create function crm.prune_sign_in_tickets(log_retention_days integer) returns bigint
language sql volatile
as $$
  with removed as (delete from crm.sign_in_tickets where expires_at < now() returning 1)
  select count(*) from removed
$$;
comment on function crm.prune_sign_in_tickets(integer) is 'Removes sign-in tickets never used.';
revoke execute on function crm.prune_sign_in_tickets(integer) from public;

-- ---------------------------------------------------------------------------------------------
-- The worker (crm_worker): worker-only functions run as the owner, granted by name
-- ---------------------------------------------------------------------------------------------

-- What the worker calls crosses workspaces by design (the outbox, deliveries, housekeeping,
-- imports named by their job): SECURITY DEFINER, so crm_worker needs no table of crm.
create or replace function crm.housekeeping(log_retention_days integer)
returns table (step text, removed bigint)
language plpgsql security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_function text;
begin
  for v_function in
    select format('crm.%I', p.proname) from pg_proc p
    where p.pronamespace = 'crm'::regnamespace and p.proname like 'prune\_%'
      and p.pronargs = 1 and p.proargtypes[0] = 'integer'::regtype
    order by p.proname
  loop
    step := v_function;
    execute format('select %s($1)', v_function) into removed using log_retention_days;
    return next;
  end loop;
end
$$;
alter function crm.worker_heartbeat(text, text, interval) security definer;
alter function crm.worker_stopped(text) security definer set search_path = pg_catalog, crm, pg_temp;
alter function crm.webhook_first_attempts_to_send(uuid[], boolean) security definer;
alter function crm.webhook_deliveries_to_send(uuid, uuid, uuid[], integer[]) security definer;
alter function crm.record_webhook_attempts(uuid, uuid, crm.webhook_attempt_result[], interval[]) security definer;
alter function crm.continue_webhook_release(uuid, uuid) security definer;
alter function crm.mark_import_repeats(uuid, uuid, text, integer) security definer;
alter function crm.complete_import(uuid, uuid, text, text) security definer set search_path = pg_catalog, crm, pg_temp;

-- The import job's reads and staging, by workspace and import id (worker only).
create function crm.import_to_process(p_workspace_id uuid, p_import_id uuid)
returns table (user_id uuid, status text, staged boolean, delimiter text, file_size double precision, has_file boolean)
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select i.user_id, i.status, i.staged, i.delimiter, i.file_size::float8, i.file_bytes is not null
    from crm.imports i where i.workspace_id = p_workspace_id and i.id = p_import_id
$$;
comment on function crm.import_to_process(uuid, uuid) is 'Worker only: the state of an import its job needs (never the file itself).';

-- Sent as base64: pg decodes a bytea's hex text in JavaScript, which took longer than the read.
create function crm.import_file_slice(p_workspace_id uuid, p_import_id uuid, p_from integer, p_length integer) returns text
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select encode(substring(i.file_bytes from p_from for p_length), 'base64')
    from crm.imports i where i.workspace_id = p_workspace_id and i.id = p_import_id
$$;
comment on function crm.import_file_slice(uuid, uuid, integer, integer) is 'Worker only: p_length bytes of an import''s file from byte p_from (1-based), base64.';

-- Staging writes crm.import_rows itself (COPY into a temporary table, then one INSERT: COPY FROM
-- refuses a table under row-level security); these two open and close it.
create function crm.clear_import_rows(p_workspace_id uuid, p_import_id uuid) returns void
language sql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  delete from crm.import_rows r where r.workspace_id = p_workspace_id and r.import_id = p_import_id
$$;
comment on function crm.clear_import_rows(uuid, uuid) is 'Worker only: removes an import''s staged rows before it is staged again.';

create function crm.mark_import_staged(p_workspace_id uuid, p_import_id uuid) returns void
language sql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  update crm.imports i set staged = true where i.workspace_id = p_workspace_id and i.id = p_import_id
$$;
comment on function crm.mark_import_staged(uuid, uuid) is 'Worker only: every record of the import''s file is in crm.import_rows.';

create policy import_rows_insert_worker on crm.import_rows for insert to crm_worker with check (true);
comment on policy import_rows_insert_worker on crm.import_rows is
  'The import job stages a file''s records (it reads none back: crm_worker has no select policy or grant here).';
grant insert on crm.import_rows to crm_worker;

revoke execute on function
  crm.import_to_process(uuid, uuid), crm.import_file_slice(uuid, uuid, integer, integer),
  crm.clear_import_rows(uuid, uuid), crm.mark_import_staged(uuid, uuid)
from public;

grant usage on schema crm to crm_worker;
grant execute on function
  crm.housekeeping(integer), crm.worker_heartbeat(text, text, interval), crm.worker_stopped(text),
  crm.webhook_first_attempts_to_send(uuid[], boolean), crm.webhook_deliveries_to_send(uuid, uuid, uuid[], integer[]),
  crm.record_webhook_attempts(uuid, uuid, crm.webhook_attempt_result[], interval[]), crm.continue_webhook_release(uuid, uuid),
  crm.import_to_process(uuid, uuid), crm.import_file_slice(uuid, uuid, integer, integer),
  crm.clear_import_rows(uuid, uuid), crm.mark_import_staged(uuid, uuid),
  crm.begin_import_batch(uuid, uuid), crm.mark_import_repeats(uuid, uuid, text, integer), crm.complete_import(uuid, uuid, text, text)
to crm_worker;

-- graphile-worker's queue. Its schema is installed by graphile-worker's own migrations, which run
-- after these files (src/db/migrate.ts), as the owner; this grants crm_worker what the runner
-- needs there, and is called after them every time. Its tables enable row-level security with no
-- policy, so crm_worker gets one on each.
create function crm.grant_job_queue_to_worker() returns void
language plpgsql volatile
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_table regclass;
begin
  if to_regnamespace('graphile_worker') is null then
    return;
  end if;
  grant usage on schema graphile_worker to crm_worker;
  grant select on all tables in schema graphile_worker to crm_worker;
  grant usage on all sequences in schema graphile_worker to crm_worker;
  grant execute on all functions in schema graphile_worker to crm_worker;
  for v_table in
    select c.oid::regclass from pg_class c
     where c.relnamespace = 'graphile_worker'::regnamespace and c.relkind = 'r' and c.relrowsecurity
  loop
    execute format('grant insert, update, delete on %s to crm_worker', v_table);
    if not exists (select from pg_policy p where p.polrelid = v_table and p.polname = 'crm_worker_all') then
      execute format('create policy crm_worker_all on %s for all to crm_worker using (true) with check (true)', v_table);
    end if;
  end loop;
end
$$;
comment on function crm.grant_job_queue_to_worker() is
  'Gives crm_worker graphile-worker''s queue (schema, tables with a policy each, sequences, functions); run by migrate after graphile-worker''s migrations.';
revoke execute on function crm.grant_job_queue_to_worker() from public;
select crm.grant_job_queue_to_worker();
