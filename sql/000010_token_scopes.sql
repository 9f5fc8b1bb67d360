-- Scoped tokens (API.md section 4a): what a token may carry besides its user. A token's scopes
-- narrow its user's role and never widen it; a token without scopes acts with the whole role. An
-- OAuth access token (kind oauth) is bound to the app it was issued to and the one workspace its
-- user connected the app to (the app's).
-- The enforcement (the proven context carrying the scopes, the policy helpers intersecting the
-- role's grants with them) is in the migrations that follow.

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create function crm.known_scopes() returns text[]
language sql immutable parallel safe
as $$
  select array['contacts:read', 'contacts:write', 'companies:read', 'companies:write', 'deals:read', 'deals:write',
               'webhooks:manage', 'workspace:admin', 'offline_access']
$$;
comment on function crm.known_scopes() is 'Every scope a token may carry (API.md section 4a), in the order the documentation lists them.';
revoke execute on function crm.known_scopes() from public;
grant execute on function crm.known_scopes() to crm_api;

-- A CHECK cannot hold a subquery, so the distinctness test lives in a function.
create function crm.scopes_are_valid(p_scopes text[]) returns boolean
language sql immutable parallel safe
as $$
  select cardinality(p_scopes) between 1 and 9
     and p_scopes <@ crm.known_scopes()
     and array_position(p_scopes, null) is null
     and cardinality(p_scopes) = (select count(distinct s) from unnest(p_scopes) s)
$$;
comment on function crm.scopes_are_valid(text[]) is 'CHECK for a token''s scopes: 1 to 9 known scopes, no null, no repeat.';
revoke execute on function crm.scopes_are_valid(text[]) from public;
grant execute on function crm.scopes_are_valid(text[]) to crm_api;

alter table crm.tokens add column scopes text[];
-- A new column is null in every existing row, so its foreign key has nothing to check.
-- squawk-ignore adding-foreign-key-constraint
alter table crm.tokens add column workspace_id uuid references crm.workspaces (id) on delete cascade;
alter table crm.tokens add column oauth_app_id uuid;
-- Deleting an app deletes the tokens it holds.
-- squawk-ignore adding-foreign-key-constraint, constraint-missing-not-valid
alter table crm.tokens add constraint tokens_oauth_app_fkey foreign key (workspace_id, oauth_app_id)
  references crm.oauth_apps (workspace_id, id) on delete cascade;
comment on column crm.tokens.scopes is
  'The scopes the token is limited to (crm.known_scopes()), distinct and non-empty; null for a token that acts with its user''s whole role.';
comment on column crm.tokens.workspace_id is
  'The only workspace the token works in (OAuth access tokens); null for personal tokens and sessions, which follow X-Tenant-Slug.';
comment on column crm.tokens.oauth_app_id is 'The OAuth app an access token was issued to (an app belongs to the workspace the token is bound to).';

-- crm.tokens holds a row per live token or session (expired ones are pruned after 7 days), so
-- checking the existing rows while the constraints are added takes milliseconds: the squawk rules
-- that ask for NOT VALID and a separate validation are meant for large tables.
-- squawk-ignore constraint-missing-not-valid
alter table crm.tokens add constraint tokens_scopes_known check (scopes is null or crm.scopes_are_valid(scopes));

alter table crm.tokens drop constraint tokens_kind_known;
-- squawk-ignore constraint-missing-not-valid
alter table crm.tokens add constraint tokens_kind_known check (kind in ('token', 'session', 'oauth'));
comment on constraint tokens_kind_known on crm.tokens is
  'token: a personal API token; session: a UI session (works only through the UI); oauth: an access token issued to a third-party app.';

-- squawk-ignore constraint-missing-not-valid
alter table crm.tokens add constraint tokens_oauth_bound check (
  (kind = 'oauth') = (workspace_id is not null) and (kind = 'oauth') = (oauth_app_id is not null));
comment on constraint tokens_oauth_bound on crm.tokens is 'An OAuth access token is bound to one workspace and one app; personal tokens and sessions are not.';

-- Serves "every token an app holds in a workspace" (an admin revoking an app, crm.prune_tenancy).
-- squawk-ignore require-concurrent-index-creation
create index tokens_workspace_idx on crm.tokens (workspace_id) where workspace_id is not null;

grant select (scopes, workspace_id, oauth_app_id) on crm.tokens to crm_api;
grant insert (scopes) on crm.tokens to crm_api;
