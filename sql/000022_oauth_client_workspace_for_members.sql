-- The consent page's look-up of a client id tells the workspace behind the app only to a user who
-- may connect it. crm.oauth_authorization_client (000012) answered the workspace's id, slug and
-- name to any signed-in user for any client id, and client ids are public (they travel in every
-- authorization link): anyone who signed up could learn which workspace stands behind an app. The
-- workspace's columns are now null unless the current user is an active member of it with API
-- access (the same test as user_may_connect, which the page needs to decide what to show).

set local lock_timeout = '5s';
set local statement_timeout = '60s';

create or replace function crm.oauth_authorization_client(p_client_id text, p_redirect_uri text)
returns table (app_id uuid, app_name text, workspace_id uuid, workspace_slug text, workspace_name text,
               redirect_uri_ok boolean, user_may_connect boolean)
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $$
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
$$;
comment on function crm.oauth_authorization_client(text, text) is
  'For GET /oauth/authorize: the app of a client id (its name), whether the redirect URI is registered, whether the current user may connect it; the app''s workspace (id, slug, name) only for a user who may, null for anyone else.';
