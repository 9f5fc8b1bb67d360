-- Credentials never widen. A token may yield another credential only when it is its user's whole
-- authority (an unscoped personal token or a UI session); a scoped token or an OAuth app's access
-- token yields none, and a revocation cannot be taken back.
--
-- - Accepting an invitation with a bearer: the bearer must be an unscoped personal token or a
--   session (failure token_not_allowed otherwise, before anything is written). The token issued
--   expires no later than the bearer, and the user's last used workspace stays where it was, so an
--   invitation from a stranger's workspace cannot redirect their slug-less integrations into it.
-- - Creating a token as crm_api: only an unscoped context, and only kind token (tokens_insert_own).
-- - Turning two-factor on or off takes the code's TOTP step and uses it up, like sign-in: a code
--   already accepted (at sign-in, on enrolment, or a moment before) cannot turn two-factor off.
-- - revoked_at, once set, is never cleared (crm.tg__revocation_is_final on tokens and grants).

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.accept_invitation(p_invitation_hash bytea, p_bearer_hash bytea, p_name text, p_password_hash text,
                                                 p_token_hash bytea, p_token_ttl interval)
returns table (failure text, id uuid, expires_at timestamptz)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_invitation record;
  v_user uuid;
  v_bearer record;
  v_ttl interval := p_token_ttl;
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
                when t.kind = 'token' and not u.api_access then 'api_access_disabled'
                when t.kind not in ('token', 'session') or t.scopes is not null then 'token_not_allowed' end as failure,
           u.id, u.email, t.expires_at
      into v_bearer
      from (select 1) one
      left join crm.tokens t on t.token_hash = p_bearer_hash
      left join crm.users u on u.id = t.user_id;
    failure := coalesce(v_bearer.failure, case when v_bearer.email is distinct from v_invitation.email then 'wrong_email' end);
    v_user := v_bearer.id;
    v_ttl := least(p_token_ttl, v_bearer.expires_at - now());
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
    insert into crm.users (email, name, password_hash, last_workspace_id)
    values (v_invitation.email, p_name, p_password_hash, v_invitation.workspace_id)
    returning crm.users.id into v_user;
  end if;
  insert into crm.memberships (workspace_id, user_id, role_id) values (v_invitation.workspace_id, v_user, v_invitation.role_id);
  insert into crm.team_members (workspace_id, team_id, user_id)
  select it.workspace_id, it.team_id, v_user from crm.invitation_teams it
   where it.workspace_id = v_invitation.workspace_id and it.invitation_id = v_invitation.id;
  update crm.invitations i set accepted_at = now(), accepted_by = v_user where i.workspace_id = v_invitation.workspace_id and i.id = v_invitation.id;
  select i.id, i.expires_at into id, expires_at
    from crm.issue_token(v_user, 'token', 'invitation to ' || v_invitation.slug, p_token_hash, v_ttl) i;
  return next;
end
$$;
comment on function crm.accept_invitation(bytea, bytea, text, text, bytea, interval) is
  'Accepts the invitation a secret''s SHA-256 names (crm_runtime), for the bearer''s user (an unscoped personal token or a session; the new token expires no later than it, and the last used workspace stays) or a new user (whose default the workspace becomes); answers the new token''s id and expiry, or a failure code (invitation_invalid, invitation_used, invitation_expired, a token failure, token_not_allowed, wrong_email, account_exists, already_member).';

alter policy tokens_insert_own on crm.tokens
  with check (user_id = (select crm.current_user_id()) and kind = 'token'
              and (select crm.current_oauth_app_id()) is null and (select crm.current_scopes()) is null);
comment on policy tokens_insert_own on crm.tokens is
  'A signed-in user creates API tokens for themself with an unscoped token or a session; a scoped token or an OAuth access token creates none (it would outlive or outgrow its own limits).';

-- Two-factor on and off, each with the step of the code the service checked.
drop function crm.confirm_totp_enrollment(bytea[]);
create function crm.confirm_totp_enrollment(p_recovery_code_hashes bytea[], p_totp_step bigint) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
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
$$;
comment on function crm.confirm_totp_enrollment(bytea[], bigint) is
  'Turns two-factor on for the current user (the service has checked a code, whose TOTP step is used up) and replaces the recovery codes.';
revoke execute on function crm.confirm_totp_enrollment(bytea[], bigint) from public;
grant execute on function crm.confirm_totp_enrollment(bytea[], bigint) to crm_api;

drop function crm.disable_totp();
create function crm.disable_totp(p_totp_step bigint) returns boolean
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
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
$$;
comment on function crm.disable_totp(bigint) is
  'Turns two-factor off for the current user when the code the service checked is of a TOTP step not used yet (it is used up), and clears their count of two-factor codes; false when the step was used already.';
revoke execute on function crm.disable_totp(bigint) from public;
grant execute on function crm.disable_totp(bigint) to crm_api;

create function crm.tg__revocation_is_final() returns trigger
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  raise exception 'a revoked % stays revoked', tg_table_name using errcode = 'CR409', hint = 'conflict';
end
$$;
comment on function crm.tg__revocation_is_final() is
  'Refuses clearing revoked_at once it is set (tokens, OAuth grants): a revocation is never undone, not even by the owner.';
revoke execute on function crm.tg__revocation_is_final() from public;

create trigger tg_tokens__revocation_is_final before update of revoked_at on crm.tokens
  for each row when (old.revoked_at is not null and new.revoked_at is null)
  execute function crm.tg__revocation_is_final();
create trigger tg_oauth_grants__revocation_is_final before update of revoked_at on crm.oauth_grants
  for each row when (old.revoked_at is not null and new.revoked_at is null)
  execute function crm.tg__revocation_is_final();
