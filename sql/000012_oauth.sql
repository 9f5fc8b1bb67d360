-- The OAuth 2.0 authorization server (API.md section 4a; RFC 6749, RFC 7636, RFC 7009, RFC 9700):
-- apps confidential or public, grants (one per consent: a user, a workspace, an app, scopes),
-- single-use authorization codes and rotating refresh tokens, both stored as SHA-256 only.
-- Access tokens are rows of crm.tokens (kind oauth) bound to their grant, so crm.authenticate
-- treats them like any other token.
--
-- Who runs what (sql/CONVENTIONS.md): the consent (a signed-in user) issues a code through
-- crm.oauth_issue_code, inside the user's crm_api transaction; the authorization endpoint's first
-- check (crm.oauth_client_redirect_ok) and the token and revocation endpoints run before any user
-- is known, as crm_runtime itself, and reach codes, refresh tokens and client secrets only through
-- the narrow SECURITY DEFINER functions below (crm.oauth_exchange_code, crm.oauth_refresh,
-- crm.oauth_revoke), which authenticate the client themselves; those are granted to crm_runtime
-- only, so SQL inside a request transaction cannot call them. Codes and refresh tokens have no
-- grant and no policy for crm_api at all; the owner reaches every table through its
-- <table>_all_owner policy (FORCE ROW LEVEL SECURITY). Housekeeping (crm.prune_oauth) runs inside
-- crm.housekeeping, the worker's.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- ---------------------------------------------------------------------------------------------
-- Redirect URIs (RFC 9700 section 2.1, RFC 8252 sections 7.3 and 8.3): absolute https URLs, or
-- plain http on a loopback IP literal (127.0.0.1, [::1]) for native apps, whose port may differ at
-- each authorization. "localhost" is refused: a name can resolve elsewhere, the literal cannot.
-- No fragment, no user information, no white space.
create or replace function crm.oauth_redirect_uris_are_valid(uris text[]) returns boolean
language sql immutable parallel safe
as $$
  select coalesce(bool_and(length(u) <= 2000 and position('#' in u) = 0
                           and (u ~ '^https://[^/?#@\s]+(/[^\s]*)?$' or u ~ '^http://(127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?(/[^\s]*)?$')), false)
    from unnest(uris) u
$$;
comment on function crm.oauth_redirect_uris_are_valid(text[]) is
  'CHECK for redirect URIs: https, or http on 127.0.0.1 or [::1] (loopback, any port at authorization); no fragment, no spaces.';

-- Apps registered with http://localhost before this rule were never usable (there was no
-- authorization endpoint): they point at the loopback literal instead, so the rule holds for every row.
update crm.oauth_apps
   set redirect_uris = array(select regexp_replace(u, '^http://localhost(:[0-9]{1,5})?', 'http://127.0.0.1\1') from unnest(redirect_uris) u)
 where exists (select from unnest(redirect_uris) u where u ~ '^http://localhost');
alter table crm.oauth_apps drop constraint oauth_apps_redirect_uris_valid;
-- crm.oauth_apps holds a few rows per workspace: validating them while the constraint is added
-- takes milliseconds.
-- squawk-ignore constraint-missing-not-valid
alter table crm.oauth_apps add constraint oauth_apps_redirect_uris_valid check (
  cardinality(redirect_uris) between 1 and 10 and crm.oauth_redirect_uris_are_valid(redirect_uris));

-- RFC 6749 section 3.1.2 asks for exact matching; RFC 8252 section 7.3 lets a native app's loopback
-- redirect carry any port, so for http://127.0.0.1 and http://[::1] the port is left out of the
-- comparison and everything else (scheme, host, path, query) must be equal.
create function crm.oauth_redirect_uri_matches(p_registered text[], p_given text) returns boolean
language sql immutable parallel safe
as $$
  select p_given = any (p_registered)
      or (length(p_given) <= 2000
          and p_given ~ '^http://(127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?(/[^\s#]*)?$'
          and regexp_replace(p_given, '^(http://(127\.0\.0\.1|\[::1\]))(:[0-9]{1,5})?', '\1') = any (
                select regexp_replace(r, '^(http://(127\.0\.0\.1|\[::1\]))(:[0-9]{1,5})?', '\1')
                  from unnest(p_registered) r
                 where r ~ '^http://(127\.0\.0\.1|\[::1\])'))
$$;
comment on function crm.oauth_redirect_uri_matches(text[], text) is
  'Whether a redirect_uri is one of the registered ones: exactly, or for a loopback http URI equal but for the port.';
revoke execute on function crm.oauth_redirect_uri_matches(text[], text) from public;
grant execute on function crm.oauth_redirect_uri_matches(text[], text) to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Confidential and public apps. A confidential app (a server) authenticates at the token
-- endpoint with its secret; a public app (a native or browser app) cannot keep one, so it has
-- none, and PKCE is what binds its code to it (required for every app anyway).
alter table crm.oauth_apps add column confidential boolean not null default true;
-- The only readers of these columns are this service's own (the secret's last four characters
-- are shown as null for a public app); the check below keeps them set for every confidential app.
-- squawk-ignore ban-drop-not-null
alter table crm.oauth_apps alter column client_secret_hash drop not null;
-- squawk-ignore ban-drop-not-null
alter table crm.oauth_apps alter column client_secret_last4 drop not null;
-- Every existing app has a secret and is confidential (the default), so the check holds at once.
-- squawk-ignore constraint-missing-not-valid
alter table crm.oauth_apps add constraint oauth_apps_secret_if_confidential check (
  confidential = (client_secret_hash is not null) and confidential = (client_secret_last4 is not null));
comment on column crm.oauth_apps.confidential is
  'true: a server-side app that authenticates with its client secret; false: a public (native or browser) app without a secret.';
comment on constraint oauth_apps_secret_if_confidential on crm.oauth_apps is 'A confidential app has a secret; a public app has none.';

grant select (confidential) on crm.oauth_apps to crm_api;
grant insert (confidential) on crm.oauth_apps to crm_api;
grant update (name, redirect_uris) on crm.oauth_apps to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Grants: one per consent. The member who allowed, the app, the workspace, the scopes; the
-- code, the refresh tokens and the access tokens issued under it hang off it, and revoking it
-- revokes them all.
create table crm.oauth_grants (
  workspace_id uuid not null,
  id uuid not null default crm.uuid_v7(),
  app_id uuid not null,
  user_id uuid not null,
  scopes text[] not null constraint oauth_grants_scopes_known check (crm.scopes_are_valid(scopes)),
  created_at timestamptz not null default now(),
  last_issued_at timestamptz not null default now(),
  expires_at timestamptz not null,
  revoked_at timestamptz,
  primary key (workspace_id, id),
  foreign key (workspace_id, app_id) references crm.oauth_apps (workspace_id, id) on delete cascade,
  -- A member removed from the workspace takes their grants (and so their app tokens) with them.
  foreign key (workspace_id, user_id) references crm.memberships (workspace_id, user_id) on delete cascade
);
alter table crm.oauth_grants enable row level security;
alter table crm.oauth_grants force row level security;
-- Serves the app's connected users (the admin's page) and revoking an app for the workspace.
create index oauth_grants_app_idx on crm.oauth_grants (workspace_id, app_id);
-- Serves a user's connected apps (GET /api/tokens) and the select policy's own-grants branch.
create index oauth_grants_user_idx on crm.oauth_grants (user_id);
comment on table crm.oauth_grants is
  'One consent: a member allowed an app these scopes in this workspace. Its code, refresh tokens and access tokens are issued under it; revoking it revokes them all.';
comment on column crm.oauth_grants.scopes is 'The scopes the user allowed; refresh tokens keep them, an access token may carry fewer.';
comment on column crm.oauth_grants.last_issued_at is 'When an access token was last issued under the grant (the code exchange or a refresh).';
comment on column crm.oauth_grants.expires_at is 'When the last token issued under the grant expires (its newest refresh token, else its access token).';

-- An OAuth app's access token (crm.current_oauth_app_id() set) sees and revokes the connections
-- of its own app only, never the user's other apps; a personal token or session sees them all.
create policy oauth_grants_select_own_or_admin on crm.oauth_grants for select to crm_api
  using ((user_id = (select crm.current_user_id())
          and ((select crm.current_oauth_app_id()) is null or app_id = (select crm.current_oauth_app_id())))
         or (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin'))));
comment on policy oauth_grants_select_own_or_admin on crm.oauth_grants is
  'A user sees the apps they connected (in every workspace; an app''s access token only its own app''s); admins see every app connection of the current workspace (a scoped token needs workspace:admin).';
create policy oauth_grants_update_own_or_admin on crm.oauth_grants for update to crm_api
  using ((user_id = (select crm.current_user_id())
          and ((select crm.current_oauth_app_id()) is null or app_id = (select crm.current_oauth_app_id())))
         or (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin'))))
  with check ((user_id = (select crm.current_user_id())
               and ((select crm.current_oauth_app_id()) is null or app_id = (select crm.current_oauth_app_id())))
              or (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin_for('workspace:admin'))));
comment on policy oauth_grants_update_own_or_admin on crm.oauth_grants is
  'A user revokes an app they connected (an app''s access token only its own app''s); an admin revokes any connection in the current workspace (a scoped token needs workspace:admin).';
-- Grants are created by crm.oauth_issue_code only; revoking is the one change a caller makes.
grant select on crm.oauth_grants to crm_api;
grant update (revoked_at) on crm.oauth_grants to crm_api;

-- A user sees the name of an app they connected, also when they are not an admin of its workspace.
create policy oauth_apps_select_connected on crm.oauth_apps for select to crm_api
  using (exists (select from crm.oauth_grants g
                  where g.workspace_id = oauth_apps.workspace_id and g.app_id = oauth_apps.id
                    and g.user_id = (select crm.current_user_id())));
comment on policy oauth_apps_select_connected on crm.oauth_apps is
  'A user sees the apps they connected (their name on the security page), as far as the grants'' own policy shows them.';

-- ---------------------------------------------------------------------------------------------
-- Authorization codes: one per grant, SHA-256 only, single use, at most 60 seconds (RFC 6749
-- section 4.1.2), with the PKCE S256 challenge (RFC 7636) and the redirect URI they were issued for.
create table crm.oauth_codes (
  workspace_id uuid not null,
  grant_id uuid not null,
  code_hash bytea not null constraint oauth_codes_code_hash_length check (length(code_hash) = 32),
  redirect_uri text not null constraint oauth_codes_redirect_uri_length check (length(redirect_uri) <= 2000),
  code_challenge text not null constraint oauth_codes_code_challenge_s256 check (code_challenge ~ '^[A-Za-z0-9_-]{43}$'),
  created_at timestamptz not null default now(),
  expires_at timestamptz not null,
  used_at timestamptz,
  primary key (workspace_id, grant_id),
  constraint oauth_codes_lifetime check (expires_at <= created_at + interval '60 seconds'),
  foreign key (workspace_id, grant_id) references crm.oauth_grants (workspace_id, id) on delete cascade
);
alter table crm.oauth_codes enable row level security;
alter table crm.oauth_codes force row level security;
-- Serves the token endpoint's lookup of a presented code.
create unique index oauth_codes_code_hash_key on crm.oauth_codes (code_hash);
comment on table crm.oauth_codes is
  'Authorization codes (SHA-256 only): single use, 60 seconds at most, bound to a grant, a redirect URI and a PKCE S256 challenge. No policy: only the OAuth functions read them.';
comment on column crm.oauth_codes.used_at is 'Set by the first exchange, successful or not; a second one revokes the grant and every token issued from the code.';
comment on column crm.oauth_codes.code_challenge is 'BASE64URL(SHA256(code_verifier)) as the client sent it (RFC 7636 S256, the only method accepted).';

-- ---------------------------------------------------------------------------------------------
-- Refresh tokens: SHA-256 only, rotated at every use (RFC 9700 section 4.14.2): a used one
-- presented again means it leaked, and the whole grant is revoked.
create table crm.oauth_refresh_tokens (
  workspace_id uuid not null,
  id uuid not null default crm.uuid_v7(),
  grant_id uuid not null,
  token_hash bytea not null constraint oauth_refresh_tokens_token_hash_length check (length(token_hash) = 32),
  created_at timestamptz not null default now(),
  expires_at timestamptz not null,
  used_at timestamptz,
  primary key (workspace_id, id),
  foreign key (workspace_id, grant_id) references crm.oauth_grants (workspace_id, id) on delete cascade
);
alter table crm.oauth_refresh_tokens enable row level security;
alter table crm.oauth_refresh_tokens force row level security;
-- Serves the token endpoint's lookup of a presented refresh token.
create unique index oauth_refresh_tokens_token_hash_key on crm.oauth_refresh_tokens (token_hash);
-- Serves the foreign key's cascade from a grant.
create index oauth_refresh_tokens_grant_idx on crm.oauth_refresh_tokens (workspace_id, grant_id);
comment on table crm.oauth_refresh_tokens is
  'Refresh tokens (SHA-256 only), one family per grant; each works once and is replaced by a new one. No policy: only the OAuth functions read them.';
comment on column crm.oauth_refresh_tokens.used_at is 'Set when the token is exchanged for the next one; presenting it again revokes the grant.';

-- ---------------------------------------------------------------------------------------------
-- Access tokens: rows of crm.tokens (kind oauth) bound to their grant.
alter table crm.tokens add column oauth_grant_id uuid;
-- The column is new and null in every row, so the foreign key has nothing to check; no OAuth
-- access token existed before this migration, so the check holds at once.
-- squawk-ignore adding-foreign-key-constraint, constraint-missing-not-valid
alter table crm.tokens add constraint tokens_oauth_grant_fkey foreign key (workspace_id, oauth_grant_id)
  references crm.oauth_grants (workspace_id, id) on delete cascade;
-- squawk-ignore constraint-missing-not-valid
alter table crm.tokens add constraint tokens_oauth_grant_bound check ((kind = 'oauth') = (oauth_grant_id is not null));
comment on column crm.tokens.oauth_grant_id is 'The grant an OAuth access token was issued under; revoking either revokes the other.';
comment on constraint tokens_oauth_grant_bound on crm.tokens is 'An OAuth access token belongs to a grant; personal tokens and sessions do not.';
-- Serves revoking a grant's access tokens and the foreign key's cascade.
-- squawk-ignore require-concurrent-index-creation
create index tokens_oauth_grant_idx on crm.tokens (workspace_id, oauth_grant_id) where oauth_grant_id is not null;
grant select (oauth_grant_id) on crm.tokens to crm_api;

-- ---------------------------------------------------------------------------------------------
-- What an app's access token sees of its user: the user's personal tokens, sessions and other
-- apps are none of an app's business, nor are the user's other workspaces (the token is bound to
-- one). It sees and revokes the tokens of its own app; GET /api/workspaces lists its workspace only.
drop policy tokens_select_own on crm.tokens;
create policy tokens_select_own on crm.tokens for select to crm_api
  using (user_id = (select crm.current_user_id())
         and ((select crm.current_oauth_app_id()) is null or oauth_app_id = (select crm.current_oauth_app_id())));
comment on policy tokens_select_own on crm.tokens is
  'A user sees their own tokens and sessions; an OAuth app''s access token only the tokens of its own app.';
drop policy tokens_update_own on crm.tokens;
create policy tokens_update_own on crm.tokens for update to crm_api
  using (user_id = (select crm.current_user_id())
         and ((select crm.current_oauth_app_id()) is null or oauth_app_id = (select crm.current_oauth_app_id())))
  with check (user_id = (select crm.current_user_id())
              and ((select crm.current_oauth_app_id()) is null or oauth_app_id = (select crm.current_oauth_app_id())));
comment on policy tokens_update_own on crm.tokens is
  'A user revokes their own tokens and sessions; an OAuth app''s access token only the tokens of its own app.';

drop policy memberships_select_own_or_workspace on crm.memberships;
create policy memberships_select_own_or_workspace on crm.memberships for select to crm_api
  using ((user_id = (select crm.current_user_id())
          and ((select crm.current_oauth_app_id()) is null or workspace_id = (select crm.current_workspace_id())))
         or (workspace_id = (select crm.current_workspace_id()) and crm.scopes_include((select crm.current_scopes()), 'workspace:admin')));
comment on policy memberships_select_own_or_workspace on crm.memberships is
  'A user sees their own memberships (an OAuth app''s access token: in its workspace only) and the members of the current workspace (a scoped token only with workspace:admin).';

-- The workspaces and role names the workspace list reads (policies of crm.workspaces, crm.roles).
create or replace function crm.my_workspace_ids() returns uuid[]
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select array(select m.workspace_id from crm.verified_context() c join crm.memberships m on m.user_id = c.user_id
                where c.oauth_app_id is null or m.workspace_id = c.workspace_id)
$$;
comment on function crm.my_workspace_ids() is
  'Every workspace the current user belongs to (for the workspace list and its role names); for an OAuth app''s access token, its own workspace only.';

-- ---------------------------------------------------------------------------------------------
-- The owner's access (sql/CONVENTIONS.md): every table forces row-level security (above) and names
-- the owner's access in <table>_all_owner. The group role crm_owner and that policy on every
-- table come from 000013_runtime_confinement.sql: on a database migrated from scratch it runs
-- after this file and gives these tables the policy with all the others; on a database that has
-- it already (its policy on crm.tokens exists), the policy is created here.
do $$
declare
  v_table text;
begin
  if exists (select from pg_policy where polrelid = 'crm.tokens'::regclass and polname = 'tokens_all_owner') then
    foreach v_table in array array['oauth_grants', 'oauth_codes', 'oauth_refresh_tokens'] loop
      execute format('create policy %I on crm.%I for all to crm_owner using (true) with check (true)', v_table || '_all_owner', v_table);
      execute format('comment on policy %I on crm.%I is %L', v_table || '_all_owner', v_table,
        'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of requests or jobs is a member of crm_owner.');
    end loop;
  end if;
end
$$;

-- Revoking a grant (its user on the security page, an admin for the workspace, a reused code or
-- refresh token) revokes its access tokens at once. SECURITY DEFINER: an admin revokes other
-- users' tokens, which crm_api cannot update; it follows a revocation the caller was allowed to make.
create function crm.tg_oauth_grants__revoke_tokens() returns trigger
language plpgsql security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  update crm.tokens t set revoked_at = new.revoked_at
   where t.workspace_id = new.workspace_id and t.oauth_grant_id = new.id and t.revoked_at is null;
  return null;
end
$$;
create trigger tg_oauth_grants__revoke_tokens after update of revoked_at on crm.oauth_grants
  for each row when (old.revoked_at is null and new.revoked_at is not null)
  execute function crm.tg_oauth_grants__revoke_tokens();
comment on function crm.tg_oauth_grants__revoke_tokens() is 'A revoked grant revokes its access tokens (its refresh tokens and code check the grant).';

-- Revoking one access token (DELETE /api/tokens/{id}, POST /oauth/revoke) cuts the app off: it
-- revokes the grant, or the app would simply refresh.
create function crm.tg_tokens__revoke_oauth_grant() returns trigger
language plpgsql security definer
set search_path = pg_catalog, crm, pg_temp
as $$
begin
  update crm.oauth_grants g set revoked_at = new.revoked_at
   where g.workspace_id = new.workspace_id and g.id = new.oauth_grant_id and g.revoked_at is null;
  return null;
end
$$;
create trigger tg_tokens__revoke_oauth_grant after update of revoked_at on crm.tokens
  for each row when (old.revoked_at is null and new.revoked_at is not null and new.oauth_grant_id is not null)
  execute function crm.tg_tokens__revoke_oauth_grant();
comment on function crm.tg_tokens__revoke_oauth_grant() is 'A revoked OAuth access token revokes its grant (and with it the refresh tokens and the other access tokens).';

-- ---------------------------------------------------------------------------------------------
-- Lifetimes (API.md section 4a): access tokens one hour; refresh tokens 90 days from their issue
-- (each rotation starts a new 90 days, so an app in use stays connected).
create function crm.oauth_access_token_lifetime() returns interval
language sql immutable parallel safe
as $$ select interval '1 hour' $$;
comment on function crm.oauth_access_token_lifetime() is 'How long an OAuth access token lives (expires_in 3600).';
revoke execute on function crm.oauth_access_token_lifetime() from public;

create function crm.oauth_refresh_token_lifetime() returns interval
language sql immutable parallel safe
as $$ select interval '90 days' $$;
comment on function crm.oauth_refresh_token_lifetime() is 'How long a refresh token lives unused; each use replaces it with a new one.';
revoke execute on function crm.oauth_refresh_token_lifetime() from public;

-- ---------------------------------------------------------------------------------------------
-- The app a client id names, for the consent page (a signed-in user, crm_api): what the user is
-- shown, whether the redirect URI is one of the app's, and whether the current user is an active
-- member of the app's workspace. The client id is public; nothing secret comes back.
create function crm.oauth_authorization_client(p_client_id text, p_redirect_uri text)
returns table (app_id uuid, app_name text, workspace_id uuid, workspace_slug text, workspace_name text,
               redirect_uri_ok boolean, user_may_connect boolean)
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select a.id, a.name, w.id, w.slug, w.name,
         crm.oauth_redirect_uri_matches(a.redirect_uris, p_redirect_uri),
         exists (select from crm.memberships m join crm.users u on u.id = m.user_id
                  where m.workspace_id = a.workspace_id and m.user_id = crm.current_user_id()
                    and m.suspended_at is null and u.suspended_at is null and u.api_access)
    from crm.oauth_apps a
    join crm.workspaces w on w.id = a.workspace_id
   where a.client_id = p_client_id
$$;
comment on function crm.oauth_authorization_client(text, text) is
  'For GET /oauth/authorize: the app of a client id (name, workspace), whether the redirect URI is registered, whether the current user may connect it.';
revoke execute on function crm.oauth_authorization_client(text, text) from public;
grant execute on function crm.oauth_authorization_client(text, text) to crm_api;

-- GET /oauth/authorize before anyone signs in (crm_runtime): whether a client id names an app
-- registered with this redirect URI, which decides between an error page and a redirect to the
-- app. Answers nothing else.
create function crm.oauth_client_redirect_ok(p_client_id text, p_redirect_uri text) returns boolean
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
  select coalesce((select crm.oauth_redirect_uri_matches(a.redirect_uris, p_redirect_uri)
                     from crm.oauth_apps a where a.client_id = p_client_id), false)
$$;
comment on function crm.oauth_client_redirect_ok(text, text) is
  'For GET /oauth/authorize before sign-in (crm_runtime): whether the client id is registered with this redirect URI.';
revoke execute on function crm.oauth_client_redirect_ok(text, text) from public;
grant execute on function crm.oauth_client_redirect_ok(text, text) to crm_runtime;

-- The consent: the signed-in user (the proven context) allows the app these scopes in its
-- workspace. Creates the grant and its code (60 seconds at most: the service may ask for less,
-- which tests do); raises CR4xx for what the page shows as an error.
create function crm.oauth_issue_code(p_client_id text, p_redirect_uri text, p_scopes text[], p_code_challenge text,
                                     p_code_hash bytea, p_code_lifetime_seconds integer)
returns uuid
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_user uuid := crm.current_user_id();
  v_app crm.oauth_apps;
  v_grant uuid;
  v_lifetime interval := make_interval(secs => least(greatest(coalesce(p_code_lifetime_seconds, 60), 1), 60));
begin
  if v_user is null then
    raise exception 'no signed-in user' using errcode = 'CR401', hint = 'token_invalid';
  end if;
  select * into v_app from crm.oauth_apps a where a.client_id = p_client_id;
  if not found or not crm.oauth_redirect_uri_matches(v_app.redirect_uris, p_redirect_uri) then
    raise exception 'unknown client or redirect URI' using errcode = 'CR404', hint = 'not_found';
  end if;
  if p_scopes is null or not crm.scopes_are_valid(p_scopes) then
    raise exception 'unknown or repeated scopes' using errcode = 'CR422', hint = 'validation_failed';
  end if;
  if not exists (select from crm.memberships m join crm.users u on u.id = m.user_id
                  where m.workspace_id = v_app.workspace_id and m.user_id = v_user
                    and m.suspended_at is null and u.suspended_at is null and u.api_access) then
    raise exception 'you are not an active member of the workspace this app belongs to' using errcode = 'CR403', hint = 'forbidden';
  end if;
  insert into crm.oauth_grants (workspace_id, app_id, user_id, scopes, expires_at)
  values (v_app.workspace_id, v_app.id, v_user, p_scopes, now() + v_lifetime)
  returning id into v_grant;
  insert into crm.oauth_codes (workspace_id, grant_id, code_hash, redirect_uri, code_challenge, expires_at)
  values (v_app.workspace_id, v_grant, p_code_hash, p_redirect_uri, p_code_challenge, now() + v_lifetime);
  return v_grant;
end
$$;
comment on function crm.oauth_issue_code(text, text, text[], text, bytea, integer) is
  'The consent of the signed-in user: a grant and its single-use authorization code (hash, redirect URI, PKCE challenge, at most 60 s).';
revoke execute on function crm.oauth_issue_code(text, text, text[], text, bytea, integer) from public;
grant execute on function crm.oauth_issue_code(text, text, text[], text, bytea, integer) to crm_api;

-- Client authentication at the token and revocation endpoints (RFC 6749 section 2.3): a
-- confidential app must present its secret (its SHA-256 here), a public app must present none.
-- Internal: no EXECUTE for crm_api.
create function crm.oauth_client(p_client_id text, p_client_secret_hash bytea) returns crm.oauth_apps
language sql stable
set search_path = pg_catalog, crm, pg_temp
as $$
  select a.* from crm.oauth_apps a
   where a.client_id = p_client_id
     and case when a.confidential then p_client_secret_hash is not null and a.client_secret_hash = p_client_secret_hash
              else p_client_secret_hash is null end
$$;
comment on function crm.oauth_client(text, bytea) is 'The app a client id and secret authenticate (a public app presents no secret), or null. Internal.';
revoke execute on function crm.oauth_client(text, bytea) from public;

-- Whether the grant's user may still act in its workspace (not suspended anywhere, API access on).
create function crm.oauth_grant_user_active(p_workspace_id uuid, p_user_id uuid) returns boolean
language sql stable
set search_path = pg_catalog, crm, pg_temp
as $$
  select exists (select from crm.memberships m join crm.users u on u.id = m.user_id
                  where m.workspace_id = p_workspace_id and m.user_id = p_user_id
                    and m.suspended_at is null and u.suspended_at is null and u.api_access)
$$;
comment on function crm.oauth_grant_user_active(uuid, uuid) is 'Whether a grant''s user is an active member with API access (internal).';
revoke execute on function crm.oauth_grant_user_active(uuid, uuid) from public;

-- Issues an access token (and, with offline_access, a refresh token) under a grant. Internal.
create function crm.oauth_issue_tokens(p_grant crm.oauth_grants, p_app_name text, p_scopes text[],
                                       p_access_token_hash bytea, p_refresh_token_hash bytea)
returns table (scopes text[], access_expires_at timestamptz, refresh_issued boolean)
language plpgsql volatile
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_access_expires timestamptz := now() + crm.oauth_access_token_lifetime();
  v_refresh boolean := 'offline_access' = any (p_grant.scopes) and p_refresh_token_hash is not null;
begin
  insert into crm.tokens (user_id, kind, name, token_hash, expires_at, scopes, workspace_id, oauth_app_id, oauth_grant_id)
  values (p_grant.user_id, 'oauth', left(p_app_name, 200), p_access_token_hash, v_access_expires, p_scopes,
          p_grant.workspace_id, p_grant.app_id, p_grant.id);
  if v_refresh then
    insert into crm.oauth_refresh_tokens (workspace_id, grant_id, token_hash, expires_at)
    values (p_grant.workspace_id, p_grant.id, p_refresh_token_hash, now() + crm.oauth_refresh_token_lifetime());
  end if;
  update crm.oauth_grants g
     set last_issued_at = now(),
         expires_at = case when v_refresh then now() + crm.oauth_refresh_token_lifetime() else greatest(g.expires_at, v_access_expires) end
   where g.workspace_id = p_grant.workspace_id and g.id = p_grant.id;
  return query select p_scopes, v_access_expires, v_refresh;
end
$$;
comment on function crm.oauth_issue_tokens(crm.oauth_grants, text, text[], bytea, bytea) is
  'Stores an access token (kind oauth, 1 hour) and, when the grant holds offline_access, a refresh token (internal).';
revoke execute on function crm.oauth_issue_tokens(crm.oauth_grants, text, text[], bytea, bytea) from public;

-- grant_type=authorization_code (RFC 6749 section 4.1.3, RFC 7636 section 4.6). Answers with an
-- RFC 6749 error code instead of raising, so what it records on a refusal (the code used up, a
-- revoked grant) is committed. The first exchange of a code uses it up whatever its outcome (a
-- wrong verifier cannot be retried); a second one revokes the grant and every token issued from it.
create function crm.oauth_exchange_code(p_client_id text, p_client_secret_hash bytea, p_code_hash bytea, p_redirect_uri text,
                                        p_code_verifier text, p_access_token_hash bytea, p_refresh_token_hash bytea)
returns table (error text, error_description text, scopes text[], access_expires_at timestamptz, refresh_issued boolean)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_app crm.oauth_apps := crm.oauth_client(p_client_id, p_client_secret_hash);
  v_code crm.oauth_codes;
  v_grant crm.oauth_grants;
begin
  if v_app.id is null then
    return query select 'invalid_client', 'unknown client, or wrong client authentication', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  select * into v_code from crm.oauth_codes c where c.code_hash = p_code_hash for update;
  select * into v_grant from crm.oauth_grants g where g.workspace_id = v_code.workspace_id and g.id = v_code.grant_id for update;
  if v_code.grant_id is null or v_grant.app_id <> v_app.id or v_grant.workspace_id <> v_app.workspace_id then
    return query select 'invalid_grant', 'unknown authorization code', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  if v_code.used_at is not null then
    update crm.oauth_grants g set revoked_at = now() where g.workspace_id = v_grant.workspace_id and g.id = v_grant.id and g.revoked_at is null;
    return query select 'invalid_grant', 'the authorization code was already used; every token issued from it is revoked',
                        null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  update crm.oauth_codes c set used_at = now() where c.workspace_id = v_code.workspace_id and c.grant_id = v_code.grant_id;
  if v_code.expires_at <= now() then
    return query select 'invalid_grant', 'the authorization code has expired', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  if v_grant.revoked_at is not null then
    return query select 'invalid_grant', 'the grant was revoked', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  if p_redirect_uri is distinct from v_code.redirect_uri then
    return query select 'invalid_grant', 'redirect_uri differs from the one the code was issued for', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  if p_code_verifier is null
     or rtrim(translate(encode(sha256(convert_to(p_code_verifier, 'UTF8')), 'base64'), '+/', '-_'), '=') <> v_code.code_challenge then
    return query select 'invalid_grant', 'code_verifier does not match the code_challenge', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  if not crm.oauth_grant_user_active(v_grant.workspace_id, v_grant.user_id) then
    return query select 'invalid_grant', 'the user can no longer act in this workspace', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  return query select null::text, null::text, i.scopes, i.access_expires_at, i.refresh_issued
    from crm.oauth_issue_tokens(v_grant, v_app.name, v_grant.scopes, p_access_token_hash, p_refresh_token_hash) i;
end
$$;
comment on function crm.oauth_exchange_code(text, bytea, bytea, text, text, bytea, bytea) is
  'POST /oauth/token with grant_type=authorization_code: client authentication, the single-use code (reuse revokes its grant), redirect URI, PKCE S256, then the tokens. Returns error = an RFC 6749 code when refused.';
revoke execute on function crm.oauth_exchange_code(text, bytea, bytea, text, text, bytea, bytea) from public;
grant execute on function crm.oauth_exchange_code(text, bytea, bytea, text, text, bytea, bytea) to crm_runtime;

-- grant_type=refresh_token (RFC 6749 section 6): rotation with reuse detection (RFC 9700 section
-- 4.14.2). An optional narrower scope applies to the new access token; the new refresh token keeps
-- the grant's scopes.
create function crm.oauth_refresh(p_client_id text, p_client_secret_hash bytea, p_refresh_token_hash bytea, p_scopes text[],
                                  p_access_token_hash bytea, p_new_refresh_token_hash bytea)
returns table (error text, error_description text, scopes text[], access_expires_at timestamptz, refresh_issued boolean)
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_app crm.oauth_apps := crm.oauth_client(p_client_id, p_client_secret_hash);
  v_refresh crm.oauth_refresh_tokens;
  v_grant crm.oauth_grants;
begin
  if v_app.id is null then
    return query select 'invalid_client', 'unknown client, or wrong client authentication', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  select * into v_refresh from crm.oauth_refresh_tokens r where r.token_hash = p_refresh_token_hash for update;
  select * into v_grant from crm.oauth_grants g where g.workspace_id = v_refresh.workspace_id and g.id = v_refresh.grant_id for update;
  if v_refresh.id is null or v_grant.app_id <> v_app.id or v_grant.workspace_id <> v_app.workspace_id then
    return query select 'invalid_grant', 'unknown refresh token', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  if v_refresh.used_at is not null then
    update crm.oauth_grants g set revoked_at = now() where g.workspace_id = v_grant.workspace_id and g.id = v_grant.id and g.revoked_at is null;
    return query select 'invalid_grant', 'the refresh token was already used; the grant is revoked', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  if v_grant.revoked_at is not null then
    return query select 'invalid_grant', 'the grant was revoked', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  if v_refresh.expires_at <= now() then
    return query select 'invalid_grant', 'the refresh token has expired', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  if p_scopes is not null and not (crm.scopes_are_valid(p_scopes) and p_scopes <@ v_grant.scopes) then
    return query select 'invalid_scope', 'scope must be a subset of the scopes granted', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  update crm.oauth_refresh_tokens r set used_at = now() where r.workspace_id = v_refresh.workspace_id and r.id = v_refresh.id;
  if not crm.oauth_grant_user_active(v_grant.workspace_id, v_grant.user_id) then
    return query select 'invalid_grant', 'the user can no longer act in this workspace', null::text[], null::timestamptz, null::boolean;
    return;
  end if;
  return query select null::text, null::text, i.scopes, i.access_expires_at, i.refresh_issued
    from crm.oauth_issue_tokens(v_grant, v_app.name, coalesce(p_scopes, v_grant.scopes), p_access_token_hash, p_new_refresh_token_hash) i;
end
$$;
comment on function crm.oauth_refresh(text, bytea, bytea, text[], bytea, bytea) is
  'POST /oauth/token with grant_type=refresh_token: client authentication, rotation (a used refresh token presented again revokes the grant), optional narrower scope. Returns error = an RFC 6749 code when refused.';
revoke execute on function crm.oauth_refresh(text, bytea, bytea, text[], bytea, bytea) from public;
grant execute on function crm.oauth_refresh(text, bytea, bytea, text[], bytea, bytea) to crm_runtime;

-- POST /oauth/revoke (RFC 7009): an access token or a refresh token the authenticated client
-- holds. Either revokes the whole grant (RFC 7009 section 2.1 allows it; an app that lost one
-- token gets no way to keep the others). A token that is unknown, already revoked or another
-- client's changes nothing and answers the same (section 2.2). Returns 'invalid_client' or null.
create function crm.oauth_revoke(p_client_id text, p_client_secret_hash bytea, p_token_hash bytea) returns text
language plpgsql volatile security definer
set search_path = pg_catalog, crm, pg_temp
as $$
declare
  v_app crm.oauth_apps := crm.oauth_client(p_client_id, p_client_secret_hash);
begin
  if v_app.id is null then
    return 'invalid_client';
  end if;
  update crm.oauth_grants g set revoked_at = now()
   where g.revoked_at is null and g.workspace_id = v_app.workspace_id and g.app_id = v_app.id
     and g.id = coalesce(
       (select t.oauth_grant_id from crm.tokens t
         where t.token_hash = p_token_hash and t.kind = 'oauth' and t.oauth_app_id = v_app.id),
       (select r.grant_id from crm.oauth_refresh_tokens r
         where r.token_hash = p_token_hash and r.workspace_id = v_app.workspace_id));
  return null;
end
$$;
comment on function crm.oauth_revoke(text, bytea, bytea) is
  'POST /oauth/revoke: revokes the grant of an access or refresh token the authenticated client holds; unknown tokens change nothing. Returns invalid_client or null.';
revoke execute on function crm.oauth_revoke(text, bytea, bytea) from public;
grant execute on function crm.oauth_revoke(text, bytea, bytea) to crm_runtime;

-- ---------------------------------------------------------------------------------------------
-- Housekeeping: codes a day after they expired, refresh tokens a week after use or expiry, and
-- grants a week after they were revoked or their last token expired (their access tokens go with
-- them, already expired or revoked).
create function crm.prune_oauth(log_retention_days integer) returns bigint
language sql volatile
set search_path = pg_catalog, crm, pg_temp
as $$
  with codes as (delete from crm.oauth_codes where expires_at < now() - interval '1 day' returning 1),
       refresh as (delete from crm.oauth_refresh_tokens
                    where used_at < now() - interval '7 days' or expires_at < now() - interval '7 days' returning 1),
       grants as (delete from crm.oauth_grants
                   where revoked_at < now() - interval '7 days' or expires_at < now() - interval '7 days' returning 1)
  select (select count(*) from codes) + (select count(*) from refresh) + (select count(*) from grants)
$$;
comment on function crm.prune_oauth(integer) is 'Removes spent authorization codes, refresh tokens and grants a while after they stopped working.';
revoke execute on function crm.prune_oauth(integer) from public;
