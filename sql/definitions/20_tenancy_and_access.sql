-- Tenancy and access: workspaces, users, memberships, roles and grants, teams, invitations, tokens,
-- the rate limit, the request context's writer and the policy helpers, the audit views.
-- Applied by `crm migrate` whenever a file of sql/definitions/ changes, as a whole and in file order
-- (sql/CONVENTIONS.md): edit the definition here; it is the only one.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.tg_workspaces__create_builtin_roles()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_admin uuid;
  v_member uuid;
  v_read_only uuid;
begin
  insert into crm.roles (workspace_id, name, is_admin, is_builtin) values (new.id, 'admin', true, true) returning id into v_admin;
  insert into crm.roles (workspace_id, name, is_admin, is_builtin) values (new.id, 'member', false, true) returning id into v_member;
  insert into crm.roles (workspace_id, name, is_admin, is_builtin) values (new.id, 'read_only', false, true) returning id into v_read_only;
  insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
  select new.id, v_admin, r, a, 'all'
  from unnest(array['contacts', 'companies', 'deals']) r, unnest(array['view', 'create', 'update', 'delete', 'import', 'export']) a
  union all
  select new.id, v_member, r, a, case a when 'view' then 'all' else 'own' end
  from unnest(array['contacts', 'companies', 'deals']) r, unnest(array['view', 'create', 'update', 'delete']) a
  union all
  select new.id, v_read_only, r, 'view', 'all'
  from unnest(array['contacts', 'companies', 'deals']) r;
  return null;
end
$function$;
comment on function crm.tg_workspaces__create_builtin_roles() is
  'admin (every grant, all), member (view all; create, update, delete own), read_only (view all).';
grant execute on function crm.tg_workspaces__create_builtin_roles() to crm_api;

create or replace function crm.tg_workspaces__delete_records()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  -- Their outbox triggers write *.deleted events, which crm.tg_workspaces__delete_events removes after the workspace.
  delete from crm.deals d where d.workspace_id = old.id;
  delete from crm.contacts c where c.workspace_id = old.id;
  delete from crm.companies c where c.workspace_id = old.id;
  return old;
end
$function$;
comment on function crm.tg_workspaces__delete_records() is
  'Deletes a workspace''s deals, contacts and companies before the workspace itself (the cascade a workspace foreign '
  'key would give: the record tables have none, their owner keys prove the workspace exists).';
grant execute on function crm.tg_workspaces__delete_records() to crm_api;

create or replace function crm.tg_workspaces__seed_deal_stages()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  insert into crm.deal_stages (workspace_id, key, label, position, is_closed, is_won)
  select n.id, s.key, s.label, s.position, s.is_closed, s.is_won
    from new_workspaces n
   cross join (values ('lead', 'Lead', 0, false, false),
                      ('qualified', 'Qualified', 1, false, false),
                      ('proposal', 'Proposal', 2, false, false),
                      ('negotiation', 'Negotiation', 3, false, false),
                      ('won', 'Won', 4, true, true),
                      ('lost', 'Lost', 5, true, false)) as s (key, label, position, is_closed, is_won);
  return null;
end
$function$;
comment on function crm.tg_workspaces__seed_deal_stages() is
  'Gives every new workspace the default pipeline: lead, qualified, proposal, negotiation, won, lost.';
grant execute on function crm.tg_workspaces__seed_deal_stages() to crm_api;

create or replace function crm.free_workspace_slug(p_base text)
 returns text
 language sql
 stable
as $function$
  select candidate
  from (select p_base as candidate, 1 as n
        union all
        select left(p_base, 56) || '-' || n, n from generate_series(2, 100000) n) c
  where not exists (select 1 from crm.workspaces w where w.slug = c.candidate)
  order by n
  limit 1
$function$;
comment on function crm.free_workspace_slug(p_base text) is
  'The first free slug of base, base-2, base-3, ... (sign-up retries on the rare race for the same one).';

create or replace function crm.tg_users__only_narrow_when_scoped()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  perform crm.refuse_widening('Setting a password');
  return new;
end
$function$;
comment on function crm.tg_users__only_narrow_when_scoped() is
  'A scoped credential sets no password: a password signs in to the user''s whole authority.';

create or replace function crm.tg_memberships__check_seats()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_limit integer;
  v_used integer;
begin
  if new.suspended_at is not null or (tg_op = 'UPDATE' and old.suspended_at is null) then
    return new;
  end if;
  -- Lock the workspace row so two concurrent joins cannot both take the last seat.
  select seat_limit into v_limit from crm.workspaces where id = new.workspace_id for update;
  if v_limit is null then return new; end if;
  select count(*) into v_used from crm.memberships
  where workspace_id = new.workspace_id and suspended_at is null and user_id <> new.user_id;
  if v_used >= v_limit then
    raise exception 'no seat left: % of % seats are in use', v_used, v_limit using errcode = 'CR422', hint = 'seat_limit_reached';
  end if;
  return new;
end
$function$;
comment on function crm.tg_memberships__check_seats() is
  'Active members may not exceed the workspace seat limit (on join and on unsuspend).';
grant execute on function crm.tg_memberships__check_seats() to crm_api;

create or replace function crm.tg_memberships__keep_an_admin()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if exists (select 1 from crm.workspaces where id = old.workspace_id)
     and exists (select 1 from crm.roles r where r.workspace_id = old.workspace_id and r.id = old.role_id and r.is_admin)
     and not exists (
       select 1 from crm.memberships m join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
       where m.workspace_id = old.workspace_id and r.is_admin and m.suspended_at is null) then
    raise exception 'the last admin of a workspace cannot be removed, demoted or suspended' using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return null;
end
$function$;
comment on function crm.tg_memberships__keep_an_admin() is 'A workspace always keeps at least one active admin.';
grant execute on function crm.tg_memberships__keep_an_admin() to crm_api;

create or replace function crm.tg_memberships__next_access_version()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  new.access_version := nextval('crm.access_versions');
  return new;
end
$function$;
comment on function crm.tg_memberships__next_access_version() is
  'A membership created, or its role, suspension or version written: it takes the next access version, and cached '
  'identities of it are stale.';

create or replace function crm.tg_memberships__only_narrow_when_scoped()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.refuse_widening('Adding a member');
  elsif old.suspended_at is not null and new.suspended_at is null then
    perform crm.refuse_widening('Unsuspending a member');
  elsif new.role_id is distinct from old.role_id and crm.credential_is_scoped() and (
          new.workspace_id is distinct from old.workspace_id
          or exists (select from crm.roles r where r.workspace_id = new.workspace_id and r.id = new.role_id and r.is_admin)
          or exists (select from crm.role_grants g
                      where g.workspace_id = new.workspace_id and g.role_id = new.role_id
                        and not exists (select from crm.role_grants o
                                         where o.workspace_id = old.workspace_id and o.role_id = old.role_id
                                           and o.resource = g.resource and o.action = g.action
                                           and array_position(array['own', 'team', 'all'], o.scope)
                                               >= array_position(array['own', 'team', 'all'], g.scope)))) then
    perform crm.refuse_widening('Giving a member an admin role or one that grants more than their current one');
  end if;
  return new;
end
$function$;
comment on function crm.tg_memberships__only_narrow_when_scoped() is
  'A scoped credential adds no member, unsuspends none, and changes a role only to a non-admin one whose grants are '
  'within the current role''s (same resource and action, a scope no wider: own < team < all).';

create or replace function crm.tg_roles__bump_access_versions()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  update crm.memberships m set access_version = m.access_version + 1
    from new_rows n join old_rows o on o.workspace_id = n.workspace_id and o.id = n.id
   where n.is_admin is distinct from o.is_admin and m.workspace_id = n.workspace_id and m.role_id = n.id;
  return null;
end
$function$;
comment on function crm.tg_roles__bump_access_versions() is
  'A role''s admin flag changed: its members'' cached identities are stale.';

create or replace function crm.tg_roles__keep_an_admin()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if old.is_admin and not new.is_admin and not exists (
       select 1 from crm.memberships m join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
       where m.workspace_id = new.workspace_id and r.is_admin and m.suspended_at is null) then
    raise exception 'the last admin of a workspace cannot be demoted' using errcode = 'CR422', hint = 'validation_failed', detail = '/is_admin';
  end if;
  return null;
end
$function$;
comment on function crm.tg_roles__keep_an_admin() is
  'Turning is_admin off on a custom role must leave the workspace an active admin (the membership trigger cannot see '
  'this change).';
grant execute on function crm.tg_roles__keep_an_admin() to crm_api;

create or replace function crm.tg_roles__only_narrow_when_scoped()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if new.is_admin and (tg_op = 'INSERT' or not old.is_admin) then
    perform crm.refuse_widening('Making a role admin');
  end if;
  return new;
end
$function$;
comment on function crm.tg_roles__only_narrow_when_scoped() is
  'A scoped credential creates no admin role and makes no role admin (a role without grants, not admin, widens '
  'nobody).';

create or replace function crm.tg_roles__protect_builtin()
 returns trigger
 language plpgsql
as $function$
begin
  if tg_op = 'DELETE' and old.is_builtin and exists (select 1 from crm.workspaces where id = old.workspace_id) then
    raise exception 'built-in role % cannot be deleted', old.name using errcode = 'CR422', hint = 'validation_failed';
  elsif tg_op = 'UPDATE' and old.is_builtin then
    raise exception 'built-in role % cannot be changed', old.name using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return coalesce(new, old);
end
$function$;
comment on function crm.tg_roles__protect_builtin() is
  'Refuses changes to built-in roles (they are removed only with their workspace).';
grant execute on function crm.tg_roles__protect_builtin() to crm_api;

create or replace function crm.tg_roles__refuse_delete_in_use()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  -- A workspace being deleted takes its roles with it: only a role of a live workspace is checked.
  if exists (select 1 from crm.workspaces where id = old.workspace_id)
     and (exists (select 1 from crm.memberships where workspace_id = old.workspace_id and role_id = old.id)
          or exists (select 1 from crm.invitations where workspace_id = old.workspace_id and role_id = old.id and accepted_at is null)) then
    raise exception 'role % is in use by members or pending invitations; give them another role first', old.name
      using errcode = 'CR409', hint = 'role_in_use';
  end if;
  return old;
end
$function$;
comment on function crm.tg_roles__refuse_delete_in_use() is
  'A role held by a member or named by a pending invitation cannot be deleted (409 role_in_use).';
grant execute on function crm.tg_roles__refuse_delete_in_use() to crm_api;

create or replace function crm.tg_role_grants__bump_access_versions()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  -- One function for the three events: each branch reads only the transition tables its event has.
  if tg_op = 'INSERT' then
    update crm.memberships m set access_version = m.access_version + 1
      from (select distinct n.workspace_id, n.role_id from new_rows n) r
     where m.workspace_id = r.workspace_id and m.role_id = r.role_id;
  elsif tg_op = 'DELETE' then
    update crm.memberships m set access_version = m.access_version + 1
      from (select distinct o.workspace_id, o.role_id from old_rows o) r
     where m.workspace_id = r.workspace_id and m.role_id = r.role_id;
  else
    update crm.memberships m set access_version = m.access_version + 1
      from (select n.workspace_id, n.role_id from new_rows n union select o.workspace_id, o.role_id from old_rows o) r
     where m.workspace_id = r.workspace_id and m.role_id = r.role_id;
  end if;
  return null;
end
$function$;
comment on function crm.tg_role_grants__bump_access_versions() is
  'A role''s grants changed: its members'' cached identities are stale.';

create or replace function crm.tg_role_grants__only_narrow_when_scoped()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.refuse_widening('Adding a grant to a role');
  elsif (new.workspace_id, new.role_id, new.resource, new.action) is distinct from (old.workspace_id, old.role_id, old.resource, old.action)
        or array_position(array['own', 'team', 'all'], new.scope) > array_position(array['own', 'team', 'all'], old.scope) then
    perform crm.refuse_widening('Widening a role''s grant');
  end if;
  return new;
end
$function$;
comment on function crm.tg_role_grants__only_narrow_when_scoped() is
  'A scoped credential adds no grant to a role and widens none (it may remove a grant or narrow its scope: all > team '
  '> own).';

create or replace function crm.tg_role_grants__protect_builtin()
 returns trigger
 language plpgsql
as $function$
declare
  v_role crm.roles;
begin
  select * into v_role from crm.roles where workspace_id = coalesce(new.workspace_id, old.workspace_id) and id = coalesce(new.role_id, old.role_id);
  -- During workspace creation the trigger above inserts the built-in grants: allow inserts then.
  if v_role.is_builtin and (tg_op <> 'INSERT' or v_role.created_at <> now()) and found then
    raise exception 'grants of built-in role % cannot be changed', v_role.name using errcode = 'CR422', hint = 'validation_failed';
  end if;
  return coalesce(new, old);
end
$function$;
comment on function crm.tg_role_grants__protect_builtin() is
  'Refuses grant changes on built-in roles after their creation transaction.';
grant execute on function crm.tg_role_grants__protect_builtin() to crm_api;

create or replace function crm.tg_team_members__only_narrow_when_scoped()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  perform crm.refuse_widening('Adding a member to a team');
  return new;
end
$function$;
comment on function crm.tg_team_members__only_narrow_when_scoped() is
  'A scoped credential puts nobody into a team (the team scope would show them their teammates'' records, and their '
  'records to the team).';

create or replace function crm.tg_invitations__only_narrow_when_scoped()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  perform crm.refuse_widening('Inviting a member');
  return new;
end
$function$;
comment on function crm.tg_invitations__only_narrow_when_scoped() is
  'A scoped credential invites nobody, with any role or team: the accepted invitation is a new user''s unscoped '
  'credential, which would outlive the token.';

create or replace function crm.invitation_preview(p_token_hash bytea)
 returns table(
   email text,
   workspace_name text,
   slug text,
   role text,
   accepted boolean,
   expired boolean,
   has_account boolean
 )
 language sql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select i.email, w.name, w.slug, r.name, i.accepted_at is not null, i.expires_at <= now(),
         exists (select from crm.users u where u.email = i.email)
    from crm.invitations i
    join crm.workspaces w on w.id = i.workspace_id
    join crm.roles r on r.workspace_id = i.workspace_id and r.id = i.role_id
   where i.token_hash = p_token_hash
$function$;
comment on function crm.invitation_preview(p_token_hash bytea) is
  'The invitation a secret''s SHA-256 names (crm_runtime): email, workspace, role and state, and whether the email '
  'has an account.';
grant execute on function crm.invitation_preview(p_token_hash bytea) to crm_runtime;

create or replace function crm.accept_invitation(
  p_invitation_hash bytea,
  p_bearer_hash bytea,
  p_name text,
  p_password_hash text,
  p_token_hash bytea,
  p_token_ttl interval
)
 returns table(failure text, id uuid, expires_at timestamp with time zone)
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.accept_invitation(
  p_invitation_hash bytea,
  p_bearer_hash bytea,
  p_name text,
  p_password_hash text,
  p_token_hash bytea,
  p_token_ttl interval
) is
  'Accepts the invitation a secret''s SHA-256 names (crm_runtime), for the bearer''s user (an unscoped personal token '
  'or a session; the new token expires no later than it, and the last used workspace stays) or a new user (whose '
  'default the workspace becomes); answers the new token''s id and expiry, or a failure code (invitation_invalid, '
  'invitation_used, invitation_expired, a token failure, token_not_allowed, wrong_email, account_exists, '
  'already_member).';
grant execute
  on function crm.accept_invitation(
    p_invitation_hash bytea,
    p_bearer_hash bytea,
    p_name text,
    p_password_hash text,
    p_token_hash bytea,
    p_token_ttl interval
  )
  to crm_runtime;

create or replace function crm.prune_invitations(log_retention_days integer)
 returns bigint
 language sql
as $function$
  with gone as (
    delete from crm.invitations
    where accepted_at is null and expires_at < now() - make_interval(days => log_retention_days)
    returning 1)
  select count(*) from gone
$function$;
comment on function crm.prune_invitations(log_retention_days integer) is
  'Removes invitations that expired unaccepted more than the retention period ago (they stay listed as expired until '
  'then).';

create or replace function crm.tg__revocation_is_final()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  raise exception 'a revoked % stays revoked', tg_table_name using errcode = 'CR409', hint = 'conflict';
end
$function$;
comment on function crm.tg__revocation_is_final() is
  'Refuses clearing revoked_at once it is set (tokens, OAuth grants): a revocation is never undone, not even by the '
  'owner.';

create or replace function crm.tg_tokens__authenticated_at()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if crm.current_token_id() is null then
    -- A sign-in, a sign-up or the OAuth token endpoint: issued on a proof made now (the default).
    new.authenticated_at := now();
    return new;
  end if;
  new.authenticated_at := coalesce((select t.authenticated_at from crm.tokens t where t.id = crm.current_token_id()), '-infinity');
  -- Requests insert as crm_api; an invitation accepted with a bearer (the owner's function) issues
  -- a token no longer-lived than that bearer, its own rule.
  if current_user = 'crm_api' and new.kind = 'token' and new.expires_at > now() + interval '1 day'
     and not crm.is_recent_sign_in(new.authenticated_at) then
    raise exception 'a token that lasts more than a day needs a sign-in within the last 10 minutes'
      using errcode = 'CR403', hint = 'reauthentication_required';
  end if;
  return new;
end
$function$;
comment on function crm.tg_tokens__authenticated_at() is
  'Sets a new token''s authenticated_at (now for a sign-in, the calling token''s own in a request) and refuses a '
  'request''s token that lasts more than a day without a recent sign-in (CR403 reauthentication_required).';

create or replace function crm.tg_tokens__revoke_oauth_grant()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  update crm.oauth_grants g set revoked_at = new.revoked_at
   where g.workspace_id = new.workspace_id and g.id = new.oauth_grant_id and g.revoked_at is null;
  return null;
end
$function$;
comment on function crm.tg_tokens__revoke_oauth_grant() is
  'A revoked OAuth access token revokes its grant (and with it the refresh tokens and the other access tokens).';

create or replace function crm.is_recent_sign_in(authenticated_at timestamp with time zone)
 returns boolean
 language sql
 stable
return (authenticated_at > (now() - '00:10:00'::interval));
comment on function crm.is_recent_sign_in(authenticated_at timestamp with time zone) is
  'Whether a sign-in at this time is recent enough to turn two-factor on or create a token that lasts more than a '
  'day: within 10 minutes.';
grant execute on function crm.is_recent_sign_in(authenticated_at timestamp with time zone) to crm_api;

create or replace function crm.signed_in_recently()
 returns boolean
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  return coalesce((select crm.is_recent_sign_in(t.authenticated_at) from crm.tokens t where t.id = crm.current_token_id()), false);
end
$function$;
comment on function crm.signed_in_recently() is
  'Whether the calling token or session comes from a sign-in within the last 10 minutes (false without a request '
  'context). The pages ask it before offering what needs one.';
grant execute on function crm.signed_in_recently() to crm_api;

create or replace function crm.issue_token(p_user_id uuid, p_kind text, p_name text, p_token_hash bytea, p_ttl interval)
 returns table(id uuid, expires_at timestamp with time zone)
 language sql
as $function$
  insert into crm.tokens (user_id, kind, name, token_hash, expires_at)
  values (p_user_id, p_kind, left(p_name, 200), p_token_hash, now() + p_ttl)
  returning id, expires_at
$function$;
comment on function crm.issue_token(p_user_id uuid, p_kind text, p_name text, p_token_hash bytea, p_ttl interval) is
  'Stores a new token or session (its SHA-256 only).';

create or replace function crm.sign_up(
  p_email text,
  p_name text,
  p_password_hash text,
  p_workspace_name text,
  p_slug_base text,
  p_token_hash bytea,
  p_token_ttl interval
)
 returns table(id uuid, expires_at timestamp with time zone, workspace_slug text)
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.sign_up(
  p_email text,
  p_name text,
  p_password_hash text,
  p_workspace_name text,
  p_slug_base text,
  p_token_hash bytea,
  p_token_ttl interval
) is
  'Sign-up (crm_runtime): creates the user, their workspace (trial of 14 days, first free slug from the base) with '
  'them as admin, and their first token.';
grant execute
  on function crm.sign_up(
    p_email text,
    p_name text,
    p_password_hash text,
    p_workspace_name text,
    p_slug_base text,
    p_token_hash bytea,
    p_token_ttl interval
  )
  to crm_runtime;

create or replace function crm.prune_tenancy(log_retention_days integer)
 returns bigint
 language sql
as $function$
  with tokens as (delete from crm.tokens where expires_at < now() - interval '7 days' or revoked_at < now() - interval '7 days' returning 1),
       counters as (delete from crm.rate_limit_counters where window_start < now() - interval '2 minutes' returning 1),
       challenges as (delete from crm.two_factor_challenges where expires_at < now() - interval '1 hour' returning 1)
  select (select count(*) from tokens) + (select count(*) from counters) + (select count(*) from challenges)
$function$;
comment on function crm.prune_tenancy(log_retention_days integer) is
  'Removes expired tokens (a week after expiry or revocation), rate-limit windows and challenges.';

create or replace function crm.count_request(p_user_id uuid)
 returns void
 language sql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  insert into crm.rate_limit_counters as c (user_id, window_start, backend_pid, count)
  values (p_user_id, date_trunc('minute', now()), pg_backend_pid(), 1)
  on conflict (user_id, window_start, backend_pid) do update set count = c.count + 1
$function$;
comment on function crm.count_request(p_user_id uuid) is
  'Counts a request whose transaction rolled back against the user''s rate limit.';
grant execute on function crm.count_request(p_user_id uuid) to crm_runtime;

create or replace function crm.settle_request_counts(
  p_source integer,
  p_window_start timestamp with time zone,
  p_user_ids uuid[],
  p_counts integer[]
)
 returns table(user_id uuid, total integer, snapshot pg_snapshot)
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_now_window constant timestamptz := date_trunc('minute', now());
  v_lock_class constant integer := hashtext('crm.settle_request_counts');
  v_key integer;
begin
  if p_source is null or p_source >= 0 then
    raise exception 'crm.settle_request_counts: the counter id must be a negative integer (positive ones are backend pids), got %', p_source
      using errcode = '22023';
  end if;
  if p_window_start is null or p_window_start <> date_trunc('minute', p_window_start) then
    raise exception 'crm.settle_request_counts: the window must start on a whole minute, got %', p_window_start
      using errcode = '22023';
  end if;
  -- The window that just ended (its last counts settle after the minute turns), the current one,
  -- or the next (the process's clock a little ahead of the database's); anything else is a clock
  -- that is wrong.
  if p_window_start < v_now_window - interval '1 minute' or p_window_start > v_now_window + interval '1 minute' then
    raise exception 'crm.settle_request_counts: the window % is more than a minute from the database''s current window %; check the clocks',
      p_window_start, v_now_window
      using errcode = '22023';
  end if;
  if p_user_ids is null or p_counts is null
     or coalesce(array_length(p_user_ids, 1), 0) <> coalesce(array_length(p_counts, 1), 0) then
    raise exception 'crm.settle_request_counts: p_user_ids and p_counts must be arrays of equal length, got % and %',
      array_length(p_user_ids, 1), array_length(p_counts, 1)
      using errcode = '22023';
  end if;
  if array_position(p_user_ids, null) is not null or array_position(p_counts, null) is not null
     or exists (select from unnest(p_counts) c where c < 0) then
    raise exception 'crm.settle_request_counts: user ids must not be null and counts must be 0 or more'
      using errcode = '22023';
  end if;

  -- One user at a time across every process, in one order (the lock keys sorted), so two
  -- settlements of overlapping users cannot deadlock.
  for v_key in select distinct hashtext(u::text) as k from unnest(p_user_ids) u order by k loop
    perform pg_advisory_xact_lock(v_lock_class, v_key);
  end loop;

  -- A user named twice gets the sum of their counts; 0 asks only for the total.
  insert into crm.rate_limit_counters as rc (user_id, window_start, backend_pid, count)
  select g.user_id, p_window_start, p_source, g.count
    from (select u.user_id, sum(u.count)::integer as count
            from unnest(p_user_ids, p_counts) as u (user_id, count)
           group by u.user_id) g
   where g.count > 0
  on conflict on constraint rate_limit_counters_pkey do update set count = rc.count + excluded.count;

  -- One join for every user: the planner picks index probes for a few users, one pass over the
  -- table (a few minutes of rows) for many. The snapshot is the one this read counted with: which
  -- transactions it saw the end of.
  return query
    select u.user_id, coalesce(sum(c.count), 0)::integer, pg_current_snapshot()
      from (select distinct x.user_id from unnest(p_user_ids) as x (user_id)) u
      left join crm.rate_limit_counters c on c.user_id = u.user_id and c.window_start = p_window_start
     group by u.user_id;
end
$function$;
comment on function crm.settle_request_counts(
  p_source integer,
  p_window_start timestamp with time zone,
  p_user_ids uuid[],
  p_counts integer[]
) is
  'Rate limit (crm_runtime): adds an API process''s request counts (p_counts, 0 or more) for the users p_user_ids in '
  'the clock minute p_window_start under its counter id p_source (a negative integer chosen per process, never a '
  'backend pid), and answers each user''s total in that window over every process and backend, with the snapshot the '
  'totals were read with. Settlements of one user are serialised, so each total includes every earlier settlement. '
  'Run it as its own statement, outside a request transaction (the locks last until commit).';
grant execute
  on function crm.settle_request_counts(
    p_source integer,
    p_window_start timestamp with time zone,
    p_user_ids uuid[],
    p_counts integer[]
  )
  to crm_runtime;

create or replace function crm.put_context(
  p_user_id uuid,
  p_workspace_id uuid,
  p_via text,
  p_scopes text[],
  p_oauth_app_id uuid,
  p_token_id uuid default NULL::uuid,
  p_oauth_grant_id uuid default NULL::uuid,
  p_cache_key text default NULL::text
)
 returns boolean
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_admin boolean;
  v_grants text;
  v_team boolean;
  v_team_ids text := '0';
  v_context text;
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
  v_context := crm.context_line(p_user_id, p_workspace_id, p_oauth_app_id, p_via, p_scopes, v_admin, v_grants, v_team_ids,
                                p_token_id, p_oauth_grant_id);
  perform crm.write_context(v_context);
  if p_cache_key is not null and p_token_id is not null then
    update crm.tokens t
       set context = case when coalesce(v_team, false) then null else v_context end,
           context_key = case when coalesce(v_team, false) then null else p_cache_key end
     where t.id = p_token_id and t.context_key is distinct from case when coalesce(v_team, false) then null else p_cache_key end;
  end if;
  return true;
end
$function$;
comment on function crm.put_context(
  p_user_id uuid,
  p_workspace_id uuid,
  p_via text,
  p_scopes text[],
  p_oauth_app_id uuid,
  p_token_id uuid,
  p_oauth_grant_id uuid,
  p_cache_key text
) is
  'Writes the request context: user, workspace, OAuth app, via, token scopes, the active membership''s admin flag, '
  'its role''s grants narrowed by the scopes, the team when a grant is team, the calling token and its OAuth grant. '
  'Grants hold for the transaction as of this call. With p_cache_key (crm.authenticate), also keeps the text on the '
  'token (crm.tokens.context) unless it names a team. Internal.';

create or replace function crm.context_cache_key(p_workspace_id uuid, p_access_version bigint, p_via text)
 returns text
 language sql
 immutable parallel safe
return ((
          (
            (
              (
                p_workspace_id)::text || ' '::text) || (p_access_version)::text) || ' '::text) || COALESCE(p_via, 'api'::text));
comment on function crm.context_cache_key(p_workspace_id uuid, p_access_version bigint, p_via text) is
  'The key under which a token keeps its request context: workspace, the membership''s access_version and via. '
  'Internal.';

create or replace function crm.set_context(
  p_user_id uuid,
  p_workspace_id uuid,
  p_via text,
  p_scopes text[],
  p_oauth_app_id uuid
)
 returns void
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  perform crm.put_context(p_user_id, p_workspace_id, p_via, p_scopes, p_oauth_app_id);
end
$function$;
comment on function crm.set_context(
  p_user_id uuid,
  p_workspace_id uuid,
  p_via text,
  p_scopes text[],
  p_oauth_app_id uuid
) is
  'Sets the transaction-local request context (user, workspace, via, token scopes, OAuth app) with its proof. Not '
  'executable by crm_api.';

create or replace function crm.authenticate(p_token_hash bytea, p_slug text, p_via text, p_rate_limit integer)
 returns table(
   failure text,
   user_id uuid,
   workspace_id uuid,
   workspace_slug text,
   token_id uuid,
   token_kind text,
   is_admin boolean,
   rate_count integer,
   rate_reset_seconds integer,
   scopes text[],
   oauth_app_id uuid,
   access_version bigint,
   counted_in xid8
 )
 language plpgsql
 SECURITY DEFINER ROWS 1
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
 set plan_cache_mode to 'force_generic_plan'
 set enable_seqscan to 'off'
as $function$
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
                           a.token_id, a.oauth_grant_id,
                           crm.context_cache_key(a.workspace_id, a.access_version, p_via)) as written,
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
         a.scopes, a.oauth_app_id, a.access_version,
         -- The transaction holding this request's count: the process asks a settlement's snapshot
         -- whether it had ended by then (src/auth/rate-limit.ts).
         case when a.user_id is not null then pg_current_xact_id() end
    from counted k
    left join admitted a on true
    left join context x on true;
end
$function$;
comment on function crm.authenticate(p_token_hash bytea, p_slug text, p_via text, p_rate_limit integer) is
  'Per-request authentication in one call: token (expiry, revocation, bound workspace), user (suspension, API '
  'access), workspace choice (slug, else last used, else oldest joined), membership suspension, the rate-limit '
  'counter, last-used bookkeeping, and the proven request context with the token''s scopes and OAuth app. Returns '
  'failure = the API error code when refused, the membership''s access_version for a cached identity '
  '(crm.resume_identity), and counted_in, the transaction that holds the request''s count.';
grant execute on function crm.authenticate(p_token_hash bytea, p_slug text, p_via text, p_rate_limit integer)
  to crm_api;

create or replace function crm.resume_identity(
  p_token_hash bytea,
  p_workspace_id uuid,
  p_access_version bigint,
  p_via text,
  p_follows_last_workspace boolean
)
 returns table(failure text, user_id uuid)
 language plpgsql
 SECURITY DEFINER ROWS 1
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
#variable_conflict use_column
declare
  v_caller record;
  v_due boolean;
  v_written text;
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
  -- An assignment, not PERFORM: PL/pgSQL evaluates it as a simple expression, where PERFORM runs
  -- a query through the executor (measured: about 8 us of the call's 50-60 us of backend CPU).
  if v_caller.context_key = crm.context_cache_key(p_workspace_id, p_access_version, p_via) then
    v_written := crm.write_context(v_caller.context);
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
$function$;
comment on function crm.resume_identity(
  p_token_hash bytea,
  p_workspace_id uuid,
  p_access_version bigint,
  p_via text,
  p_follows_last_workspace boolean
) is
  'A cached identity''s authentication: sets the proven context when the token is still valid and the membership''s '
  'access_version is the cached one; user_id is the token''s user. Otherwise failure = ''stale'', nothing is set, and '
  'the caller authenticates with crm.authenticate. Writes the last-used bookkeeping when due, except in a read-only '
  'transaction on the primary (a long read, authenticated in a short transaction first).';
grant execute
  on function crm.resume_identity(
    p_token_hash bytea,
    p_workspace_id uuid,
    p_access_version bigint,
    p_via text,
    p_follows_last_workspace boolean
  )
  to crm_api;

create or replace function crm.touch_caller(
  p_user_id uuid,
  p_workspace_id uuid,
  p_set_workspace boolean,
  p_token_id uuid,
  p_touch_token boolean
)
 returns boolean
 language plpgsql
as $function$
begin
  if p_set_workspace then
    update crm.users set last_workspace_id = p_workspace_id where id = p_user_id;
  end if;
  if p_touch_token then
    update crm.tokens set last_used_at = now() where id = p_token_id;
  end if;
  return true;
end
$function$;
comment on function crm.touch_caller(
  p_user_id uuid,
  p_workspace_id uuid,
  p_set_workspace boolean,
  p_token_id uuid,
  p_touch_token boolean
) is
  'crm.authenticate''s bookkeeping: the user''s last workspace and the token''s last use, when they change (internal).';

create or replace function crm.require_confined_role()
 returns boolean
 language sql
 stable
as $function$
  select case when pg_catalog.row_security_active('crm.contacts'::pg_catalog.regclass)
               and pg_catalog.pg_has_role(current_user, 'crm_api', 'usage')
               and not pg_catalog.pg_has_role(current_user, 'crm_owner', 'member')
              then true
              else crm.refuse_unconfined_role()
         end
$function$;
comment on function crm.require_confined_role() is
  'True when the current role is subject to the policies of crm_api and to no policy of crm_owner; raises 42501 (hint '
  'role_not_confined) otherwise. Inlined into the statement that asks.';
grant execute on function crm.require_confined_role() to crm_api;

create or replace function crm.refuse_unconfined_role()
 returns boolean
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'pg_temp'
as $function$
begin
  raise exception 'a read under row-level security must run as a role confined by it, not as %', current_user
    using errcode = '42501', hint = 'role_not_confined';
end
$function$;
comment on function crm.refuse_unconfined_role() is
  'Raises 42501 (hint role_not_confined): crm.require_confined_role''s refusal (internal; crm_api calls that).';
grant execute on function crm.refuse_unconfined_role() to crm_api;

create or replace function crm.verified_context(
  OUT user_id uuid,
  OUT workspace_id uuid,
  OUT scopes text[],
  OUT oauth_app_id uuid
)
 returns record
 language plpgsql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  user_id := crm.current_user_id();
  workspace_id := crm.current_workspace_id();
  scopes := case when user_id is not null then crm.current_scopes() end;
  oauth_app_id := crm.current_oauth_app_id();
end
$function$;
comment on function crm.verified_context(
  OUT user_id uuid,
  OUT workspace_id uuid,
  OUT scopes text[],
  OUT oauth_app_id uuid
) is
  'The (user, workspace, token scopes, OAuth app) of this transaction when its proof checks out; nulls otherwise. '
  'scopes null with a user = an unscoped token.';

create or replace function crm.team_user_ids(p_user_id uuid, p_workspace_id uuid)
 returns uuid[]
 language sql
 stable
as $function$
  select array(
    select p_user_id
    union
    select mate.user_id
    from crm.team_members mine
    join crm.team_members mate on mate.workspace_id = mine.workspace_id and mate.team_id = mine.team_id
    where mine.workspace_id = p_workspace_id and mine.user_id = p_user_id
  )
$function$;
comment on function crm.team_user_ids(p_user_id uuid, p_workspace_id uuid) is
  'A user and everyone sharing a team with them in a workspace (internal; not granted to crm_api).';

create or replace function crm.scopes_cover(p_scopes text[], p_resource text, p_action text)
 returns boolean
 language sql
 immutable parallel safe
return COALESCE((p_scopes && ARRAY[(p_resource || ':write'::text),
                                   CASE WHEN (p_action = ANY (
                                                ARRAY['view'::text, 'export'::text])) THEN (p_resource || ':read'::text)
                                        ELSE NULL::text
                                   END]),
                true);
comment on function crm.scopes_cover(p_scopes text[], p_resource text, p_action text) is
  'Whether a token''s scopes allow resource:action (null = unscoped: everything the role allows). view and export '
  'need <resource>:read or :write; create, update, delete and import need <resource>:write.';
grant execute on function crm.scopes_cover(p_scopes text[], p_resource text, p_action text) to crm_api;

create or replace function crm.scopes_cover_link(p_scopes text[], p_contact_id uuid, p_company_id uuid, p_deal_id uuid)
 returns boolean
 language sql
 immutable parallel safe
return COALESCE((p_scopes && ARRAY[CASE WHEN (p_contact_id IS NOT NULL) THEN 'contacts:write'::text
                                        ELSE NULL::text END, CASE
                                        WHEN (p_company_id IS NOT NULL) THEN 'companies:write'::text
                                        ELSE NULL::text END, CASE
                                        WHEN (p_deal_id IS NOT NULL) THEN 'deals:write'::text
                                        ELSE NULL::text
                                   END]),
                true);
comment on function crm.scopes_cover_link(p_scopes text[], p_contact_id uuid, p_company_id uuid, p_deal_id uuid) is
  'Whether a token''s scopes may change a link: write on the type of one of its two ends (null = unscoped: yes).';
grant execute on function crm.scopes_cover_link(p_scopes text[], p_contact_id uuid, p_company_id uuid, p_deal_id uuid)
  to crm_api;

create or replace function crm.scopes_include(p_scopes text[], p_scope text)
 returns boolean
 language sql
 immutable parallel safe
return COALESCE((p_scope = ANY (p_scopes)), true);
comment on function crm.scopes_include(p_scopes text[], p_scope text) is
  'Whether a token''s scopes hold one named scope such as workspace:admin (null = unscoped: yes).';
grant execute on function crm.scopes_include(p_scopes text[], p_scope text) to crm_api;

create or replace function crm.credential_is_scoped()
 returns boolean
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  -- Without a context the scopes read as the empty list: only a request's context is a scoped credential.
  return crm.current_user_id() is not null and crm.current_scopes() is not null;
end
$function$;
comment on function crm.credential_is_scoped() is
  'Whether the request context is a scoped token''s (every OAuth app''s token is): false for an unscoped token, a '
  'session and code without a context.';
grant execute on function crm.credential_is_scoped() to crm_api;

create or replace function crm.refuse_widening(p_what text)
 returns void
 language plpgsql
 stable
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if crm.credential_is_scoped() then
    raise exception '% needs an unscoped session or personal token: a scoped token or an app''s token may only narrow access', p_what
      using errcode = 'CR403', hint = 'forbidden';
  end if;
end
$function$;
comment on function crm.refuse_widening(p_what text) is
  'Raises CR403 forbidden, naming what was tried, when the request context is a scoped token''s '
  '(crm.credential_is_scoped); the triggers that keep a scoped credential from widening anyone''s access call it.';
grant execute on function crm.refuse_widening(p_what text) to crm_api;

create or replace function crm.colleague_ids()
 returns uuid[]
 language plpgsql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  return array(select m.user_id from crm.memberships m where m.workspace_id = crm.current_workspace_id());
end
$function$;
comment on function crm.colleague_ids() is
  'The members of the current workspace (lets members see each other''s names).';
grant execute on function crm.colleague_ids() to crm_api;

create or replace function crm.my_workspace_ids()
 returns uuid[]
 language plpgsql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  return array(select m.workspace_id from crm.memberships m
                where m.user_id = crm.current_user_id()
                  and (crm.current_oauth_app_id() is null or m.workspace_id = crm.current_workspace_id()));
end
$function$;
comment on function crm.my_workspace_ids() is
  'Every workspace the current user belongs to (for the workspace list and its role names); for an OAuth app''s '
  'access token, its own workspace only.';
grant execute on function crm.my_workspace_ids() to crm_api;

create or replace function crm.proven_import_id()
 returns uuid
 language plpgsql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
declare
  v_import text := nullif(current_setting('crm.import_id', true), '');
begin
  if v_import is null or v_import !~ '^[0-9a-f-]{36}$' or crm.current_user_id() is null then
    return null;
  end if;
  if crm.import_proof(v_import::uuid) is distinct from current_setting('crm.import_proof', true) then
    return null;
  end if;
  return v_import::uuid;
end
$function$;
comment on function crm.proven_import_id() is
  'The import id crm.begin_import_batch set when its proof checks out, else null (crm.current_import_id).';
grant execute on function crm.proven_import_id() to crm_api;

create or replace function crm.current_import_id()
 returns uuid
 language sql
 stable
return CASE WHEN (
              NULLIF(current_setting('crm.import_id'::text, true), ''::text) IS NOT NULL) THEN crm.proven_import_id()
            ELSE NULL::uuid
       END;
comment on function crm.current_import_id() is
  'The import this transaction lands rows for, or null (no proven import context).';
grant execute on function crm.current_import_id() to crm_api;

create or replace function crm.import_proof(p_import_id uuid)
 returns text
 language sql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select encode(
    public.hmac(convert_to('import/' || p_import_id::text || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8'),
                (select value from crm.internal_secrets where name = 'context_proof'),
                'sha256'),
    'hex')
$function$;
comment on function crm.import_proof(p_import_id uuid) is 'HMAC binding an import to this backend and transaction.';

create or replace function crm.act_as(p_email text, p_slug text)
 returns text
 language plpgsql
as $function$
begin
  return crm.act_as(p_email, p_slug, scopes => null);
end
$function$;
comment on function crm.act_as(p_email text, p_slug text) is
  'crm.act_as without scopes: every following query of the transaction runs as crm_api with the member''s whole role, '
  'as their unscoped tokens and sessions do.';

create or replace function crm.act_as(p_email text, p_slug text, scopes text[])
 returns text
 language plpgsql
as $function$
declare
  v_user_id uuid;
  v_workspace_id uuid;
begin
  if act_as.scopes is not null and not crm.scopes_are_valid(act_as.scopes) then
    raise exception 'crm.act_as: scopes must be 1 to 9 distinct names of crm.known_scopes()' using errcode = 'CR422', hint = 'validation_failed';
  end if;
  select u.id, w.id into v_user_id, v_workspace_id
  from crm.users u
  join crm.memberships m on m.user_id = u.id
  join crm.workspaces w on w.id = m.workspace_id
  where u.email = lower(p_email) and w.slug = p_slug;
  if v_user_id is null then
    raise exception 'crm.act_as: % is not a member of workspace %', p_email, p_slug using errcode = 'CR404', hint = 'not_found';
  end if;
  perform crm.set_context(v_user_id, v_workspace_id, 'system', act_as.scopes, null);
  -- Invoker's rights: only a role allowed to run set_context (the owner, a superuser) gets here.
  perform set_config('role', 'crm_api', true);
  return format('acting as %s in %s%s until the end of this transaction', lower(p_email), p_slug,
                case when act_as.scopes is null then '' else ' with scopes ' || array_to_string(act_as.scopes, ' ') end);
end
$function$;
comment on function crm.act_as(p_email text, p_slug text, scopes text[]) is
  'Inside a transaction (BEGIN ... ROLLBACK), makes every following query run as crm_api with the member''s proven '
  'context, limited to the given token scopes (null: the whole role): you see exactly what such a token sees through '
  'the API.';

create view crm.permission_matrix as
 SELECT w.slug AS workspace,
    r.name AS role,
    g.resource,
    g.action,
    g.scope
   FROM crm.role_grants g
     JOIN crm.roles r ON r.workspace_id = g.workspace_id AND r.id = g.role_id
     JOIN crm.workspaces w ON w.id = g.workspace_id;
comment on view crm.permission_matrix is 'Every grant of every role: workspace, role, resource, action, scope.';

create view crm.member_access as
 SELECT w.slug AS workspace,
    u.email,
    r.name AS role,
    g.resource,
    g.action,
    g.scope
   FROM crm.memberships m
     JOIN crm.users u ON u.id = m.user_id
     JOIN crm.workspaces w ON w.id = m.workspace_id
     JOIN crm.roles r ON r.workspace_id = m.workspace_id AND r.id = m.role_id
     JOIN crm.role_grants g ON g.workspace_id = r.workspace_id AND g.role_id = r.id
  WHERE m.suspended_at IS NULL AND u.suspended_at IS NULL;
comment on view crm.member_access is 'Effective access of every active member (suspended members and users have none).';

create view crm.scope_actions as
 SELECT s.scope,
    r.resource,
    a.action
   FROM unnest(crm.known_scopes()) WITH ORDINALITY s(scope, "position"),
    unnest(ARRAY['contacts'::text, 'companies'::text, 'deals'::text]) r(resource),
    unnest(ARRAY['view'::text, 'create'::text, 'update'::text, 'delete'::text, 'import'::text, 'export'::text]) a(action)
  WHERE crm.scopes_cover(ARRAY[s.scope], r.resource, a.action)
  ORDER BY s."position", r.resource, a.action;
comment on view crm.scope_actions is
  'Every resource:action each record scope allows (crm.scopes_cover); a token may do the intersection of these with '
  'its role''s grants.';

create view crm.token_access as
 WITH live AS (
         SELECT t.id,
            t.kind,
            t.name,
            t.scopes,
            t.user_id,
            t.workspace_id AS bound_workspace_id,
            t.oauth_app_id,
            u.email
           FROM crm.tokens t
             JOIN crm.users u ON u.id = t.user_id
          WHERE t.scopes IS NOT NULL AND t.revoked_at IS NULL AND t.expires_at > now() AND u.suspended_at IS NULL AND u.api_access
        ), membership AS (
         SELECT l.id,
            l.kind,
            l.name,
            l.scopes,
            l.user_id,
            l.bound_workspace_id,
            l.oauth_app_id,
            l.email,
            w.slug,
            m.workspace_id,
            m.role_id,
            r.is_admin,
            a.name AS app
           FROM live l
             JOIN crm.memberships m ON m.user_id = l.user_id AND (l.bound_workspace_id IS NULL OR m.workspace_id = l.bound_workspace_id)
             JOIN crm.workspaces w ON w.id = m.workspace_id
             JOIN crm.roles r ON r.workspace_id = m.workspace_id AND r.id = m.role_id
             LEFT JOIN crm.oauth_apps a ON a.workspace_id = l.bound_workspace_id AND a.id = l.oauth_app_id
          WHERE m.suspended_at IS NULL
        )
 SELECT b.slug AS workspace,
    b.email,
    b.id AS token_id,
    b.kind,
    b.name AS token_name,
    b.app,
    b.scopes,
    g.resource,
    g.action,
    g.scope
   FROM membership b
     JOIN crm.role_grants g ON g.workspace_id = b.workspace_id AND g.role_id = b.role_id
  WHERE crm.scopes_cover(b.scopes, g.resource, g.action)
UNION ALL
 SELECT b.slug AS workspace,
    b.email,
    b.id AS token_id,
    b.kind,
    b.name AS token_name,
    b.app,
    b.scopes,
    split_part(s.scope, ':'::text, 1) AS resource,
    split_part(s.scope, ':'::text, 2) AS action,
    'all'::text AS scope
   FROM membership b
     CROSS JOIN unnest(ARRAY['webhooks:manage'::text, 'workspace:admin'::text]) s(scope)
  WHERE b.is_admin AND (s.scope = ANY (b.scopes));
comment on view crm.token_access is
  'Effective access of every live scoped token (unscoped tokens have their member''s crm.member_access): workspace, '
  'email, token, kind, name, OAuth app, its scopes, then resource, action, scope (own, team, all) for each role grant '
  'the scopes keep, and webhooks:manage / workspace:admin as resource:action with scope all when the role is an admin '
  'role.';

comment on table crm.workspaces is 'A tenant. Every tenant table carries workspace_id first in its keys.';
comment on column crm.workspaces.trial_ends_at is 'Webhooks work on pro, or while now() < trial_ends_at.';
comment on column crm.workspaces.seat_limit is
  'Active (not suspended) members may not exceed this; null means unlimited.';
create policy workspaces_all_owner on crm.workspaces as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy workspaces_all_owner on crm.workspaces is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy workspaces_select_member on crm.workspaces as permissive for select to crm_api
  using ((id = ANY (( SELECT crm.my_workspace_ids() AS my_workspace_ids)::uuid[])));
comment on policy workspaces_select_member on crm.workspaces is 'A user sees the workspaces they belong to.';
grant select on crm.workspaces to crm_api;
CREATE TRIGGER tg_workspaces__create_builtin_roles AFTER INSERT ON crm.workspaces
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_workspaces__create_builtin_roles();
CREATE TRIGGER tg_workspaces__delete_records BEFORE DELETE ON crm.workspaces
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_workspaces__delete_records();
CREATE TRIGGER tg_workspaces__seed_deal_stages AFTER INSERT ON crm.workspaces
  REFERENCING NEW TABLE AS new_workspaces
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_workspaces__seed_deal_stages();

comment on table crm.users is 'People who sign in. Email is stored lower-case, so the unique key is case-insensitive.';
comment on column crm.users.password_hash is
  'scrypt (N=32768, r=8, p=1, 16-byte salt), encoded as scrypt$N$r$p$salt$hash (base64url).';
comment on column crm.users.api_access is
  'Platform operator switch: when false, the user''s API tokens stop working at once.';
comment on column crm.users.suspended_at is
  'Platform-wide suspension: every token and session of the user stops at once.';
create policy users_all_owner on crm.users as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy users_all_owner on crm.users is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy users_select_self_or_colleague on crm.users as permissive for select to crm_api
  using (
    ((id = ( SELECT crm.current_user_id() AS current_user_id))
     OR (id = ANY (( SELECT crm.colleague_ids() AS colleague_ids)::uuid[])))
  );
comment on policy users_select_self_or_colleague on crm.users is
  'A user sees themself and the members of the current workspace.';
create policy users_update_self on crm.users as permissive for update to crm_api
  using ((id = ( SELECT crm.current_user_id() AS current_user_id)))
  with check ((id = ( SELECT crm.current_user_id() AS current_user_id)));
comment on policy users_update_self on crm.users is
  'A user changes only their own name (a password is set by the owner''s functions).';
grant select (id, email, name, api_access, suspended_at, created_at) on crm.users to crm_api;
grant update (name) on crm.users to crm_api;
CREATE TRIGGER tg_users__only_narrow_when_scoped BEFORE UPDATE OF password_hash ON crm.users
  FOR EACH ROW
  WHEN ((old.password_hash IS DISTINCT FROM new.password_hash))
  EXECUTE FUNCTION crm.tg_users__only_narrow_when_scoped();

comment on sequence crm.access_versions is 'The values of memberships.access_version.';

comment on table crm.memberships is 'A user''s place in a workspace: one role, an optional suspension.';
comment on column crm.memberships.access_version is
  'A new value from crm.access_versions in the transaction that changes what the membership grants (its role or '
  'suspension, the role''s admin flag or grants) or creates it; a cached identity is refused once it moved '
  '(crm.resume_identity). Never set by hand: any write to it draws the next value.';
create policy memberships_all_owner on crm.memberships as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy memberships_all_owner on crm.memberships is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy memberships_select_own_or_workspace on crm.memberships as permissive for select to crm_api
  using (
    (((user_id = ( SELECT crm.current_user_id() AS current_user_id))
      AND ((( SELECT crm.current_oauth_app_id() AS current_oauth_app_id) IS NULL)
           OR (workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))))
     OR ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
         AND crm.scopes_include(( SELECT crm.current_scopes() AS current_scopes), 'workspace:admin'::text)))
  );
comment on policy memberships_select_own_or_workspace on crm.memberships is
  'A user sees their own memberships (an OAuth app''s access token: in its workspace only) and the members of the '
  'current workspace (a scoped token only with workspace:admin).';
create policy memberships_write_admin on crm.memberships as permissive for all to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  );
comment on policy memberships_write_admin on crm.memberships is
  'Admins add, change, suspend and remove members of their workspace (a scoped token needs workspace:admin).';
grant select, insert, delete on crm.memberships to crm_api;
grant update (role_id, suspended_at) on crm.memberships to crm_api;
CREATE TRIGGER tg_memberships__check_seats BEFORE INSERT OR UPDATE OF suspended_at ON crm.memberships
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_memberships__check_seats();
CREATE TRIGGER tg_memberships__keep_an_admin AFTER DELETE OR UPDATE OF role_id, suspended_at ON crm.memberships
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_memberships__keep_an_admin();
CREATE TRIGGER tg_memberships__next_access_version_insert BEFORE INSERT ON crm.memberships
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_memberships__next_access_version();
CREATE TRIGGER tg_memberships__next_access_version_update BEFORE UPDATE OF role_id, suspended_at, access_version ON crm.memberships
  FOR EACH ROW
  WHEN ((((old.role_id IS DISTINCT FROM new.role_id) OR (old.suspended_at IS DISTINCT FROM new.suspended_at))
         OR (old.access_version IS DISTINCT FROM new.access_version)))
  EXECUTE FUNCTION crm.tg_memberships__next_access_version();
CREATE TRIGGER tg_memberships__only_narrow_when_scoped BEFORE INSERT OR UPDATE OF role_id, suspended_at ON crm.memberships
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_memberships__only_narrow_when_scoped();

comment on table crm.roles is
  'Per-workspace roles. Built-in: admin, member, read_only (created by a trigger on crm.workspaces).';
create policy roles_all_owner on crm.roles as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy roles_all_owner on crm.roles is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy roles_select_workspace on crm.roles as permissive for select to crm_api
  using ((workspace_id = ANY (( SELECT crm.my_workspace_ids() AS my_workspace_ids)::uuid[])));
comment on policy roles_select_workspace on crm.roles is
  'Members see the roles of their workspaces (the workspace list shows their role in each).';
create policy roles_write_admin on crm.roles as permissive for all to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  );
comment on policy roles_write_admin on crm.roles is
  'Admins manage custom roles (a scoped token needs workspace:admin).';
grant select, insert, delete on crm.roles to crm_api;
grant update (name, is_admin) on crm.roles to crm_api;
CREATE TRIGGER tg_roles__bump_access_versions AFTER UPDATE ON crm.roles
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_roles__bump_access_versions();
CREATE TRIGGER tg_roles__keep_an_admin AFTER UPDATE OF is_admin ON crm.roles
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_roles__keep_an_admin();
CREATE TRIGGER tg_roles__only_narrow_when_scoped BEFORE INSERT OR UPDATE OF is_admin ON crm.roles
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_roles__only_narrow_when_scoped();
CREATE TRIGGER tg_roles__protect_builtin BEFORE DELETE OR UPDATE ON crm.roles
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_roles__protect_builtin();
CREATE TRIGGER tg_roles__refuse_delete_in_use BEFORE DELETE ON crm.roles
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_roles__refuse_delete_in_use();

comment on table crm.role_grants is 'resource:action:scope grants of a role; one scope per resource and action.';
create policy role_grants_all_owner on crm.role_grants as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy role_grants_all_owner on crm.role_grants is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy role_grants_select_workspace on crm.role_grants as permissive for select to crm_api
  using ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id)));
comment on policy role_grants_select_workspace on crm.role_grants is
  'Members see the grants of the current workspace''s roles.';
create policy role_grants_write_admin on crm.role_grants as permissive for all to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  );
comment on policy role_grants_write_admin on crm.role_grants is
  'Admins change the grants of custom roles (a scoped token needs workspace:admin).';
grant select, insert, update, delete on crm.role_grants to crm_api;
CREATE TRIGGER tg_role_grants__bump_access_versions_delete AFTER DELETE ON crm.role_grants
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_role_grants__bump_access_versions();
CREATE TRIGGER tg_role_grants__bump_access_versions_insert AFTER INSERT ON crm.role_grants
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_role_grants__bump_access_versions();
CREATE TRIGGER tg_role_grants__bump_access_versions_update AFTER UPDATE ON crm.role_grants
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT
  EXECUTE FUNCTION crm.tg_role_grants__bump_access_versions();
CREATE TRIGGER tg_role_grants__only_narrow_when_scoped BEFORE INSERT OR UPDATE ON crm.role_grants
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_role_grants__only_narrow_when_scoped();
CREATE TRIGGER tg_role_grants__protect_builtin BEFORE INSERT OR DELETE OR UPDATE ON crm.role_grants
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_role_grants__protect_builtin();

comment on table crm.teams is
  'Groups of members; the team scope covers records owned by anyone sharing a team with the user.';
create policy teams_all_owner on crm.teams as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy teams_all_owner on crm.teams is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy teams_select_workspace on crm.teams as permissive for select to crm_api
  using ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id)));
comment on policy teams_select_workspace on crm.teams is 'Members see the teams of the current workspace.';
create policy teams_write_admin on crm.teams as permissive for all to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  );
comment on policy teams_write_admin on crm.teams is 'Admins manage teams (a scoped token needs workspace:admin).';
grant select, insert, update, delete on crm.teams to crm_api;

comment on table crm.team_members is 'Which members belong to which teams.';
create policy team_members_all_owner on crm.team_members as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy team_members_all_owner on crm.team_members is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy team_members_select_workspace on crm.team_members as permissive for select to crm_api
  using ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id)));
comment on policy team_members_select_workspace on crm.team_members is 'Members see who is in which team.';
create policy team_members_write_admin on crm.team_members as permissive for all to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  );
comment on policy team_members_write_admin on crm.team_members is
  'Admins change team membership (a scoped token needs workspace:admin).';
grant select, insert, update, delete on crm.team_members to crm_api;
CREATE TRIGGER tg_team_members__only_narrow_when_scoped BEFORE INSERT OR UPDATE ON crm.team_members
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_team_members__only_narrow_when_scoped();

comment on table crm.invitations is
  'Invitations to join a workspace: a single-use secret (SHA-256 stored), valid 7 days, with the role and teams the '
  'member gets.';
comment on column crm.invitations.token_hash is
  'SHA-256 of the secret in accept_url; the secret itself is shown once, to the inviting admin (and mailed when '
  'SMTP_URL is set).';
create policy invitations_all_admin on crm.invitations as permissive for all to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  );
comment on policy invitations_all_admin on crm.invitations is
  'Only admins see, create and withdraw the invitations of their workspace (a scoped token needs workspace:admin).';
create policy invitations_all_owner on crm.invitations as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy invitations_all_owner on crm.invitations is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
grant delete on crm.invitations to crm_api;
grant select (workspace_id, id, email, role_id, invited_by, created_at, expires_at, accepted_at, accepted_by)
  on crm.invitations
  to crm_api;
grant insert (workspace_id, email, role_id, token_hash, invited_by, expires_at) on crm.invitations to crm_api;
CREATE TRIGGER tg_invitations__only_narrow_when_scoped BEFORE INSERT ON crm.invitations
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_invitations__only_narrow_when_scoped();

comment on table crm.invitation_teams is
  'Teams an invited member joins on acceptance (a team deleted meanwhile is simply dropped).';
create policy invitation_teams_all_admin on crm.invitation_teams as permissive for all to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  );
comment on policy invitation_teams_all_admin on crm.invitation_teams is
  'Follows crm.invitations: admins only (a scoped token needs workspace:admin).';
create policy invitation_teams_all_owner on crm.invitation_teams as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy invitation_teams_all_owner on crm.invitation_teams is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
grant select, insert, delete on crm.invitation_teams to crm_api;
CREATE TRIGGER tg_invitation_teams__only_narrow_when_scoped BEFORE INSERT ON crm.invitation_teams
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_invitations__only_narrow_when_scoped();

comment on table crm.tokens is
  'Bearer tokens (kind token) and UI sessions (kind session); only a SHA-256 of the secret is stored.';
comment on column crm.tokens.scopes is
  'The scopes the token is limited to (crm.known_scopes()), distinct and non-empty; null for a token that acts with '
  'its user''s whole role.';
comment on column crm.tokens.workspace_id is
  'The only workspace the token works in (OAuth access tokens); null for personal tokens and sessions, which follow '
  'X-Tenant-Slug.';
comment on column crm.tokens.oauth_app_id is
  'The OAuth app an access token was issued to (an app belongs to the workspace the token is bound to).';
comment on column crm.tokens.oauth_grant_id is
  'The grant an OAuth access token was issued under; revoking either revokes the other.';
comment on column crm.tokens.context is
  'The request context crm.authenticate last wrote for this token, before any keyed proof; null when it names a team '
  '(a team changes without moving access_version). Read by crm.resume_identity when context_key matches. Owner only.';
comment on column crm.tokens.context_key is
  'What crm.tokens.context holds for: crm.context_cache_key(workspace, access_version, via). Owner only.';
comment on column crm.tokens.authenticated_at is
  'When the holder last proved who they are: the sign-in that issued it, or the calling token''s own for a token made '
  'in a request (-infinity for tokens issued before the column existed). Turning two-factor on and tokens past a day '
  'need it within 10 minutes.';
comment on constraint tokens_kind_known on crm.tokens is
  'token: a personal API token; session: a UI session (works only through the UI); oauth: an access token issued to a '
  'third-party app.';
comment on constraint tokens_oauth_bound on crm.tokens is
  'An OAuth access token is bound to one workspace and one app; personal tokens and sessions are not.';
comment on constraint tokens_oauth_grant_bound on crm.tokens is
  'An OAuth access token belongs to a grant; personal tokens and sessions do not.';
create policy tokens_all_owner on crm.tokens as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy tokens_all_owner on crm.tokens is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy tokens_insert_own on crm.tokens as permissive for insert to crm_api
  with check (
    ((user_id = ( SELECT crm.current_user_id() AS current_user_id))
     AND (kind = 'token'::text)
     AND (( SELECT crm.current_oauth_app_id() AS current_oauth_app_id) IS NULL)
     AND (( SELECT crm.current_scopes() AS current_scopes) IS NULL))
  );
comment on policy tokens_insert_own on crm.tokens is
  'A signed-in user creates API tokens for themself with an unscoped token or a session; a scoped token or an OAuth '
  'access token creates none (it would outlive or outgrow its own limits).';
create policy tokens_select_own on crm.tokens as permissive for select to crm_api
  using (
    ((user_id = ( SELECT crm.current_user_id() AS current_user_id))
     AND ((( SELECT crm.current_oauth_app_id() AS current_oauth_app_id) IS NULL)
          OR (oauth_app_id = ( SELECT crm.current_oauth_app_id() AS current_oauth_app_id))))
  );
comment on policy tokens_select_own on crm.tokens is
  'A user sees their own tokens and sessions; an OAuth app''s access token only the tokens of its own app.';
create policy tokens_update_own on crm.tokens as permissive for update to crm_api
  using (
    ((user_id = ( SELECT crm.current_user_id() AS current_user_id))
     AND (((( SELECT crm.current_oauth_app_id() AS current_oauth_app_id) IS NULL)
           AND (( SELECT crm.current_scopes() AS current_scopes) IS NULL))
          OR ((( SELECT crm.current_oauth_app_id() AS current_oauth_app_id) IS NULL)
              AND (id = ( SELECT crm.current_token_id() AS current_token_id)))
          OR ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
              AND (oauth_grant_id = ( SELECT crm.current_oauth_grant_id() AS current_oauth_grant_id)))))
  )
  with check (
    ((user_id = ( SELECT crm.current_user_id() AS current_user_id))
     AND (((( SELECT crm.current_oauth_app_id() AS current_oauth_app_id) IS NULL)
           AND (( SELECT crm.current_scopes() AS current_scopes) IS NULL))
          OR ((( SELECT crm.current_oauth_app_id() AS current_oauth_app_id) IS NULL)
              AND (id = ( SELECT crm.current_token_id() AS current_token_id)))
          OR ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
              AND (oauth_grant_id = ( SELECT crm.current_oauth_grant_id() AS current_oauth_grant_id)))))
  );
comment on policy tokens_update_own on crm.tokens is
  'A user revokes their own tokens and sessions with an unscoped token or a session; a scoped token only itself; an '
  'OAuth app''s access token only the tokens of its own authorization (crm.current_token_id, '
  'crm.current_oauth_grant_id).';
grant select (id, user_id, kind, name, created_at, expires_at, revoked_at, last_used_at, scopes, workspace_id, oauth_app_id, oauth_grant_id, authenticated_at)
  on crm.tokens
  to crm_api;
grant insert (user_id, kind, name, token_hash, expires_at, scopes) on crm.tokens to crm_api;
grant update (revoked_at) on crm.tokens to crm_api;
CREATE TRIGGER tg_tokens__authenticated_at BEFORE INSERT ON crm.tokens
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_tokens__authenticated_at();
CREATE TRIGGER tg_tokens__revocation_is_final BEFORE UPDATE OF revoked_at ON crm.tokens
  FOR EACH ROW
  WHEN (((old.revoked_at IS NOT NULL) AND (new.revoked_at IS NULL)))
  EXECUTE FUNCTION crm.tg__revocation_is_final();
CREATE TRIGGER tg_tokens__revoke_oauth_grant AFTER UPDATE OF revoked_at ON crm.tokens
  FOR EACH ROW
  WHEN (((old.revoked_at IS NULL) AND (new.revoked_at IS NOT NULL) AND (new.oauth_grant_id IS NOT NULL)))
  EXECUTE FUNCTION crm.tg_tokens__revoke_oauth_grant();

comment on table crm.rate_limit_counters is 'Requests per user per clock-aligned minute, shared by every API process.';
comment on column crm.rate_limit_counters.backend_pid is
  'Whose count the row holds: a positive PostgreSQL backend pid (crm.authenticate and crm.count_request count a '
  'request in the backend that ran it), or a negative API process counter id (crm.settle_request_counts: each process '
  'picks a random negative integer at start, so it never meets a backend pid; two processes drawing the same one '
  'would only share a row, and the totals stay right).';
create policy rate_limit_counters_all_owner on crm.rate_limit_counters as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy rate_limit_counters_all_owner on crm.rate_limit_counters is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';

comment on table crm.internal_secrets is
  'Keys used only inside SECURITY DEFINER functions; crm_api has no grant and no policy here.';
create policy internal_secrets_all_owner on crm.internal_secrets as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy internal_secrets_all_owner on crm.internal_secrets is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
