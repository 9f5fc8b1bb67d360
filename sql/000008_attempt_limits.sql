-- Attempt limits for sign-in passwords (per email) and two-factor codes (per user), claimed before
-- the check. One counter row per (purpose, subject): a claim increments it in one INSERT ... ON
-- CONFLICT DO UPDATE, which locks the row, so concurrent attempts for one subject take their turns
-- and at most the remaining allowance goes on to be checked; the rest are refused at once.

-- Transaction-local limits, as in every migration: waiting long for a lock would hold up every
-- query queued behind the migration, and no statement here should run for long.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

create table crm.attempt_counters (
  purpose text not null constraint attempt_counters_purpose_known check (purpose in ('sign_in', 'two_factor')),
  subject text not null,
  attempts integer not null constraint attempt_counters_attempts_not_negative check (attempts >= 0),
  window_id uuid not null default crm.uuid_v7(),
  window_ends_at timestamptz not null,
  primary key (purpose, subject)
);
alter table crm.attempt_counters enable row level security;
-- Serves crm.prune_attempt_counters.
create index attempt_counters_window_ends_at_idx on crm.attempt_counters (window_ends_at);
comment on table crm.attempt_counters is
  'Attempts per subject in a fixed 15-minute window that starts with the first attempt after the previous window ended: sign-in by email (known or not), two-factor codes by user id. Reached only through crm.claim_attempt and crm.release_attempt (owner only).';
comment on column crm.attempt_counters.attempts is 'Attempts claimed in this window and not released: each counts as a failure until its check succeeds.';
comment on column crm.attempt_counters.window_id is 'Names the window, so a release after the window was replaced does not give the new window an attempt back.';

create function crm.attempt_allowance(p_purpose text) returns integer
language sql immutable parallel safe
as $$
  select case p_purpose when 'sign_in' then 5 when 'two_factor' then 10 end
$$;
comment on function crm.attempt_allowance(text) is 'Failures allowed per subject and 15-minute window: 5 passwords per email, 10 two-factor codes per user (API.md section 3).';
revoke execute on function crm.attempt_allowance(text) from public;

-- The claim comes before the check, and a refused claim changes nothing (the window is not
-- extended by attempts made while refused). A check that succeeds releases its own claim: a right
-- password or code is not a failure, but it does not clear the failures before it either, so a
-- guesser gains nothing from the owner signing in meanwhile.
create function crm.claim_attempt(p_purpose text, p_subject text)
returns table (allowed boolean, retry_after_seconds integer, window_id uuid)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
  v_allowance integer := crm.attempt_allowance(p_purpose);
  v_window_id uuid;
  v_window_ends_at timestamptz;
begin
  insert into crm.attempt_counters as c (purpose, subject, attempts, window_ends_at)
  values (p_purpose, p_subject, 1, now() + interval '15 minutes')
  on conflict (purpose, subject) do update
    set attempts = case when c.window_ends_at <= now() then 1 else c.attempts + 1 end,
        window_id = case when c.window_ends_at <= now() then crm.uuid_v7() else c.window_id end,
        window_ends_at = case when c.window_ends_at <= now() then now() + interval '15 minutes' else c.window_ends_at end
    where c.window_ends_at <= now() or c.attempts < v_allowance
  returning c.window_id into v_window_id;
  if v_window_id is not null then
    return query select true, 0, v_window_id;
    return;
  end if;
  -- Refused: the row is locked by the statement above and read again with a fresh snapshot.
  select c.window_id, c.window_ends_at into v_window_id, v_window_ends_at
    from crm.attempt_counters c where c.purpose = p_purpose and c.subject = p_subject;
  return query select false, greatest(1, ceil(extract(epoch from v_window_ends_at - now())))::integer, v_window_id;
end
$$;
comment on function crm.claim_attempt(text, text) is
  'Claims one attempt for a subject before its check: allowed (and counted) while the window has allowance left, else refused with the seconds until the window ends.';
revoke execute on function crm.claim_attempt(text, text) from public;

create function crm.release_attempt(p_purpose text, p_subject text, p_window_id uuid) returns void
language sql volatile
set search_path = pg_catalog, pg_temp
as $$
  update crm.attempt_counters c set attempts = c.attempts - 1
   where c.purpose = p_purpose and c.subject = p_subject and c.window_id = p_window_id and c.attempts > 0
$$;
comment on function crm.release_attempt(text, text, uuid) is 'Gives back an allowed claim whose check succeeded (a right password or code is no failure).';
revoke execute on function crm.release_attempt(text, text, uuid) from public;

-- The per-email failures of crm.sign_in_failures move into the counters, so lockouts in progress
-- hold across the upgrade; the table and its reader then go.
insert into crm.attempt_counters (purpose, subject, attempts, window_ends_at)
  select 'sign_in', email, count(*)::integer, min(failed_at) + interval '15 minutes'
    from crm.sign_in_failures
   where failed_at > now() - interval '15 minutes'
   group by email;

create or replace function crm.prune_tenancy(log_retention_days integer) returns bigint
language sql volatile
as $$
  with tokens as (delete from crm.tokens where expires_at < now() - interval '7 days' or revoked_at < now() - interval '7 days' returning 1),
       counters as (delete from crm.rate_limit_counters where window_start < now() - interval '2 minutes' returning 1),
       challenges as (delete from crm.two_factor_challenges where expires_at < now() - interval '1 hour' returning 1)
  select (select count(*) from tokens) + (select count(*) from counters) + (select count(*) from challenges)
$$;
comment on function crm.prune_tenancy(integer) is 'Removes expired tokens (a week after expiry or revocation), rate-limit windows and challenges.';

drop function crm.sign_in_failures_recent(text);
-- squawk-ignore ban-drop-table
drop table crm.sign_in_failures; -- fifteen minutes of throttling state, carried into crm.attempt_counters above

create function crm.prune_attempt_counters(log_retention_days integer) returns bigint
language sql volatile
as $$
  with removed as (delete from crm.attempt_counters where window_ends_at < now() returning 1)
  select count(*) from removed
$$;
comment on function crm.prune_attempt_counters(integer) is 'Removes attempt counters whose window has ended.';
revoke execute on function crm.prune_attempt_counters(integer) from public;

-- ---------------------------------------------------------------------------------------------
-- The UI's two-factor-off form asks for a code too, inside the signed-in user's transaction as
-- crm_api: it claims from the same per-user count. The claim commits with the page (a wrong code
-- renders the form again, it does not roll back).
create function crm.claim_my_two_factor_attempt() returns table (allowed boolean, retry_after_seconds integer)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_user uuid := crm.current_user_id();
begin
  if v_user is null then
    raise exception 'no signed-in user' using errcode = 'CR401', hint = 'token_invalid';
  end if;
  return query select c.allowed, c.retry_after_seconds from crm.claim_attempt('two_factor', v_user::text) c;
end
$$;
comment on function crm.claim_my_two_factor_attempt() is 'Claims a two-factor code attempt for the current user before the service checks the code (the count of crm.claim_attempt).';
grant execute on function crm.claim_my_two_factor_attempt() to crm_api;

-- Turning two-factor off (after a right code) also ends the count of codes tried against the
-- secret that goes with it; a new enrollment starts from nothing.
create or replace function crm.disable_totp() returns void
language sql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
  delete from crm.recovery_codes r where r.user_id = crm.current_user_id();
  delete from crm.user_totp t where t.user_id = crm.current_user_id();
  delete from crm.attempt_counters c where c.purpose = 'two_factor' and c.subject = crm.current_user_id()::text;
$$;
comment on function crm.disable_totp() is 'Turns two-factor off for the current user (the service has checked a code first) and clears their count of two-factor codes.';
