-- A scoped credential only narrows. A token with scopes (every OAuth app's token among them) may use
-- workspace:admin to read members, roles, teams, invitations and apps, and to take access away
-- (suspend or remove a member, demote them to a role within their current one, remove or narrow a
-- role's grants, take a member out of a team, withdraw an invitation, revoke or delete an app). A
-- write that could widen anyone's access or mint a credential outliving the token is refused here,
-- whatever route or function makes it, with CR403 forbidden: inviting anyone (the accepted
-- invitation is a new user's unscoped credential), adding a member, unsuspending one, giving a
-- member a role that is admin or grants more than their current one, adding or widening a role's
-- grants, making a role admin, adding a member to a team, registering an OAuth app or changing its
-- redirect URIs, client type or secret, creating or widening an OAuth grant, setting a password.
-- An unscoped personal token, a UI session and code without a request context (sign-up, accepting
-- an invitation, the CLI, migrations) are not affected.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- PL/pgSQL, not an inlined helper: only the triggers below call it, on rare administrative writes.
create function crm.credential_is_scoped() returns boolean
language plpgsql stable
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  -- Without a context the scopes read as the empty list: only a request's context is a scoped credential.
  return crm.current_user_id() is not null and crm.current_scopes() is not null;
end
$$;
comment on function crm.credential_is_scoped() is
  'Whether the request context is a scoped token''s (every OAuth app''s token is): false for an unscoped token, a session and code without a context.';
revoke execute on function crm.credential_is_scoped() from public;
grant execute on function crm.credential_is_scoped() to crm_api;

create function crm.refuse_widening(p_what text) returns void
language plpgsql stable
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  if crm.credential_is_scoped() then
    raise exception '% needs an unscoped session or personal token: a scoped token or an app''s token may only narrow access', p_what
      using errcode = 'CR403', hint = 'forbidden';
  end if;
end
$$;
comment on function crm.refuse_widening(text) is
  'Raises CR403 forbidden, naming what was tried, when the request context is a scoped token''s (crm.credential_is_scoped); the triggers that keep a scoped credential from widening anyone''s access call it.';
revoke execute on function crm.refuse_widening(text) from public;
grant execute on function crm.refuse_widening(text) to crm_api;

create function crm.tg_memberships__only_narrow_when_scoped() returns trigger
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
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
$$;
comment on function crm.tg_memberships__only_narrow_when_scoped() is
  'A scoped credential adds no member, unsuspends none, and changes a role only to a non-admin one whose grants are within the current role''s (same resource and action, a scope no wider: own < team < all).';
revoke execute on function crm.tg_memberships__only_narrow_when_scoped() from public;
create trigger tg_memberships__only_narrow_when_scoped before insert or update of role_id, suspended_at on crm.memberships
  for each row execute function crm.tg_memberships__only_narrow_when_scoped();

create function crm.tg_roles__only_narrow_when_scoped() returns trigger
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  if new.is_admin and (tg_op = 'INSERT' or not old.is_admin) then
    perform crm.refuse_widening('Making a role admin');
  end if;
  return new;
end
$$;
comment on function crm.tg_roles__only_narrow_when_scoped() is
  'A scoped credential creates no admin role and makes no role admin (a role without grants, not admin, widens nobody).';
revoke execute on function crm.tg_roles__only_narrow_when_scoped() from public;
create trigger tg_roles__only_narrow_when_scoped before insert or update of is_admin on crm.roles
  for each row execute function crm.tg_roles__only_narrow_when_scoped();

create function crm.tg_role_grants__only_narrow_when_scoped() returns trigger
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  if tg_op = 'INSERT' then
    perform crm.refuse_widening('Adding a grant to a role');
  elsif (new.workspace_id, new.role_id, new.resource, new.action) is distinct from (old.workspace_id, old.role_id, old.resource, old.action)
        or array_position(array['own', 'team', 'all'], new.scope) > array_position(array['own', 'team', 'all'], old.scope) then
    perform crm.refuse_widening('Widening a role''s grant');
  end if;
  return new;
end
$$;
comment on function crm.tg_role_grants__only_narrow_when_scoped() is
  'A scoped credential adds no grant to a role and widens none (it may remove a grant or narrow its scope: all > team > own).';
revoke execute on function crm.tg_role_grants__only_narrow_when_scoped() from public;
create trigger tg_role_grants__only_narrow_when_scoped before insert or update on crm.role_grants
  for each row execute function crm.tg_role_grants__only_narrow_when_scoped();

create function crm.tg_team_members__only_narrow_when_scoped() returns trigger
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  perform crm.refuse_widening('Adding a member to a team');
  return new;
end
$$;
comment on function crm.tg_team_members__only_narrow_when_scoped() is
  'A scoped credential puts nobody into a team (the team scope would show them their teammates'' records, and their records to the team).';
revoke execute on function crm.tg_team_members__only_narrow_when_scoped() from public;
create trigger tg_team_members__only_narrow_when_scoped before insert or update on crm.team_members
  for each row execute function crm.tg_team_members__only_narrow_when_scoped();

create function crm.tg_invitations__only_narrow_when_scoped() returns trigger
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  perform crm.refuse_widening('Inviting a member');
  return new;
end
$$;
comment on function crm.tg_invitations__only_narrow_when_scoped() is
  'A scoped credential invites nobody, with any role or team: the accepted invitation is a new user''s unscoped credential, which would outlive the token.';
revoke execute on function crm.tg_invitations__only_narrow_when_scoped() from public;
create trigger tg_invitations__only_narrow_when_scoped before insert on crm.invitations
  for each row execute function crm.tg_invitations__only_narrow_when_scoped();
create trigger tg_invitation_teams__only_narrow_when_scoped before insert on crm.invitation_teams
  for each row execute function crm.tg_invitations__only_narrow_when_scoped();

create function crm.tg_oauth_apps__only_narrow_when_scoped() returns trigger
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  if tg_op = 'INSERT' then
    perform crm.refuse_widening('Registering an OAuth app');
  elsif (new.workspace_id, new.client_id, new.redirect_uris, new.confidential, new.client_secret_hash)
        is distinct from (old.workspace_id, old.client_id, old.redirect_uris, old.confidential, old.client_secret_hash) then
    perform crm.refuse_widening('Changing an OAuth app''s redirect URIs, client type or secret');
  end if;
  return new;
end
$$;
comment on function crm.tg_oauth_apps__only_narrow_when_scoped() is
  'A scoped credential registers no app and changes no app''s redirect URIs, client type or secret (they decide who receives the authorization codes); renaming or deleting an app is allowed.';
revoke execute on function crm.tg_oauth_apps__only_narrow_when_scoped() from public;
create trigger tg_oauth_apps__only_narrow_when_scoped before insert or update on crm.oauth_apps
  for each row execute function crm.tg_oauth_apps__only_narrow_when_scoped();

create function crm.tg_oauth_grants__only_narrow_when_scoped() returns trigger
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  if tg_op = 'INSERT' then
    perform crm.refuse_widening('Authorizing an app');
  elsif not (new.scopes <@ old.scopes) or new.expires_at > old.expires_at
        or (new.workspace_id, new.app_id, new.user_id) is distinct from (old.workspace_id, old.app_id, old.user_id) then
    perform crm.refuse_widening('Widening an app''s authorization');
  end if;
  return new;
end
$$;
comment on function crm.tg_oauth_grants__only_narrow_when_scoped() is
  'A scoped credential creates no OAuth grant and widens none (more scopes, a later expiry, another app or user); revoking one is allowed.';
revoke execute on function crm.tg_oauth_grants__only_narrow_when_scoped() from public;
create trigger tg_oauth_grants__only_narrow_when_scoped before insert or update of workspace_id, app_id, user_id, scopes, expires_at
  on crm.oauth_grants for each row execute function crm.tg_oauth_grants__only_narrow_when_scoped();

create function crm.tg_users__only_narrow_when_scoped() returns trigger
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  perform crm.refuse_widening('Setting a password');
  return new;
end
$$;
comment on function crm.tg_users__only_narrow_when_scoped() is
  'A scoped credential sets no password: a password signs in to the user''s whole authority.';
revoke execute on function crm.tg_users__only_narrow_when_scoped() from public;
create trigger tg_users__only_narrow_when_scoped before update of password_hash on crm.users
  for each row when (old.password_hash is distinct from new.password_hash)
  execute function crm.tg_users__only_narrow_when_scoped();
