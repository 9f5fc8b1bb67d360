-- What the web UI needs beyond the API's tables: OAuth apps registered by workspace admins, and
-- two-factor enrollment by the signed-in user (crm.user_totp and crm.recovery_codes stay out of
-- crm_api's reach; the functions below touch only the current user's rows).

-- Transaction-local limits, as in every migration: waiting long for a lock would hold up every
-- query queued behind the migration, and no statement here should run for long.
set local lock_timeout = '5s';
set local statement_timeout = '60s';

-- ---------------------------------------------------------------------------------------------
-- OAuth apps
-- Redirect URIs: absolute https URLs without a fragment; plain http only for loopback (native and
-- local development clients, as RFC 8252 allows).
create function crm.oauth_redirect_uris_are_valid(uris text[]) returns boolean
language sql immutable parallel safe
as $$
  select coalesce(bool_and(length(u) <= 2000 and position('#' in u) = 0
                           and (u ~ '^https://[^/?#@\s]+(/[^\s]*)?$' or u ~ '^http://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?(/[^\s]*)?$')), false)
    from unnest(uris) u
$$;
comment on function crm.oauth_redirect_uris_are_valid(text[]) is 'CHECK for redirect URIs: https, or http on a loopback host; no fragment, no spaces.';
grant execute on function crm.oauth_redirect_uris_are_valid(text[]) to crm_api;

create table crm.oauth_apps (
  workspace_id uuid not null default crm.current_workspace_id() references crm.workspaces (id) on delete cascade,
  id uuid not null default crm.uuid_v7(),
  name text not null constraint oauth_apps_name_length check (length(btrim(name)) between 1 and 100),
  client_id text not null constraint oauth_apps_client_id_format check (client_id ~ '^crmapp_[A-Za-z0-9_-]{22}$'),
  client_secret_hash bytea not null constraint oauth_apps_client_secret_hash_length check (length(client_secret_hash) = 32),
  client_secret_last4 text not null constraint oauth_apps_client_secret_last4_length check (length(client_secret_last4) = 4),
  redirect_uris text[] not null constraint oauth_apps_redirect_uris_valid check (
    cardinality(redirect_uris) between 1 and 10
    and crm.oauth_redirect_uris_are_valid(redirect_uris)),
  created_at timestamptz not null default now(),
  created_by uuid default crm.current_user_id(),
  primary key (workspace_id, id),
  constraint oauth_apps_client_id_key unique (workspace_id, client_id)
);
alter table crm.oauth_apps enable row level security;
-- Serves the token endpoint's lookup by client id (ids are 128 random bits, so global collisions
-- do not happen; the unique key stays workspace-first for distribution by workspace).
create index oauth_apps_client_id_idx on crm.oauth_apps (client_id);
comment on table crm.oauth_apps is 'Third-party apps registered by workspace admins: a public client id, a SHA-256 of the client secret (shown once), redirect URIs.';
comment on column crm.oauth_apps.client_secret_hash is 'SHA-256 of the secret (crmsec_ + 32 random bytes): high entropy, so a plain hash is a safe way to store it.';

create policy oauth_apps_all_admin on crm.oauth_apps for all to crm_api
  using (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()))
  with check (workspace_id = (select crm.current_workspace_id()) and (select crm.is_admin()));
comment on policy oauth_apps_all_admin on crm.oauth_apps is 'Admins of the current workspace register, see and delete its apps; others see none.';

grant select (workspace_id, id, name, client_id, client_secret_last4, redirect_uris, created_at, created_by) on crm.oauth_apps to crm_api;
grant insert (name, client_id, client_secret_hash, client_secret_last4, redirect_uris) on crm.oauth_apps to crm_api;
grant delete on crm.oauth_apps to crm_api;

-- ---------------------------------------------------------------------------------------------
-- Two-factor enrollment by the signed-in user. The service checks the code (the TOTP key derives
-- from APP_SECRET, which the database never sees) before it calls confirm or disable.
create function crm.my_totp() returns table (secret_encrypted bytea, confirmed boolean, recovery_codes_left integer)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
  select t.secret_encrypted, t.confirmed_at is not null,
         (select count(*)::integer from crm.recovery_codes r where r.user_id = t.user_id and r.used_at is null)
    from crm.user_totp t
   where t.user_id = crm.current_user_id()
$$;
comment on function crm.my_totp() is 'The current user''s (encrypted) TOTP secret, whether it is confirmed, and unused recovery codes; no row when two-factor is off.';

create function crm.start_totp_enrollment(p_secret_encrypted bytea) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
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
$$;
comment on function crm.start_totp_enrollment(bytea) is 'Stores a new, unconfirmed TOTP secret for the current user (refused while two-factor is on).';

create function crm.confirm_totp_enrollment(p_recovery_code_hashes bytea[]) returns void
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_user uuid := crm.current_user_id();
begin
  update crm.user_totp t set confirmed_at = now() where t.user_id = v_user and t.confirmed_at is null;
  if not found then
    raise exception 'no two-factor enrollment is waiting for confirmation' using errcode = 'CR409', hint = 'conflict';
  end if;
  delete from crm.recovery_codes r where r.user_id = v_user;
  insert into crm.recovery_codes (user_id, code_hash) select v_user, h from unnest(p_recovery_code_hashes) h;
end
$$;
comment on function crm.confirm_totp_enrollment(bytea[]) is 'Turns two-factor on for the current user (the service has checked a code) and replaces the recovery codes.';

create function crm.disable_totp() returns void
language sql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
  delete from crm.recovery_codes r where r.user_id = crm.current_user_id();
  delete from crm.user_totp t where t.user_id = crm.current_user_id();
$$;
comment on function crm.disable_totp() is 'Turns two-factor off for the current user (the service has checked a code first).';

grant execute on function crm.my_totp(), crm.start_totp_enrollment(bytea), crm.confirm_totp_enrollment(bytea[]), crm.disable_totp() to crm_api;
