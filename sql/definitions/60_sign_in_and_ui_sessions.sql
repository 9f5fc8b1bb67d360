-- Sign-in and UI sessions: one-use tickets, two-factor enrollment and challenges, recovery codes,
-- attempt limits.
-- Applied by `crm migrate` whenever a file of sql/definitions/ changes, as a whole and in file order
-- (sql/CONVENTIONS.md): edit the definition here; it is the only one.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.attempt_allowance(p_purpose text)
 returns integer
 language sql
 immutable parallel safe
as $function$
  select case p_purpose when 'sign_in' then 5 when 'two_factor' then 10 end
$function$;
comment on function crm.attempt_allowance(p_purpose text) is
  'Failures allowed per subject and 15-minute window: 5 passwords per email, 10 two-factor codes per user '
  '(docs/api.md section 3).';

create or replace function crm.claim_attempt(p_purpose text, p_subject text)
 returns table(allowed boolean, retry_after_seconds integer, window_id uuid)
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
  return query
    select false, least(900, greatest(1, ceil(extract(epoch from v_window_ends_at - clock_timestamp()))))::integer, v_window_id;
end
$function$;
comment on function crm.claim_attempt(p_purpose text, p_subject text) is
  'Claims one attempt for a subject before its check: allowed (and counted) while the window has allowance left, else '
  'refused with the seconds until the window ends.';

create or replace function crm.release_attempt(p_purpose text, p_subject text, p_window_id uuid)
 returns void
 language sql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  update crm.attempt_counters c set attempts = c.attempts - 1
   where c.purpose = p_purpose and c.subject = p_subject and c.window_id = p_window_id and c.attempts > 0
$function$;
comment on function crm.release_attempt(p_purpose text, p_subject text, p_window_id uuid) is
  'Gives back an allowed claim whose check succeeded (a right password or code is no failure).';

create or replace function crm.prune_attempt_counters(log_retention_days integer)
 returns bigint
 language sql
as $function$
  with removed as (delete from crm.attempt_counters where window_ends_at < now() returning 1)
  select count(*) from removed
$function$;
comment on function crm.prune_attempt_counters(log_retention_days integer) is
  'Removes attempt counters whose window has ended.';

create or replace function crm.claim_sign_in(p_email text)
 returns table(allowed boolean, retry_after_seconds integer, ticket uuid, password_params text)
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.claim_sign_in(p_email text) is
  'Sign-in, step 1 (crm_runtime): claims a password attempt for the email and answers a ticket and the stored hash''s '
  'parameters and salt (not its key), or allowed = false with the seconds to wait.';
grant execute on function crm.claim_sign_in(p_email text) to crm_runtime;

create or replace function crm.sign_in(
  p_ticket uuid,
  p_password_key text,
  p_kind text,
  p_device_name text,
  p_token_hash bytea,
  p_token_ttl interval,
  p_challenge_ttl interval
)
 returns table(failure text, two_factor boolean, id uuid, expires_at timestamp with time zone)
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
    -- An unknown email has no workspace to tell; a known one's admins see the failure.
    perform crm.audit_write_for_user(v_user.id, 'user.sign_in_failed', jsonb_build_object('reason', failure));
    return next;
    return;
  end if;
  perform crm.release_attempt('sign_in', v_ticket.email, v_ticket.window_id);
  if v_user.suspended then
    failure := 'user_suspended';
    perform crm.audit_write_for_user(v_user.id, 'user.sign_in_failed', jsonb_build_object('reason', failure));
  elsif p_kind = 'token' and not v_user.api_access then
    failure := 'api_access_disabled';
    perform crm.audit_write_for_user(v_user.id, 'user.sign_in_failed', jsonb_build_object('reason', failure));
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
$function$;
comment on function crm.sign_in(
  p_ticket uuid,
  p_password_key text,
  p_kind text,
  p_device_name text,
  p_token_hash bytea,
  p_token_ttl interval,
  p_challenge_ttl interval
) is
  'Sign-in, step 2 (crm_runtime): checks the derived password key against the ticket''s user once; answers a failure '
  'code, a two-factor challenge (two_factor, id, expires_at) or the new token''s id and expiry.';
grant execute
  on function crm.sign_in(
    p_ticket uuid,
    p_password_key text,
    p_kind text,
    p_device_name text,
    p_token_hash bytea,
    p_token_ttl interval,
    p_challenge_ttl interval
  )
  to crm_runtime;

create or replace function crm.prune_sign_in_tickets(log_retention_days integer)
 returns bigint
 language sql
as $function$
  with removed as (delete from crm.sign_in_tickets where expires_at < now() returning 1)
  select count(*) from removed
$function$;
comment on function crm.prune_sign_in_tickets(log_retention_days integer) is 'Removes sign-in tickets never used.';

create or replace function crm.tg_user_totp__recent_sign_in()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  -- In a request only: the owner's own SQL (an operator, a fixture) is no request.
  if old.confirmed_at is null and new.confirmed_at is not null and crm.current_token_id() is not null
     and not crm.signed_in_recently() then
    raise exception 'turning two-factor on needs a sign-in within the last 10 minutes'
      using errcode = 'CR403', hint = 'reauthentication_required';
  end if;
  return new;
end
$function$;
comment on function crm.tg_user_totp__recent_sign_in() is
  'Refuses turning two-factor on (confirmed_at set) in a request whose token or session does not come from a sign-in '
  'within the last 10 minutes (CR403 reauthentication_required).';

create or replace function crm.tg_user_totp__steps_only_forward()
 returns trigger
 language plpgsql
as $function$
begin
  if old.last_used_step is not null and (new.last_used_step is null or new.last_used_step <= old.last_used_step) then
    raise exception 'a TOTP step is used once: % is not after %', new.last_used_step, old.last_used_step
      using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return new;
end
$function$;
comment on function crm.tg_user_totp__steps_only_forward() is
  'Refuses moving last_used_step back or setting it again to the same step: a code is accepted once.';
grant execute on function crm.tg_user_totp__steps_only_forward() to crm_api;

create or replace function crm.my_totp()
 returns table(secret_encrypted bytea, confirmed boolean, recovery_codes_left integer)
 language sql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select t.secret_encrypted, t.confirmed_at is not null,
         (select count(*)::integer from crm.recovery_codes r where r.user_id = t.user_id and r.used_at is null)
    from crm.user_totp t
   where t.user_id = crm.current_user_id()
$function$;
comment on function crm.my_totp() is
  'The current user''s (encrypted) TOTP secret, whether it is confirmed, and unused recovery codes; no row when '
  'two-factor is off.';
grant execute on function crm.my_totp() to crm_api;

create or replace function crm.start_totp_enrollment(p_secret_encrypted bytea)
 returns void
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_user uuid := crm.current_user_id();
begin
  if v_user is null then
    raise exception 'no signed-in user' using errcode = 'CR401', hint = 'token_invalid';
  end if;
  if exists (select 1 from crm.user_totp t where t.user_id = v_user and t.confirmed_at is not null) then
    raise exception 'two-factor sign-in is already on; turn it off first' using errcode = 'CR409', hint = 'conflict';
  end if;
  insert into crm.user_totp (user_id, secret_encrypted) values (v_user, p_secret_encrypted)
  on conflict (user_id) do update set secret_encrypted = excluded.secret_encrypted, created_at = now();
end
$function$;
comment on function crm.start_totp_enrollment(p_secret_encrypted bytea) is
  'Stores a new, unconfirmed TOTP secret for the current user (refused while two-factor is on).';
grant execute on function crm.start_totp_enrollment(p_secret_encrypted bytea) to crm_api;

create or replace function crm.confirm_totp_enrollment(p_recovery_code_hashes bytea[], p_totp_step bigint)
 returns void
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_user uuid := crm.current_user_id();
begin
  update crm.user_totp t set confirmed_at = now(), last_used_step = p_totp_step where t.user_id = v_user and t.confirmed_at is null;
  if not found then
    raise exception 'no two-factor enrollment is waiting for confirmation' using errcode = 'CR409', hint = 'conflict';
  end if;
  delete from crm.recovery_codes r where r.user_id = v_user;
  insert into crm.recovery_codes (user_id, code_hash) select v_user, h from unnest(p_recovery_code_hashes) h;
end
$function$;
comment on function crm.confirm_totp_enrollment(p_recovery_code_hashes bytea[], p_totp_step bigint) is
  'Turns two-factor on for the current user (the service has checked a code, whose TOTP step is used up) and replaces '
  'the recovery codes.';
grant execute on function crm.confirm_totp_enrollment(p_recovery_code_hashes bytea[], p_totp_step bigint) to crm_api;

create or replace function crm.disable_totp(p_totp_step bigint)
 returns boolean
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_user uuid := crm.current_user_id();
begin
  -- The row lock this takes also orders two requests with the same code: the second finds the step used.
  update crm.user_totp t set last_used_step = p_totp_step
   where t.user_id = v_user and t.confirmed_at is not null and (t.last_used_step is null or t.last_used_step < p_totp_step);
  if not found then
    return false;
  end if;
  delete from crm.recovery_codes r where r.user_id = v_user;
  delete from crm.user_totp t where t.user_id = v_user;
  delete from crm.attempt_counters c where c.purpose = 'two_factor' and c.subject = v_user::text;
  return true;
end
$function$;
comment on function crm.disable_totp(p_totp_step bigint) is
  'Turns two-factor off for the current user when the code the service checked is of a TOTP step not used yet (it is '
  'used up), and clears their count of two-factor codes; false when the step was used already.';
grant execute on function crm.disable_totp(p_totp_step bigint) to crm_api;

create or replace function crm.claim_two_factor(p_challenge_id uuid)
 returns table(failure text, retry_after_seconds integer, window_id uuid, totp_secret bytea)
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.claim_two_factor(p_challenge_id uuid) is
  'Two-factor sign-in, step 1 (crm_runtime): counts a try of the challenge and claims a code attempt of its user; '
  'answers the sealed TOTP secret, or a failure (challenge_expired, too_many_attempts, attempt_limit with '
  'retry_after_seconds).';
grant execute on function crm.claim_two_factor(p_challenge_id uuid) to crm_runtime;

create or replace function crm.claim_my_two_factor_attempt()
 returns table(allowed boolean, retry_after_seconds integer)
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_user uuid := crm.current_user_id();
begin
  if v_user is null then
    raise exception 'no signed-in user' using errcode = 'CR401', hint = 'token_invalid';
  end if;
  return query select c.allowed, c.retry_after_seconds from crm.claim_attempt('two_factor', v_user::text) c;
end
$function$;
comment on function crm.claim_my_two_factor_attempt() is
  'Claims a two-factor code attempt for the current user before the service checks the code (the count of '
  'crm.claim_attempt).';
grant execute on function crm.claim_my_two_factor_attempt() to crm_api;

create or replace function crm.complete_two_factor(
  p_challenge_id uuid,
  p_window_id uuid,
  p_totp_step bigint,
  p_recovery_code_hash bytea,
  p_kind text,
  p_token_hash bytea,
  p_token_ttl interval
)
 returns table(failure text, id uuid, expires_at timestamp with time zone)
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.complete_two_factor(
  p_challenge_id uuid,
  p_window_id uuid,
  p_totp_step bigint,
  p_recovery_code_hash bytea,
  p_kind text,
  p_token_hash bytea,
  p_token_ttl interval
) is
  'Two-factor sign-in, step 2 (crm_runtime): accepts the code''s TOTP step (once, moving forward) or a recovery '
  'code''s hash (once), then completes the challenge and issues the token or session; otherwise a failure code.';
grant execute
  on function crm.complete_two_factor(
    p_challenge_id uuid,
    p_window_id uuid,
    p_totp_step bigint,
    p_recovery_code_hash bytea,
    p_kind text,
    p_token_hash bytea,
    p_token_ttl interval
  )
  to crm_runtime;

comment on table crm.attempt_counters is
  'Attempts per subject in a fixed 15-minute window that starts with the first attempt after the previous window '
  'ended: sign-in by email (known or not), two-factor codes by user id. Reached only through crm.claim_attempt and '
  'crm.release_attempt (owner only).';
comment on column crm.attempt_counters.attempts is
  'Attempts claimed in this window and not released: each counts as a failure until its check succeeds.';
comment on column crm.attempt_counters.window_id is
  'Names the window, so a release after the window was replaced does not give the new window an attempt back.';
create policy attempt_counters_all_owner on crm.attempt_counters as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy attempt_counters_all_owner on crm.attempt_counters is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';

comment on table crm.sign_in_tickets is
  'One row per sign-in attempt claimed by crm.claim_sign_in and not yet checked by crm.sign_in, which uses it up: a '
  'password is checked once per claimed attempt. Unlogged: after a crash the attempts in flight are simply refused.';
create policy sign_in_tickets_all_owner on crm.sign_in_tickets as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy sign_in_tickets_all_owner on crm.sign_in_tickets is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';

comment on table crm.user_totp is
  'TOTP secrets, AES-256-GCM encrypted with a key derived from APP_SECRET; two-factor is on once confirmed_at is set.';
comment on column crm.user_totp.last_used_step is
  'The RFC 6238 time step of the last code accepted at sign-in; a code of this step or an earlier one is refused.';
create policy user_totp_all_owner on crm.user_totp as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy user_totp_all_owner on crm.user_totp is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
CREATE TRIGGER tg_user_totp__recent_sign_in BEFORE UPDATE OF confirmed_at ON crm.user_totp
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_user_totp__recent_sign_in();
CREATE TRIGGER tg_user_totp__steps_only_forward BEFORE UPDATE OF last_used_step ON crm.user_totp
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_user_totp__steps_only_forward();

comment on table crm.recovery_codes is
  'Single-use recovery codes, SHA-256 hashed (they are high-entropy random strings).';
create policy recovery_codes_all_owner on crm.recovery_codes as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy recovery_codes_all_owner on crm.recovery_codes is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';

comment on table crm.two_factor_challenges is
  'Pending second steps of a sign-in; the signed challenge token names one row, which allows 5 tries.';
create policy two_factor_challenges_all_owner on crm.two_factor_challenges as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy two_factor_challenges_all_owner on crm.two_factor_challenges is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
