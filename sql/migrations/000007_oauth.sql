-- OAuth: apps, grants, codes and refresh tokens (access tokens are tokens of kind oauth).
-- The first migrations make every table and index of the schema by area, as they stood when the
-- numbered files were folded; later ones change them. Functions, views, policies, triggers, grants
-- and comments are not here: each is defined once in sql/definitions/ (sql/CONVENTIONS.md).

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create table crm.oauth_apps (
  workspace_id uuid default crm.current_workspace_id() not null,
  id uuid default crm.uuid_v7() not null,
  name text not null,
  client_id text not null,
  client_secret_hash bytea,
  client_secret_last4 text,
  redirect_uris text[] not null,
  created_at timestamp with time zone default now() not null,
  created_by uuid default crm.current_user_id(),
  confidential boolean default true not null,
  constraint oauth_apps_pkey PRIMARY KEY (workspace_id, id),
  constraint oauth_apps_client_id_key UNIQUE (workspace_id, client_id),
  constraint oauth_apps_client_id_format CHECK ((client_id ~ '^crmapp_[A-Za-z0-9_-]{22}$'::text)),
  constraint oauth_apps_client_secret_hash_length CHECK ((length(client_secret_hash) = 32)),
  constraint oauth_apps_client_secret_last4_length CHECK ((length(client_secret_last4) = 4)),
  constraint oauth_apps_name_length CHECK (((length(btrim(name)) >= 1) AND (length(btrim(name)) <= 100))),
  constraint oauth_apps_redirect_uris_valid check (cardinality(redirect_uris) between 1 and 10 and crm.oauth_redirect_uris_are_valid(redirect_uris)),
  constraint oauth_apps_secret_if_confidential CHECK (
    ((confidential = (client_secret_hash IS NOT NULL)) AND (confidential = (client_secret_last4 IS NOT NULL)))
  )
);
alter table crm.oauth_apps enable row level security;
alter table crm.oauth_apps force row level security;
CREATE INDEX oauth_apps_client_id_idx ON crm.oauth_apps USING btree (client_id);

create table crm.oauth_grants (
  workspace_id uuid not null,
  id uuid default crm.uuid_v7() not null,
  app_id uuid not null,
  user_id uuid not null,
  scopes text[] not null,
  created_at timestamp with time zone default now() not null,
  last_issued_at timestamp with time zone default now() not null,
  expires_at timestamp with time zone not null,
  revoked_at timestamp with time zone,
  constraint oauth_grants_pkey PRIMARY KEY (workspace_id, id),
  constraint oauth_grants_scopes_known CHECK (crm.scopes_are_valid(scopes))
);
alter table crm.oauth_grants enable row level security;
alter table crm.oauth_grants force row level security;
CREATE INDEX oauth_grants_app_idx ON crm.oauth_grants USING btree (workspace_id, app_id);
CREATE INDEX oauth_grants_user_idx ON crm.oauth_grants USING btree (user_id);

create table crm.oauth_codes (
  workspace_id uuid not null,
  grant_id uuid not null,
  code_hash bytea not null,
  redirect_uri text not null,
  code_challenge text not null,
  created_at timestamp with time zone default now() not null,
  expires_at timestamp with time zone not null,
  used_at timestamp with time zone,
  constraint oauth_codes_pkey PRIMARY KEY (workspace_id, grant_id),
  constraint oauth_codes_code_challenge_s256 CHECK ((code_challenge ~ '^[A-Za-z0-9_-]{43}$'::text)),
  constraint oauth_codes_code_hash_length CHECK ((length(code_hash) = 32)),
  constraint oauth_codes_lifetime CHECK ((expires_at <= (created_at + '00:01:00'::interval))),
  constraint oauth_codes_redirect_uri_length CHECK ((length(redirect_uri) <= 2000))
);
alter table crm.oauth_codes enable row level security;
alter table crm.oauth_codes force row level security;
CREATE UNIQUE INDEX oauth_codes_code_hash_key ON crm.oauth_codes USING btree (code_hash);

create table crm.oauth_refresh_tokens (
  workspace_id uuid not null,
  id uuid default crm.uuid_v7() not null,
  grant_id uuid not null,
  token_hash bytea not null,
  created_at timestamp with time zone default now() not null,
  expires_at timestamp with time zone not null,
  used_at timestamp with time zone,
  constraint oauth_refresh_tokens_pkey PRIMARY KEY (workspace_id, id),
  constraint oauth_refresh_tokens_token_hash_length CHECK ((length(token_hash) = 32))
);
alter table crm.oauth_refresh_tokens enable row level security;
alter table crm.oauth_refresh_tokens force row level security;
CREATE INDEX oauth_refresh_tokens_grant_idx ON crm.oauth_refresh_tokens USING btree (workspace_id, grant_id);
CREATE UNIQUE INDEX oauth_refresh_tokens_token_hash_key ON crm.oauth_refresh_tokens USING btree (token_hash);

-- Foreign keys (crm.tokens, made by 000002, has no rows yet when the tables are new: no scan to avoid)

alter table crm.oauth_apps
  add constraint oauth_apps_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
alter table crm.oauth_codes
  add constraint oauth_codes_workspace_id_grant_id_fkey FOREIGN KEY (workspace_id, grant_id)
  REFERENCES crm.oauth_grants(workspace_id, id) ON DELETE CASCADE;
alter table crm.oauth_grants
  add constraint oauth_grants_workspace_id_app_id_fkey FOREIGN KEY (workspace_id, app_id)
  REFERENCES crm.oauth_apps(workspace_id, id) ON DELETE CASCADE;
alter table crm.oauth_grants
  add constraint oauth_grants_workspace_id_user_id_fkey FOREIGN KEY (workspace_id, user_id)
  REFERENCES crm.memberships(workspace_id, user_id) ON DELETE CASCADE;
alter table crm.oauth_refresh_tokens
  add constraint oauth_refresh_tokens_workspace_id_grant_id_fkey FOREIGN KEY (workspace_id, grant_id)
  REFERENCES crm.oauth_grants(workspace_id, id) ON DELETE CASCADE;
alter table crm.tokens
  -- squawk-ignore adding-foreign-key-constraint, constraint-missing-not-valid
  add constraint tokens_oauth_app_fkey FOREIGN KEY (workspace_id, oauth_app_id)
  REFERENCES crm.oauth_apps(workspace_id, id) ON DELETE CASCADE;
alter table crm.tokens
  -- squawk-ignore adding-foreign-key-constraint, constraint-missing-not-valid
  add constraint tokens_oauth_grant_fkey FOREIGN KEY (workspace_id, oauth_grant_id)
  REFERENCES crm.oauth_grants(workspace_id, id) ON DELETE CASCADE;
