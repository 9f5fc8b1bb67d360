-- Tenancy and access: workspaces, users, memberships, roles and their grants, teams, invitations,
-- tokens, the rate limit's counters and the secret of the request context.
-- The first migrations make every table and index of the schema by area, as they stood when the
-- numbered files were folded; later ones change them. Functions, views, policies, triggers, grants
-- and comments are not here: each is defined once in sql/definitions/ (sql/CONVENTIONS.md).

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create table crm.workspaces (
  id uuid default crm.uuid_v7() not null,
  slug text not null,
  name text not null,
  plan text default 'free'::text not null,
  trial_ends_at timestamp with time zone,
  seat_limit integer,
  created_at timestamp with time zone default now() not null,
  constraint workspaces_pkey PRIMARY KEY (id),
  constraint workspaces_slug_key UNIQUE (slug),
  constraint workspaces_name_length CHECK (((length(btrim(name)) >= 1) AND (length(btrim(name)) <= 255))),
  constraint workspaces_plan_known CHECK ((plan = ANY (ARRAY['free'::text, 'pro'::text]))),
  constraint workspaces_seat_limit_positive CHECK (((seat_limit IS NULL) OR (seat_limit >= 0))),
  constraint workspaces_slug_format CHECK ((slug ~ '^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$'::text))
);
alter table crm.workspaces enable row level security;
alter table crm.workspaces force row level security;

create table crm.users (
  id uuid default crm.uuid_v7() not null,
  email text not null,
  name text not null,
  password_hash text,
  api_access boolean default true not null,
  suspended_at timestamp with time zone,
  last_workspace_id uuid,
  created_at timestamp with time zone default now() not null,
  constraint users_pkey PRIMARY KEY (id),
  constraint users_email_key UNIQUE (email),
  constraint users_email_format CHECK (
    ((email = lower(email)) AND (email ~ '^[^@\s]+@[^@\s]+\.[^@\s]+$'::text) AND (length(email) <= 254))
  ),
  constraint users_name_length CHECK (((length(btrim(name)) >= 1) AND (length(btrim(name)) <= 255)))
);
alter table crm.users enable row level security;
alter table crm.users force row level security;

create sequence crm.access_versions as bigint increment by 1 minvalue 1 maxvalue 9223372036854775807 start with 1 cache 1;

create table crm.memberships (
  workspace_id uuid not null,
  user_id uuid not null,
  role_id uuid not null,
  suspended_at timestamp with time zone,
  joined_at timestamp with time zone default now() not null,
  access_version bigint default 0 not null,
  constraint memberships_pkey PRIMARY KEY (workspace_id, user_id)
);
alter table crm.memberships enable row level security;
alter table crm.memberships force row level security;
CREATE INDEX memberships_role_idx ON crm.memberships USING btree (workspace_id, role_id);
CREATE INDEX memberships_user_idx ON crm.memberships USING btree (user_id, joined_at);

create table crm.roles (
  workspace_id uuid not null,
  id uuid default crm.uuid_v7() not null,
  name text not null,
  is_admin boolean default false not null,
  is_builtin boolean default false not null,
  created_at timestamp with time zone default now() not null,
  constraint roles_pkey PRIMARY KEY (workspace_id, id),
  constraint roles_name_key UNIQUE (workspace_id, name),
  constraint roles_name_format CHECK ((name ~ '^[a-z][a-z0-9_]{0,62}$'::text))
);
alter table crm.roles enable row level security;
alter table crm.roles force row level security;

create table crm.role_grants (
  workspace_id uuid not null,
  role_id uuid not null,
  resource text not null,
  action text not null,
  scope text not null,
  constraint role_grants_pkey PRIMARY KEY (workspace_id, role_id, resource, action),
  constraint role_grants_action_known CHECK (
    (action = ANY (ARRAY['view'::text, 'create'::text, 'update'::text, 'delete'::text, 'import'::text, 'export'::text]))
  ),
  constraint role_grants_resource_known CHECK (
    (resource = ANY (ARRAY['contacts'::text, 'companies'::text, 'deals'::text]))
  ),
  constraint role_grants_scope_known CHECK ((scope = ANY (ARRAY['own'::text, 'team'::text, 'all'::text])))
);
alter table crm.role_grants enable row level security;
alter table crm.role_grants force row level security;

create table crm.teams (
  workspace_id uuid not null,
  id uuid default crm.uuid_v7() not null,
  name text not null,
  created_at timestamp with time zone default now() not null,
  constraint teams_pkey PRIMARY KEY (workspace_id, id),
  constraint teams_name_key UNIQUE (workspace_id, name),
  constraint teams_name_length CHECK (((length(btrim(name)) >= 1) AND (length(btrim(name)) <= 100)))
);
alter table crm.teams enable row level security;
alter table crm.teams force row level security;

create table crm.team_members (
  workspace_id uuid not null,
  team_id uuid not null,
  user_id uuid not null,
  constraint team_members_pkey PRIMARY KEY (workspace_id, team_id, user_id)
);
alter table crm.team_members enable row level security;
alter table crm.team_members force row level security;
CREATE INDEX team_members_user_idx ON crm.team_members USING btree (workspace_id, user_id);

create table crm.invitations (
  workspace_id uuid not null,
  id uuid default crm.uuid_v7() not null,
  email text not null,
  role_id uuid not null,
  token_hash bytea not null,
  invited_by uuid,
  created_at timestamp with time zone default now() not null,
  expires_at timestamp with time zone not null,
  accepted_at timestamp with time zone,
  accepted_by uuid,
  constraint invitations_pkey PRIMARY KEY (workspace_id, id),
  constraint invitations_token_hash_key UNIQUE (token_hash),
  constraint invitations_email_format CHECK (
    ((email = lower(email)) AND (email ~ '^[^@\s]+@[^@\s]+\.[^@\s]+$'::text) AND (length(email) <= 254))
  )
);
alter table crm.invitations enable row level security;
alter table crm.invitations force row level security;
CREATE UNIQUE INDEX invitations_pending_email_key ON crm.invitations
  USING btree (workspace_id, email)
  WHERE (accepted_at IS NULL);
CREATE INDEX invitations_role_idx ON crm.invitations USING btree (workspace_id, role_id) WHERE (accepted_at IS NULL);

create table crm.invitation_teams (
  workspace_id uuid not null,
  invitation_id uuid not null,
  team_id uuid not null,
  constraint invitation_teams_pkey PRIMARY KEY (workspace_id, invitation_id, team_id)
);
alter table crm.invitation_teams enable row level security;
alter table crm.invitation_teams force row level security;
CREATE INDEX invitation_teams_team_idx ON crm.invitation_teams USING btree (workspace_id, team_id);

create table crm.tokens (
  id uuid default crm.uuid_v7() not null,
  user_id uuid not null,
  kind text not null,
  name text not null,
  token_hash bytea not null,
  created_at timestamp with time zone default now() not null,
  expires_at timestamp with time zone not null,
  revoked_at timestamp with time zone,
  last_used_at timestamp with time zone,
  scopes text[],
  workspace_id uuid,
  oauth_app_id uuid,
  oauth_grant_id uuid,
  context text,
  context_key text,
  constraint tokens_pkey PRIMARY KEY (id),
  constraint tokens_token_hash_key UNIQUE (token_hash),
  constraint tokens_kind_known CHECK ((kind = ANY (ARRAY['token'::text, 'session'::text, 'oauth'::text]))),
  constraint tokens_name_length CHECK (((length(name) >= 1) AND (length(name) <= 200))),
  constraint tokens_oauth_bound CHECK (
    (((kind = 'oauth'::text) = (workspace_id IS NOT NULL)) AND ((kind = 'oauth'::text) = (oauth_app_id IS NOT NULL)))
  ),
  constraint tokens_oauth_grant_bound CHECK (((kind = 'oauth'::text) = (oauth_grant_id IS NOT NULL))),
  constraint tokens_scopes_known CHECK (((scopes IS NULL) OR crm.scopes_are_valid(scopes)))
);
alter table crm.tokens enable row level security;
alter table crm.tokens force row level security;
CREATE INDEX tokens_oauth_grant_idx ON crm.tokens
  USING btree (workspace_id, oauth_grant_id)
  WHERE (oauth_grant_id IS NOT NULL);
CREATE INDEX tokens_user_idx ON crm.tokens USING btree (user_id, created_at);
CREATE INDEX tokens_workspace_idx ON crm.tokens USING btree (workspace_id) WHERE (workspace_id IS NOT NULL);

create unlogged table crm.rate_limit_counters (
  user_id uuid not null,
  window_start timestamp with time zone not null,
  backend_pid integer not null,
  count integer not null,
  constraint rate_limit_counters_pkey PRIMARY KEY (user_id, window_start, backend_pid)
) with (fillfactor=10);
alter table crm.rate_limit_counters enable row level security;
alter table crm.rate_limit_counters force row level security;

create table crm.internal_secrets (
  name text not null,
  value bytea not null,
  constraint internal_secrets_pkey PRIMARY KEY (name)
);
-- The key of the request context's keyed proof (sql/definitions/02_request_context.keyed_proof.sql), written
-- before row-level security is forced: the owner's policy comes with the definitions, after the tables.
insert into crm.internal_secrets (name, value) values ('context_proof', gen_random_bytes(32));
alter table crm.internal_secrets enable row level security;
alter table crm.internal_secrets force row level security;

-- Foreign keys

alter table crm.invitation_teams
  add constraint invitation_teams_workspace_id_invitation_id_fkey FOREIGN KEY (workspace_id, invitation_id)
  REFERENCES crm.invitations(workspace_id, id) ON DELETE CASCADE;
alter table crm.invitation_teams
  add constraint invitation_teams_workspace_id_team_id_fkey FOREIGN KEY (workspace_id, team_id)
  REFERENCES crm.teams(workspace_id, id) ON DELETE CASCADE;
alter table crm.invitations
  add constraint invitations_accepted_by_fkey FOREIGN KEY (accepted_by)
  REFERENCES crm.users(id) ON DELETE SET NULL;
alter table crm.invitations
  add constraint invitations_invited_by_fkey FOREIGN KEY (invited_by)
  REFERENCES crm.users(id) ON DELETE SET NULL;
alter table crm.invitations
  add constraint invitations_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
alter table crm.invitations
  add constraint invitations_workspace_id_role_id_fkey FOREIGN KEY (workspace_id, role_id)
  REFERENCES crm.roles(workspace_id, id) ON DELETE CASCADE;
alter table crm.memberships
  add constraint memberships_user_id_fkey FOREIGN KEY (user_id)
  REFERENCES crm.users(id) ON DELETE CASCADE;
alter table crm.memberships
  add constraint memberships_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
alter table crm.memberships
  add constraint memberships_workspace_id_role_id_fkey FOREIGN KEY (workspace_id, role_id)
  REFERENCES crm.roles(workspace_id, id);
alter table crm.role_grants
  add constraint role_grants_workspace_id_role_id_fkey FOREIGN KEY (workspace_id, role_id)
  REFERENCES crm.roles(workspace_id, id) ON DELETE CASCADE;
alter table crm.roles
  add constraint roles_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
alter table crm.team_members
  add constraint team_members_workspace_id_team_id_fkey FOREIGN KEY (workspace_id, team_id)
  REFERENCES crm.teams(workspace_id, id) ON DELETE CASCADE;
alter table crm.team_members
  add constraint team_members_workspace_id_user_id_fkey FOREIGN KEY (workspace_id, user_id)
  REFERENCES crm.memberships(workspace_id, user_id) ON DELETE CASCADE;
alter table crm.teams
  add constraint teams_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
alter table crm.tokens
  add constraint tokens_user_id_fkey FOREIGN KEY (user_id)
  REFERENCES crm.users(id) ON DELETE CASCADE;
alter table crm.tokens
  add constraint tokens_workspace_id_fkey FOREIGN KEY (workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE CASCADE;
alter table crm.users
  add constraint users_last_workspace_id_fkey FOREIGN KEY (last_workspace_id)
  REFERENCES crm.workspaces(id) ON DELETE SET NULL;
