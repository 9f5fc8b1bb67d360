-- OAuth: the authorization server's apps, grants, codes and refresh tokens.
-- Applied by `crm migrate` whenever a file of sql/definitions/ changes, as a whole and in file order
-- (sql/CONVENTIONS.md): edit the definition here; it is the only one.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.tg_oauth_apps__only_narrow_when_scoped()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.refuse_widening('Registering an OAuth app');
  elsif (new.workspace_id, new.client_id, new.redirect_uris, new.confidential, new.client_secret_hash)
        is distinct from (old.workspace_id, old.client_id, old.redirect_uris, old.confidential, old.client_secret_hash) then
    perform crm.refuse_widening('Changing an OAuth app''s redirect URIs, client type or secret');
  end if;
  return new;
end
$function$;
comment on function crm.tg_oauth_apps__only_narrow_when_scoped() is
  'A scoped credential registers no app and changes no app''s redirect URIs, client type or secret (they decide who '
  'receives the authorization codes); renaming or deleting an app is allowed.';

create or replace function crm.oauth_redirect_uri_matches(p_registered text[], p_given text)
 returns boolean
 language sql
 immutable parallel safe
as $function$
  select p_given = any (p_registered)
      or (length(p_given) <= 2000
          and p_given ~ '^http://(127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?(/[^\s#]*)?$'
          and regexp_replace(p_given, '^(http://(127\.0\.0\.1|\[::1\]))(:[0-9]{1,5})?', '\1') = any (
                select regexp_replace(r, '^(http://(127\.0\.0\.1|\[::1\]))(:[0-9]{1,5})?', '\1')
                  from unnest(p_registered) r
                 where r ~ '^http://(127\.0\.0\.1|\[::1\])'))
$function$;
comment on function crm.oauth_redirect_uri_matches(p_registered text[], p_given text) is
  'Whether a redirect_uri is one of the registered ones: exactly, or for a loopback http URI equal but for the port.';
grant execute on function crm.oauth_redirect_uri_matches(p_registered text[], p_given text) to crm_api;

create or replace function crm.oauth_client(p_client_id text, p_client_secret_hash bytea)
 returns crm.oauth_apps
 language sql
 stable
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select a.* from crm.oauth_apps a
   where a.client_id = p_client_id
     and case when a.confidential then p_client_secret_hash is not null and a.client_secret_hash = p_client_secret_hash
              else p_client_secret_hash is null end
$function$;
comment on function crm.oauth_client(p_client_id text, p_client_secret_hash bytea) is
  'The app a client id and secret authenticate (a public app presents no secret), or null. Internal.';

create or replace function crm.oauth_client_redirect_ok(p_client_id text, p_redirect_uri text)
 returns boolean
 language sql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select coalesce((select crm.oauth_redirect_uri_matches(a.redirect_uris, p_redirect_uri)
                     from crm.oauth_apps a where a.client_id = p_client_id), false)
$function$;
comment on function crm.oauth_client_redirect_ok(p_client_id text, p_redirect_uri text) is
  'For GET /oauth/authorize before sign-in (crm_runtime): whether the client id is registered with this redirect URI.';
grant execute on function crm.oauth_client_redirect_ok(p_client_id text, p_redirect_uri text) to crm_runtime;

create or replace function crm.oauth_authorization_client(p_client_id text, p_redirect_uri text)
 returns table(
   app_id uuid,
   app_name text,
   workspace_id uuid,
   workspace_slug text,
   workspace_name text,
   redirect_uri_ok boolean,
   user_may_connect boolean
 )
 language sql
 stable security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select a.id, a.name,
         case when c.may_connect then w.id end,
         case when c.may_connect then w.slug end,
         case when c.may_connect then w.name end,
         crm.oauth_redirect_uri_matches(a.redirect_uris, p_redirect_uri),
         c.may_connect
    from crm.oauth_apps a
    join crm.workspaces w on w.id = a.workspace_id
   cross join lateral (
     select exists (select from crm.memberships m join crm.users u on u.id = m.user_id
                     where m.workspace_id = a.workspace_id and m.user_id = crm.current_user_id()
                       and m.suspended_at is null and u.suspended_at is null and u.api_access) as may_connect
   ) c
   where a.client_id = p_client_id
$function$;
comment on function crm.oauth_authorization_client(p_client_id text, p_redirect_uri text) is
  'For GET /oauth/authorize: the app of a client id (its name), whether the redirect URI is registered, whether the '
  'current user may connect it; the app''s workspace (id, slug, name) only for a user who may, null for anyone else.';
grant execute on function crm.oauth_authorization_client(p_client_id text, p_redirect_uri text) to crm_api;

create or replace function crm.tg_oauth_grants__only_narrow_when_scoped()
 returns trigger
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  if tg_op = 'INSERT' then
    perform crm.refuse_widening('Authorizing an app');
  elsif not (new.scopes <@ old.scopes) or new.expires_at > old.expires_at
        or (new.workspace_id, new.app_id, new.user_id) is distinct from (old.workspace_id, old.app_id, old.user_id) then
    perform crm.refuse_widening('Widening an app''s authorization');
  end if;
  return new;
end
$function$;
comment on function crm.tg_oauth_grants__only_narrow_when_scoped() is
  'A scoped credential creates no OAuth grant and widens none (more scopes, a later expiry, another app or user); '
  'revoking one is allowed.';

create or replace function crm.tg_oauth_grants__revoke_tokens()
 returns trigger
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
begin
  update crm.tokens t set revoked_at = new.revoked_at
   where t.workspace_id = new.workspace_id and t.oauth_grant_id = new.id and t.revoked_at is null;
  return null;
end
$function$;
comment on function crm.tg_oauth_grants__revoke_tokens() is
  'A revoked grant revokes its access tokens (its refresh tokens and code check the grant).';

create or replace function crm.oauth_grant_user_active(p_workspace_id uuid, p_user_id uuid)
 returns boolean
 language sql
 stable
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  select exists (select from crm.memberships m join crm.users u on u.id = m.user_id
                  where m.workspace_id = p_workspace_id and m.user_id = p_user_id
                    and m.suspended_at is null and u.suspended_at is null and u.api_access)
$function$;
comment on function crm.oauth_grant_user_active(p_workspace_id uuid, p_user_id uuid) is
  'Whether a grant''s user is an active member with API access (internal).';

create or replace function crm.oauth_issue_code(
  p_client_id text,
  p_redirect_uri text,
  p_scopes text[],
  p_code_challenge text,
  p_code_hash bytea,
  p_code_lifetime_seconds integer
)
 returns uuid
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.oauth_issue_code(
  p_client_id text,
  p_redirect_uri text,
  p_scopes text[],
  p_code_challenge text,
  p_code_hash bytea,
  p_code_lifetime_seconds integer
) is
  'The consent of the signed-in user: a grant and its single-use authorization code (hash, redirect URI, PKCE '
  'challenge, at most 60 s).';
grant execute
  on function crm.oauth_issue_code(
    p_client_id text,
    p_redirect_uri text,
    p_scopes text[],
    p_code_challenge text,
    p_code_hash bytea,
    p_code_lifetime_seconds integer
  )
  to crm_api;

create or replace function crm.oauth_exchange_code(
  p_client_id text,
  p_client_secret_hash bytea,
  p_code_hash bytea,
  p_redirect_uri text,
  p_code_verifier text,
  p_access_token_hash bytea,
  p_refresh_token_hash bytea
)
 returns table(
   error text,
   error_description text,
   scopes text[],
   access_expires_at timestamp with time zone,
   refresh_issued boolean
 )
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.oauth_exchange_code(
  p_client_id text,
  p_client_secret_hash bytea,
  p_code_hash bytea,
  p_redirect_uri text,
  p_code_verifier text,
  p_access_token_hash bytea,
  p_refresh_token_hash bytea
) is
  'POST /oauth/token with grant_type=authorization_code: client authentication, the single-use code (reuse revokes '
  'its grant), redirect URI, PKCE S256, then the tokens. Returns error = an RFC 6749 code when refused.';
grant execute
  on function crm.oauth_exchange_code(
    p_client_id text,
    p_client_secret_hash bytea,
    p_code_hash bytea,
    p_redirect_uri text,
    p_code_verifier text,
    p_access_token_hash bytea,
    p_refresh_token_hash bytea
  )
  to crm_runtime;

create or replace function crm.oauth_access_token_lifetime()
 returns interval
 language sql
 immutable parallel safe
as $function$ select interval '1 hour' $function$;
comment on function crm.oauth_access_token_lifetime() is 'How long an OAuth access token lives (expires_in 3600).';

create or replace function crm.oauth_refresh_token_lifetime()
 returns interval
 language sql
 immutable parallel safe
as $function$ select interval '90 days' $function$;
comment on function crm.oauth_refresh_token_lifetime() is
  'How long a refresh token lives unused; each use replaces it with a new one.';

create or replace function crm.oauth_issue_tokens(
  p_grant crm.oauth_grants,
  p_app_name text,
  p_scopes text[],
  p_access_token_hash bytea,
  p_refresh_token_hash bytea
)
 returns table(scopes text[], access_expires_at timestamp with time zone, refresh_issued boolean)
 language plpgsql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.oauth_issue_tokens(
  p_grant crm.oauth_grants,
  p_app_name text,
  p_scopes text[],
  p_access_token_hash bytea,
  p_refresh_token_hash bytea
) is
  'Stores an access token (kind oauth, 1 hour) and, when the grant holds offline_access, a refresh token (internal).';

create or replace function crm.oauth_refresh(
  p_client_id text,
  p_client_secret_hash bytea,
  p_refresh_token_hash bytea,
  p_scopes text[],
  p_access_token_hash bytea,
  p_new_refresh_token_hash bytea
)
 returns table(
   error text,
   error_description text,
   scopes text[],
   access_expires_at timestamp with time zone,
   refresh_issued boolean
 )
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.oauth_refresh(
  p_client_id text,
  p_client_secret_hash bytea,
  p_refresh_token_hash bytea,
  p_scopes text[],
  p_access_token_hash bytea,
  p_new_refresh_token_hash bytea
) is
  'POST /oauth/token with grant_type=refresh_token: client authentication, rotation (a used refresh token presented '
  'again revokes the grant), optional narrower scope. Returns error = an RFC 6749 code when refused.';
grant execute
  on function crm.oauth_refresh(
    p_client_id text,
    p_client_secret_hash bytea,
    p_refresh_token_hash bytea,
    p_scopes text[],
    p_access_token_hash bytea,
    p_new_refresh_token_hash bytea
  )
  to crm_runtime;

create or replace function crm.oauth_revoke(p_client_id text, p_client_secret_hash bytea, p_token_hash bytea)
 returns text
 language plpgsql
 security definer
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
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
$function$;
comment on function crm.oauth_revoke(p_client_id text, p_client_secret_hash bytea, p_token_hash bytea) is
  'POST /oauth/revoke: revokes the grant of an access or refresh token the authenticated client holds; unknown tokens '
  'change nothing. Returns invalid_client or null.';
grant execute on function crm.oauth_revoke(p_client_id text, p_client_secret_hash bytea, p_token_hash bytea)
  to crm_runtime;

create or replace function crm.prune_oauth(log_retention_days integer)
 returns bigint
 language sql
 set search_path to 'pg_catalog', 'crm', 'pg_temp'
as $function$
  with codes as (delete from crm.oauth_codes where expires_at < now() - interval '1 day' returning 1),
       refresh as (delete from crm.oauth_refresh_tokens
                    where used_at < now() - interval '7 days' or expires_at < now() - interval '7 days' returning 1),
       grants as (delete from crm.oauth_grants
                   where revoked_at < now() - interval '7 days' or expires_at < now() - interval '7 days' returning 1)
  select (select count(*) from codes) + (select count(*) from refresh) + (select count(*) from grants)
$function$;
comment on function crm.prune_oauth(log_retention_days integer) is
  'Removes spent authorization codes, refresh tokens and grants a while after they stopped working.';

comment on table crm.oauth_apps is
  'Third-party apps registered by workspace admins: a public client id, a SHA-256 of the client secret (shown once), '
  'redirect URIs.';
comment on column crm.oauth_apps.client_secret_hash is
  'SHA-256 of the secret (crmsec_ + 32 random bytes): high entropy, so a plain hash is a safe way to store it.';
comment on column crm.oauth_apps.confidential is
  'true: a server-side app that authenticates with its client secret; false: a public (native or browser) app without '
  'a secret.';
comment on constraint oauth_apps_secret_if_confidential on crm.oauth_apps is
  'A confidential app has a secret; a public app has none.';
create policy oauth_apps_all_admin on crm.oauth_apps as permissive for all to crm_api
  using (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  )
  with check (
    ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
     AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for))
  );
comment on policy oauth_apps_all_admin on crm.oauth_apps is
  'Admins of the current workspace register, see and delete its apps (a scoped token needs workspace:admin); others '
  'see none.';
create policy oauth_apps_all_owner on crm.oauth_apps as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy oauth_apps_all_owner on crm.oauth_apps is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy oauth_apps_select_connected on crm.oauth_apps as permissive for select to crm_api
  using (
    (EXISTS ( SELECT
              FROM crm.oauth_grants g
              WHERE ((g.workspace_id = oauth_apps.workspace_id)
                     AND (g.app_id = oauth_apps.id)
                     AND (g.user_id = ( SELECT crm.current_user_id() AS current_user_id)))))
  );
comment on policy oauth_apps_select_connected on crm.oauth_apps is
  'A user sees the apps they connected (their name on the security page), as far as the grants'' own policy shows '
  'them.';
grant delete on crm.oauth_apps to crm_api;
grant select (workspace_id, id, name, client_id, client_secret_last4, redirect_uris, created_at, created_by, confidential)
  on crm.oauth_apps
  to crm_api;
grant insert (name, client_id, client_secret_hash, client_secret_last4, redirect_uris, confidential)
  on crm.oauth_apps
  to crm_api;
grant update (name, redirect_uris) on crm.oauth_apps to crm_api;
CREATE TRIGGER tg_oauth_apps__only_narrow_when_scoped BEFORE INSERT OR UPDATE ON crm.oauth_apps
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_oauth_apps__only_narrow_when_scoped();

comment on table crm.oauth_grants is
  'One consent: a member allowed an app these scopes in this workspace. Its code, refresh tokens and access tokens '
  'are issued under it; revoking it revokes them all.';
comment on column crm.oauth_grants.scopes is
  'The scopes the user allowed; refresh tokens keep them, an access token may carry fewer.';
comment on column crm.oauth_grants.last_issued_at is
  'When an access token was last issued under the grant (the code exchange or a refresh).';
comment on column crm.oauth_grants.expires_at is
  'When the last token issued under the grant expires (its newest refresh token, else its access token).';
create policy oauth_grants_all_owner on crm.oauth_grants as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy oauth_grants_all_owner on crm.oauth_grants is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
create policy oauth_grants_select_own_or_admin on crm.oauth_grants as permissive for select to crm_api
  using (
    (((user_id = ( SELECT crm.current_user_id() AS current_user_id))
      AND ((( SELECT crm.current_oauth_app_id() AS current_oauth_app_id) IS NULL)
           OR (app_id = ( SELECT crm.current_oauth_app_id() AS current_oauth_app_id))))
     OR ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
         AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for)))
  );
comment on policy oauth_grants_select_own_or_admin on crm.oauth_grants is
  'A user sees the apps they connected (in every workspace; an app''s access token only its own app''s); admins see '
  'every app connection of the current workspace (a scoped token needs workspace:admin).';
create policy oauth_grants_update_own_or_admin on crm.oauth_grants as permissive for update to crm_api
  using (
    (((user_id = ( SELECT crm.current_user_id() AS current_user_id))
      AND (((( SELECT crm.current_oauth_app_id() AS current_oauth_app_id) IS NULL)
            AND (( SELECT crm.current_scopes() AS current_scopes) IS NULL))
           OR ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
               AND (id = ( SELECT crm.current_oauth_grant_id() AS current_oauth_grant_id)))))
     OR ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
         AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for)))
  )
  with check (
    (((user_id = ( SELECT crm.current_user_id() AS current_user_id))
      AND (((( SELECT crm.current_oauth_app_id() AS current_oauth_app_id) IS NULL)
            AND (( SELECT crm.current_scopes() AS current_scopes) IS NULL))
           OR ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
               AND (id = ( SELECT crm.current_oauth_grant_id() AS current_oauth_grant_id)))))
     OR ((workspace_id = ( SELECT crm.current_workspace_id() AS current_workspace_id))
         AND ( SELECT crm.is_admin_for('workspace:admin'::text) AS is_admin_for)))
  );
comment on policy oauth_grants_update_own_or_admin on crm.oauth_grants is
  'A user disconnects the apps they connected with an unscoped token or a session; an OAuth app''s access token only '
  'its own authorization; a scoped personal token none of them; an admin disconnects any app in the current workspace '
  '(a scoped token needs workspace:admin).';
grant select on crm.oauth_grants to crm_api;
grant update (revoked_at) on crm.oauth_grants to crm_api;
CREATE TRIGGER tg_oauth_grants__only_narrow_when_scoped BEFORE INSERT OR UPDATE OF workspace_id, app_id, user_id, scopes, expires_at ON crm.oauth_grants
  FOR EACH ROW
  EXECUTE FUNCTION crm.tg_oauth_grants__only_narrow_when_scoped();
CREATE TRIGGER tg_oauth_grants__revocation_is_final BEFORE UPDATE OF revoked_at ON crm.oauth_grants
  FOR EACH ROW
  WHEN (((old.revoked_at IS NOT NULL) AND (new.revoked_at IS NULL)))
  EXECUTE FUNCTION crm.tg__revocation_is_final();
CREATE TRIGGER tg_oauth_grants__revoke_tokens AFTER UPDATE OF revoked_at ON crm.oauth_grants
  FOR EACH ROW
  WHEN (((old.revoked_at IS NULL) AND (new.revoked_at IS NOT NULL)))
  EXECUTE FUNCTION crm.tg_oauth_grants__revoke_tokens();

comment on table crm.oauth_codes is
  'Authorization codes (SHA-256 only): single use, 60 seconds at most, bound to a grant, a redirect URI and a PKCE '
  'S256 challenge. No policy: only the OAuth functions read them.';
comment on column crm.oauth_codes.code_challenge is
  'BASE64URL(SHA256(code_verifier)) as the client sent it (RFC 7636 S256, the only method accepted).';
comment on column crm.oauth_codes.used_at is
  'Set by the first exchange, successful or not; a second one revokes the grant and every token issued from the code.';
create policy oauth_codes_all_owner on crm.oauth_codes as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy oauth_codes_all_owner on crm.oauth_codes is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';

comment on table crm.oauth_refresh_tokens is
  'Refresh tokens (SHA-256 only), one family per grant; each works once and is replaced by a new one. No policy: only '
  'the OAuth functions read them.';
comment on column crm.oauth_refresh_tokens.used_at is
  'Set when the token is exchanged for the next one; presenting it again revokes the grant.';
create policy oauth_refresh_tokens_all_owner on crm.oauth_refresh_tokens as permissive for all to crm_owner
  using (true)
  with check (true);
comment on policy oauth_refresh_tokens_all_owner on crm.oauth_refresh_tokens is
  'The tables'' owner (migrations, the crm CLI, SECURITY DEFINER functions) reaches every row; no login role of '
  'requests or jobs is a member of crm_owner.';
