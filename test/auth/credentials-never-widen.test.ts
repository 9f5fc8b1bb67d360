// Credentials never widen (docs/api.md section 4a: scopes narrow a token, never widen it; docs/decisions.md,
// "A scoped credential only narrows"). Whatever a scoped token or an OAuth app's access token does,
// through any route, no credential in the database may do more afterwards: no token with more
// scopes, a longer life or less binding, no new member, role, grant, team membership, invitation,
// OAuth app, redirect URI, OAuth grant or password, for any user. Checked for the attacks by hand,
// then for every route of the route table (new routes are covered without anyone listing them),
// called by an admin with a token of every single scope, of all scopes, and with an app's token of
// each, following the chains that turn an answer into a credential (an invitation's secret accepted
// as a new user, an authorization code sent to a redirect URI the call registered); and in SQL for
// revocations, which are never undone.
import { randomUUID } from 'node:crypto'
import { generateSync } from 'otplib'
import type pg from 'pg'
import t, { type Test } from 'tap'
import Type from 'typebox'
import { hashToken } from '../../src/auth/tokens.ts'
import { assertCredentialsDeclared, type RouteDefinition } from '../../src/http/route.ts'
import { allRoutes } from '../../src/http/routes/index.ts'
import { crm } from '../helpers/cli.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant, mintToken } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { consent, pkcePair, registerApp, sessionCookie } from '../oauth/helpers.ts'
import { setPassword } from '../ui/browser.ts'

const PASSWORD = 'correct horse battery'
// The loop below calls every route about 2,000 times: more time than the default, and no rate
// limit, which has its own tests.
t.setTimeout(900_000)
const server = await startTestServer(t, { env: { RATE_LIMIT_PER_MINUTE: '1000000' } })
const url = server.databaseUrl
const owner = await ownerClient(t, url)

// The victim administers workspace V, which they used last; their integrations call without a slug.
// V has a member in a team, a suspended read-only member, a custom role, two teams, a pending
// invitation, two apps and a record of each type: what a widening write would aim at.
const victimTenant = await createTenant(url, {
  slug: 'victim-co',
  members: { 'vic@victim.test': 'admin', 'mia@victim.test': 'member', 'sam@victim.test': 'read_only' },
  teams: { east: ['mia@victim.test'], west: [] },
})
const victim = victimTenant.members['vic@victim.test']
const mia = victimTenant.members['mia@victim.test']
const sam = victimTenant.members['sam@victim.test']
await owner.query('update crm.users set last_workspace_id = $1 where id = $2', [victimTenant.id, victim.id])
await owner.query('update crm.memberships set suspended_at = now() where workspace_id = $1 and user_id = $2', [victimTenant.id, sam.id])
const app = await registerApp(server, victim.token, { name: 'Mail merge' })
const otherApp = await registerApp(server, victim.token, { name: 'Calendar sync' })
const {
  rows: [fixture],
} = await owner.query(
  `with closer as (insert into crm.roles (workspace_id, name) values ($1, 'closer') returning id),
        grants as (insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
                   select $1, id, 'deals', a, 'own' from closer, unnest(array['view', 'update']) a),
        invitation as (insert into crm.invitations (workspace_id, email, role_id, token_hash, expires_at)
                       select $1, 'pending@victim.test', id, sha256('pending'), now() + interval '7 days'
                         from crm.roles where workspace_id = $1 and name = 'member' returning id),
        contact as (insert into crm.contacts (workspace_id, owner_id, first_name) values ($1, $2, 'Kept') returning id),
        company as (insert into crm.companies (workspace_id, owner_id, name) values ($1, $2, 'Kept') returning id),
        deal as (insert into crm.deals (workspace_id, owner_id, name, stage) values ($1, $2, 'Kept', 'lead') returning id)
   select (select id from closer) as closer, (select id from invitation) as invitation, (select id from contact) as contact,
          (select id from company) as company, (select id from deal) as deal,
          (select id from crm.teams where workspace_id = $1 and name = 'east') as east,
          (select id from crm.roles where workspace_id = $1 and name = 'member') as member`,
  [victimTenant.id, victim.id],
)
const subscription = await server.request('POST', '/api/webhook-subscriptions', {
  token: victim.token,
  body: { name: 'Billing sync', url: 'https://hooks.example.com/crm', events: ['*'] },
})
const subscriptionId: string = subscription.status === 201 ? subscription.body.data.id : randomUUID()

// The attacker signs up from the internet: workspace B.
const signedUp = await server.request('POST', '/api/signup', {
  body: { email: 'mallory@attacker.test', password: PASSWORD, name: 'Mallory', workspace_name: 'Attacker' },
})
if (signedUp.status !== 201) throw new Error(`sign-up answered ${signedUp.status}: ${signedUp.text}`)
const attacker = signedUp.body.token as string

// Everything made so far is the fixture; restore() puts it back after a call that changed it.
await owner.query(`create temporary table fixture_workspaces as select id from crm.workspaces;
  create temporary table fixture_users as select * from crm.users;
  create temporary table fixture_memberships as select * from crm.memberships;
  create temporary table fixture_roles as select * from crm.roles;
  create temporary table fixture_role_grants as select * from crm.role_grants;
  create temporary table fixture_teams as select * from crm.teams;
  create temporary table fixture_team_members as select * from crm.team_members;
  create temporary table fixture_invitations as select * from crm.invitations;
  create temporary table fixture_apps as select * from crm.oauth_apps;
  create temporary table fixture_subscriptions as select * from crm.webhook_subscriptions;
  create temporary table fixture_contacts as select * from crm.contacts;
  create temporary table fixture_companies as select * from crm.companies;
  create temporary table fixture_deals as select * from crm.deals;
  create temporary table fixture_tokens as select id from crm.tokens;
  create temporary table fixture_grants as select id from crm.oauth_grants;
  create temporary table callers (id uuid primary key)`)

/**
 * Counts the test's own writes (callers minted, the fixture restored, chains followed): a snapshot
 * taken after a call that changed nothing stands for the state before the next call only while it
 * has not moved.
 */
let testWrites = 0

/** Puts the fixture back (as the owner, without a request context): what a call removed, changed or added. */
async function restore(): Promise<void> {
  testWrites++
  await owner.query(
    `
    delete from crm.workspaces where id not in (select id from fixture_workspaces);
    delete from crm.users where id not in (select id from fixture_users);
    update crm.users u set password_hash = f.password_hash, api_access = f.api_access, suspended_at = f.suspended_at,
                           last_workspace_id = f.last_workspace_id
      from fixture_users f where f.id = u.id and (u.password_hash, u.api_access, u.suspended_at, u.last_workspace_id)
                                                   is distinct from (f.password_hash, f.api_access, f.suspended_at, f.last_workspace_id);
    delete from crm.invitations i where not exists (select from fixture_invitations f where f.workspace_id = i.workspace_id and f.id = i.id);
    insert into crm.invitations select * from fixture_invitations on conflict do nothing;
    insert into crm.roles select * from fixture_roles on conflict do nothing;
    update crm.roles r set name = f.name, is_admin = f.is_admin from fixture_roles f
     where f.workspace_id = r.workspace_id and f.id = r.id and not r.is_builtin and (r.name, r.is_admin) is distinct from (f.name, f.is_admin);
    insert into crm.memberships (workspace_id, user_id, role_id, suspended_at, joined_at)
    select workspace_id, user_id, role_id, suspended_at, joined_at from fixture_memberships on conflict do nothing;
    update crm.memberships m set role_id = f.role_id, suspended_at = f.suspended_at from fixture_memberships f
     where f.workspace_id = m.workspace_id and f.user_id = m.user_id
       and (m.role_id, m.suspended_at is null) is distinct from (f.role_id, f.suspended_at is null);
    delete from crm.memberships m where not exists (select from fixture_memberships f where f.workspace_id = m.workspace_id and f.user_id = m.user_id);
    delete from crm.roles r where not exists (select from fixture_roles f where f.workspace_id = r.workspace_id and f.id = r.id);
    delete from crm.role_grants g where not exists (select from fixture_role_grants f where (f.workspace_id, f.role_id, f.resource, f.action, f.scope)
                                                                                          = (g.workspace_id, g.role_id, g.resource, g.action, g.scope))
       and not exists (select from crm.roles r where r.workspace_id = g.workspace_id and r.id = g.role_id and r.is_builtin);
    insert into crm.role_grants select * from fixture_role_grants f
     where not exists (select from crm.roles r where r.workspace_id = f.workspace_id and r.id = f.role_id and r.is_builtin) on conflict do nothing;
    insert into crm.teams select * from fixture_teams on conflict do nothing;
    update crm.teams t set name = f.name from fixture_teams f where f.workspace_id = t.workspace_id and f.id = t.id and t.name <> f.name;
    delete from crm.teams t where not exists (select from fixture_teams f where f.workspace_id = t.workspace_id and f.id = t.id);
    delete from crm.team_members m where not exists (select from fixture_team_members f where (f.workspace_id, f.team_id, f.user_id) = (m.workspace_id, m.team_id, m.user_id));
    insert into crm.team_members select * from fixture_team_members on conflict do nothing;
    delete from crm.oauth_apps a where not exists (select from fixture_apps f where f.workspace_id = a.workspace_id and f.id = a.id);
    insert into crm.oauth_apps select * from fixture_apps on conflict do nothing;
    update crm.oauth_apps a set name = f.name, redirect_uris = f.redirect_uris from fixture_apps f
     where f.workspace_id = a.workspace_id and f.id = a.id and (a.name, a.redirect_uris) is distinct from (f.name, f.redirect_uris);
    delete from crm.webhook_subscriptions s where not exists (select from fixture_subscriptions f where f.workspace_id = s.workspace_id and f.id = s.id);
    insert into crm.webhook_subscriptions select * from fixture_subscriptions on conflict do nothing;
    delete from crm.contacts c where not exists (select from fixture_contacts f where f.workspace_id = c.workspace_id and f.id = c.id);
    insert into crm.contacts select * from fixture_contacts on conflict do nothing;
    delete from crm.companies c where not exists (select from fixture_companies f where f.workspace_id = c.workspace_id and f.id = c.id);
    insert into crm.companies select * from fixture_companies on conflict do nothing;
    delete from crm.deals d where not exists (select from fixture_deals f where f.workspace_id = d.workspace_id and f.id = d.id);
    insert into crm.deals select * from fixture_deals on conflict do nothing;
    delete from crm.tokens t where t.id not in (select id from fixture_tokens) and t.id not in (select id from callers);
    delete from crm.oauth_grants g where g.id not in (select id from fixture_grants)
       and not exists (select from crm.tokens t where t.oauth_grant_id = g.id)`,
  )
}

type Caller = {
  kind: 'token' | 'app'
  token: string
  id: string
  grantId: string | null
  expiresAt: number
  scopes: string[]
}
const MINIMAL = ['contacts:read']
const { rows: scopeRows } = await owner.query('select unnest(crm.known_scopes()) as scope')
const KNOWN_SCOPES: string[] = scopeRows.map((row) => row.scope)

/** A token of the victim with these scopes: a personal one, or an app's access token bound to V. */
async function newCaller(kind: 'scoped' | 'token' | 'app', scopes = MINIMAL): Promise<Caller> {
  testWrites++
  const token = await mintToken(
    owner,
    victim.id,
    kind === 'app' ? { kind: 'oauth', scopes, workspaceId: victimTenant.id, oauthAppId: app.id, ttl: '1 hour' } : { scopes },
  )
  const {
    rows: [row],
  } = await owner.query('select id, oauth_grant_id, expires_at from crm.tokens where token_hash = $1', [hashToken(token)])
  await owner.query('insert into callers values ($1)', [row.id])
  return {
    kind: kind === 'app' ? 'app' : 'token',
    token,
    id: row.id,
    grantId: row.oauth_grant_id,
    expiresAt: row.expires_at.getTime(),
    scopes,
  }
}

/** The callers of the route loop: each single scope, then all of them, as a personal token and as an app's token. */
const slots: { label: string; kind: 'token' | 'app'; scopes: string[]; caller?: Caller }[] = [
  ...KNOWN_SCOPES.map((scope) => [scope]),
  KNOWN_SCOPES,
].flatMap((scopes) =>
  (['token', 'app'] as const).map((kind) => ({ label: `${kind} ${scopes.length > 1 ? 'of all scopes' : scopes[0]}`, kind, scopes })),
)

/**
 * What every credential in the database can do, as comparable JSON (one round trip): tokens,
 * users' passwords and standing, each active member's admin flag and effective grants (from
 * crm.member_access), every role's grants, team memberships, invitations, OAuth apps and grants;
 * and a fingerprint of the records and subscriptions, for the refusals that must change nothing.
 */
async function snapshot(): Promise<Snapshot> {
  const { rows } = await owner.query(`
    with role_grants as (
      select g.workspace_id, g.role_id, json_object_agg(g.resource || ':' || g.action, g.scope order by g.resource, g.action) as grants
        from crm.role_grants g group by g.workspace_id, g.role_id)
    select json_build_object(
    'workspaces', (select json_object_agg(id, slug order by id) from crm.workspaces),
    'users', (select json_object_agg(id, json_build_object('email', email, 'password', md5(coalesce(password_hash, '')), 'api', api_access,
                                                         'suspended', suspended_at is not null, 'last', last_workspace_id) order by id) from crm.users),
    'tokens', coalesce((select json_object_agg(id, json_build_object('user', user_id, 'kind', kind, 'scopes', scopes, 'expires', expires_at,
                                              'revoked', revoked_at is not null, 'workspace', workspace_id, 'app', oauth_app_id,
                                              'grant', oauth_grant_id) order by id) from crm.tokens), '{}'),
    'access', coalesce((select json_object_agg(w.slug || ' ' || u.email, json_build_object('workspace', w.id, 'admin', r.is_admin,
                          'grants', coalesce((select json_object_agg(a.resource || ':' || a.action, a.scope order by a.resource, a.action) from crm.member_access a
                                               where a.workspace = w.slug and a.email = u.email), '{}')) order by w.slug, u.email)
                          from crm.memberships m join crm.users u on u.id = m.user_id join crm.workspaces w on w.id = m.workspace_id
                          join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
                         where m.suspended_at is null and u.suspended_at is null), '{}'),
    'roles', (select json_object_agg(r.id, json_build_object('workspace', r.workspace_id, 'admin', r.is_admin,
                                                             'grants', coalesce(g.grants, '{}')) order by r.id)
                from crm.roles r left join role_grants g on g.workspace_id = r.workspace_id and g.role_id = r.id),
    'teams', coalesce((select json_object_agg(workspace_id || ' ' || team_id || ' ' || user_id, workspace_id order by workspace_id, team_id, user_id) from crm.team_members), '{}'),
    'invitations', coalesce((select json_object_agg(i.id, json_build_object('workspace', i.workspace_id, 'role', i.role_id, 'email', i.email,
                               'expires', i.expires_at, 'pending', i.accepted_at is null,
                               'teams', coalesce((select json_agg(it.team_id order by it.team_id) from crm.invitation_teams it
                                                   where it.workspace_id = i.workspace_id and it.invitation_id = i.id), '[]')) order by i.id)
                               from crm.invitations i), '{}'),
    'apps', coalesce((select json_object_agg(a.id, json_build_object('workspace', a.workspace_id, 'client', a.client_id, 'uris', a.redirect_uris,
                        'confidential', a.confidential, 'secret', encode(a.client_secret_hash, 'hex')) order by a.id) from crm.oauth_apps a), '{}'),
    'grants', coalesce((select json_object_agg(g.id, json_build_object('workspace', g.workspace_id, 'app', g.app_id, 'user', g.user_id,
                          'scopes', g.scopes, 'expires', g.expires_at, 'revoked', g.revoked_at is not null) order by g.id) from crm.oauth_grants g), '{}'),
    'records', json_build_array(
      (select count(*) || ' ' || coalesce(max(updated_at)::text, '') from crm.contacts),
      (select count(*) || ' ' || coalesce(max(updated_at)::text, '') from crm.companies),
      (select count(*) || ' ' || coalesce(max(updated_at)::text, '') from crm.deals),
      (select count(*) || ' ' || coalesce(max(updated_at)::text, '') from crm.webhook_subscriptions),
      (select count(*) from crm.imports))
  ) as state`)
  return rows[0].state
}

type TokenState = {
  user: string
  kind: string
  scopes: string[] | null
  expires: string
  revoked: boolean
  workspace: string | null
  app: string | null
  grant: string | null
}
type Access = { workspace: string; admin: boolean; grants: Record<string, string> }
type Snapshot = {
  workspaces: Record<string, string>
  users: Record<string, { email: string; password: string; api: boolean; suspended: boolean; last: string | null }>
  tokens: Record<string, TokenState>
  access: Record<string, Access>
  roles: Record<string, Access>
  teams: Record<string, string>
  invitations: Record<string, { workspace: string; role: string; email: string; expires: string; pending: boolean; teams: string[] }>
  apps: Record<string, { workspace: string; client: string; uris: string[]; confidential: boolean; secret: string | null }>
  grants: Record<string, { workspace: string; app: string; user: string; scopes: string[]; expires: string; revoked: boolean }>
  records: unknown[]
}

const RANK: Record<string, number> = { own: 1, team: 2, all: 3 }
const later = (after: string, before: string) => Date.parse(after) > Date.parse(before)
const more = (after: string[] | null, before: string[] | null) =>
  before !== null && (after === null || after.some((scope) => !before.includes(scope)))

/** What an admin flag and grants give beyond what they gave, or nothing. */
function accessGained(after: Access, before: Access | undefined): string[] {
  if (before === undefined) return [Object.keys(after.grants).length > 0 || after.admin ? 'access it did not have' : ''].filter(Boolean)
  const gained = Object.entries(after.grants)
    .filter(([grant, scope]) => (RANK[before.grants[grant]] ?? 0) < RANK[scope])
    .map(([grant, scope]) => `${grant}:${scope}`)
  return [...(after.admin && !before.admin ? ['admin'] : []), ...(gained.length ? [`grants ${gained.join(' ')}`] : [])]
}

/**
 * Every way `after` lets some credential do more than `before` did, in words (empty: nothing
 * widened). A workspace that did not exist before (a sign-up from the internet) is nobody's gain;
 * a new token is allowed only for the caller's user and within the caller's own scopes, life and binding.
 */
function widenings(before: Snapshot, after: Snapshot, caller: Caller): string[] {
  const found: string[] = []
  const existing = (workspace: string | null) => workspace !== null && workspace in before.workspaces
  for (const [id, token] of Object.entries(after.tokens)) {
    const was = before.tokens[id]
    if (was) {
      if (was.revoked && !token.revoked) found.push(`token ${id} is no longer revoked`)
      if (later(token.expires, was.expires)) found.push(`token ${id} lives longer`)
      if (more(token.scopes, was.scopes)) found.push(`token ${id} has more scopes`)
      if (token.kind !== was.kind || token.workspace !== was.workspace || token.app !== was.app || token.user !== was.user)
        found.push(`token ${id} changed kind, user or binding`)
    } else if (!token.revoked && token.user in before.users) {
      const why =
        token.user !== victim.id
          ? `a token of another user (${after.users[token.user].email})`
          : token.kind === 'session'
            ? 'a session'
            : more(token.scopes, caller.scopes)
              ? `a token with more scopes (${token.scopes ?? 'unscoped'})`
              : Date.parse(token.expires) > caller.expiresAt
                ? 'a token living longer'
                : caller.kind === 'app' && (token.workspace !== victimTenant.id || token.app !== app.id)
                  ? 'a token not bound to the caller’s workspace and app'
                  : null
      if (why) found.push(`issued ${why}`)
    }
  }
  for (const [key, access] of Object.entries(after.access))
    if (existing(access.workspace)) for (const gain of accessGained(access, before.access[key])) found.push(`member ${key} gained ${gain}`)
  for (const [id, role] of Object.entries(after.roles))
    if (existing(role.workspace))
      for (const gain of accessGained(role, before.roles[id] ?? { workspace: role.workspace, admin: false, grants: {} }))
        found.push(`role ${id} gained ${gain}`)
  for (const [pair, workspace] of Object.entries(after.teams))
    if (existing(workspace) && !(pair in before.teams)) found.push(`a member joined a team (${pair})`)
  for (const [id, invitation] of Object.entries(after.invitations)) {
    const was = before.invitations[id]
    if (!existing(invitation.workspace) || !invitation.pending) continue
    if (!was) found.push(`a new invitation of ${invitation.email}`)
    else if (!was.pending || later(invitation.expires, was.expires) || invitation.role !== was.role || more(invitation.teams, was.teams))
      found.push(`invitation ${id} widened`)
  }
  for (const [id, registered] of Object.entries(after.apps)) {
    const was = before.apps[id]
    if (!existing(registered.workspace)) continue
    if (!was) found.push(`a new OAuth app ${registered.client}`)
    else if (more(registered.uris, was.uris)) found.push(`OAuth app ${id} has new redirect URIs`)
    else if (registered.confidential !== was.confidential || registered.secret !== was.secret || registered.client !== was.client)
      found.push(`OAuth app ${id} changed its client type, id or secret`)
  }
  for (const [id, grant] of Object.entries(after.grants)) {
    const was = before.grants[id]
    if (!existing(grant.workspace) || grant.revoked) continue
    if (!was) found.push(`a new OAuth grant of app ${grant.app}`)
    else if (was && (was.revoked || more(grant.scopes, was.scopes) || later(grant.expires, was.expires)))
      found.push(`OAuth grant ${id} widened`)
  }
  for (const [id, user] of Object.entries(after.users)) {
    const was = before.users[id]
    if (!was) continue
    if (user.password !== was.password) found.push(`${user.email} has a new password`)
    if ((user.api && !was.api) || (was.suspended && !user.suspended)) found.push(`${user.email} regained access`)
    if (user.last !== was.last) found.push(`${user.email}'s last used workspace moved`)
  }
  return found
}

/** The victim's own tokens and sessions that a call revoked, other than the caller: a part of the user's authority cannot sign the whole out. */
function othersRevoked(before: Snapshot, after: Snapshot, caller: Caller): string[] {
  return Object.entries(after.tokens)
    .filter(([id, token]) => token.revoked && before.tokens[id] && !before.tokens[id].revoked && id !== caller.id)
    .filter(([, token]) => token.user === victim.id && token.kind !== 'oauth')
    .map(([id]) => id)
}

/**
 * Checks what a call left behind: nothing widened, nothing of the victim's revoked but the caller,
 * no credential in the answer that no row stands for; and follows the answer's secrets.
 */
async function checkCall(
  t: Test,
  label: string,
  caller: Caller,
  before: Snapshot,
  answer: { status: number; text: string },
): Promise<Snapshot> {
  const after = await snapshot()
  for (const widening of widenings(before, after, caller)) t.fail(`${label}: answered ${answer.status} and ${widening}`)
  const revoked = othersRevoked(before, after, caller)
  if (revoked.length > 0) t.fail(`${label}: answered ${answer.status} and revoked ${revoked.length} of the victim's credentials`)
  const newTokens = Object.keys(after.tokens).filter((id) => !(id in before.tokens))
  if (/crm_[A-Za-z0-9_-]{43}/.test(answer.text) && newTokens.length === 0)
    t.fail(`${label}: the answer carries a credential that no new row stands for`)
  await followInvitations(t, label, caller, before, answer.text)
  await followRedirectUris(t, label, before, after, answer.text)
  return after
}

/** An invitation's secret in an answer, accepted as a new user: the new user must not get into an existing workspace. */
async function followInvitations(t: Test, label: string, caller: Caller, before: Snapshot, text: string): Promise<void> {
  for (const [secret] of text.matchAll(/inv_[A-Za-z0-9_-]{43}/g)) {
    testWrites++
    const accepted = await server.request('POST', '/api/invitations/accept', {
      body: { token: secret, password: 'a long new password 1', name: 'Newcomer' },
    })
    const chained = await snapshot()
    const users = Object.keys(chained.users).filter((id) => !(id in before.users))
    for (const key of Object.keys(chained.access).filter(
      (key) => !(key in before.access) && users.some((id) => key.endsWith(` ${chained.users[id].email}`)),
    ))
      t.fail(`${label}: its invitation, accepted as a new user (${accepted.status}), gave ${key} access that outlives the caller`)
    for (const widening of widenings(before, chained, caller)) t.fail(`${label}: after accepting its invitation, ${widening}`)
  }
}

/**
 * A redirect URI the call registered (a new app's or an added one), with the victim consenting as
 * anyone might: the authorization code must not reach it.
 */
async function followRedirectUris(t: Test, label: string, before: Snapshot, after: Snapshot, text: string): Promise<void> {
  for (const registered of Object.values(after.apps)) {
    const was = before.apps[Object.keys(after.apps).find((id) => after.apps[id] === registered) ?? '']
    const added = registered.uris.filter((uri) => !was?.uris.includes(uri))
    if (added.length === 0 || !(registered.workspace in before.workspaces)) continue
    testWrites++
    const cookie = await sessionCookie(server, victim.id)
    const location = await consent(server, cookie, {
      client_id: registered.client,
      redirect_uri: added[0],
      scope: 'contacts:read',
      state: 's',
      code_challenge: pkcePair().challenge,
    }).catch((error: Error) => new URL(`about:${encodeURIComponent(error.message)}`))
    if (location.searchParams.get('code') && `${location.origin}${location.pathname}` === added[0].replace(/\?.*$/, ''))
      t.fail(
        `${label}: an authorization code of the victim reached ${added[0]}, which the call registered${/crmsec_/.test(text) ? ' (with its client secret in the answer)' : ''}`,
      )
  }
}

/** A fresh invitation of the victim's email to the attacker's workspace: its secret (null once an accept let them in). */
async function invitationForVictim(): Promise<string | null> {
  testWrites++
  const invited = await server.request('POST', '/api/invitations', { token: attacker, body: { email: victim.email, role: 'admin' } })
  if (invited.status !== 201) return null
  return new URL(invited.body.data.accept_url).searchParams.get('token')!
}

t.test('every route that touches a credential declares who may call it, and the OpenAPI document says so', async (t) => {
  const undeclared = { method: 'POST', path: '/api/sessions/extend', summary: 'x', tag: 'auth', auth: 'required', scope: 'none' } as const
  const handler = async () => {}
  t.throws(
    () => assertCredentialsDeclared([{ ...undeclared, response: Type.Object({ token: Type.String() }), handler }]),
    /POST \/api\/sessions\/extend/,
    'a new route answering with a token must declare its credentials',
  )
  t.doesNotThrow(() => assertCredentialsDeclared([{ ...undeclared, credentials: 'unscoped', handler }]))
  t.doesNotThrow(() => assertCredentialsDeclared(allRoutes()))
  const document = (await server.request('GET', '/api/openapi.json')).body
  t.equal(document.paths['/api/tokens'].post['x-credentials'], 'unscoped')
  t.equal(document.paths['/api/tokens'].delete['x-credentials'], 'self')
  t.equal(document.paths['/api/invitations/accept'].post['x-credentials'], 'unscoped')
  t.equal(document.paths['/api/invitations'].post['x-credentials'], 'unscoped')
  t.equal(document.paths['/api/oauth-apps'].post['x-credentials'], 'unscoped')
})

t.test('the invitation attack: a scoped or app token of the victim accepts nothing and gets no token', async (t) => {
  for (const kind of ['scoped', 'app'] as const) {
    const caller = await newCaller(kind)
    const secret = await invitationForVictim()
    t.ok(secret, 'the attacker invites the victim')
    const before = await snapshot()
    const accepted = await server.request('POST', '/api/invitations/accept', { token: caller.token, body: { token: secret } })
    t.equal(accepted.status, 403, `${kind}: ${accepted.text}`)
    t.equal(accepted.body.code, 'forbidden')
    t.match(accepted.body.detail, /unscoped personal token/)
    t.notOk('token' in (accepted.body ?? {}), 'no token in the answer')
    t.same(await checkCall(t, kind, caller, before, accepted), before, `${kind}: nothing changed`)
    // The slug-less write the attack went on to make has no token to make it with; the caller's own is still read-only.
    const write = await server.request('POST', '/api/contacts', {
      token: caller.token,
      headers: { 'x-tenant-slug': 'victim-co' },
      body: { first_name: 'Planted' },
    })
    t.equal(write.status, 403, `${kind}: the caller still cannot write`)
  }
  t.equal((await owner.query('select count(*)::int as n from crm.contacts where workspace_id = $1', [victimTenant.id])).rows[0].n, 1)
})

t.test('workspace:admin alone: reads and narrows, and every widening write is 403 forbidden', async (t) => {
  for (const kind of ['scoped', 'app'] as const) {
    const caller = await newCaller(kind, ['workspace:admin'])
    const call = (method: string, path: string, body?: unknown) => server.request(method, path, { token: caller.token, body })
    const widening: [string, string, unknown][] = [
      ['POST', '/api/invitations', { email: 'newcomer@attacker.test', role: 'admin' }],
      ['POST', '/api/invitations', { email: 'newcomer@attacker.test', role: 'read_only' }],
      ['PATCH', `/api/members/${mia.id}`, { role: 'admin' }],
      ['PATCH', `/api/members/${mia.id}`, { teams: ['east', 'west'] }],
      ['POST', `/api/members/${sam.id}/unsuspend`, undefined],
      ['POST', '/api/roles', { name: 'boss', is_admin: true }],
      ['POST', '/api/roles', { name: 'wide', grants: ['deals:view:all'] }],
      ['PATCH', `/api/roles/${fixture.closer}`, { grants: ['deals:view:all', 'deals:update:own'] }],
      ['PATCH', `/api/roles/${fixture.closer}`, { is_admin: true }],
      ['POST', '/api/oauth-apps', { name: 'Evil', redirect_uris: ['https://evil.example/cb'] }],
      ['PATCH', `/api/oauth-apps/${otherApp.id}`, { redirect_uris: [...otherApp.redirect_uris, 'https://evil.example/cb'] }],
    ]
    for (const [method, path, body] of widening) {
      const before = await snapshot()
      const answer = await call(method, path, body)
      t.equal(answer.status, 403, `${kind} ${method} ${path} ${JSON.stringify(body)}: ${answer.text}`)
      t.equal(answer.body.code, 'forbidden')
      t.match(answer.body.detail, /unscoped (session or personal token|personal token or a browser session)/)
      t.same(await checkCall(t, `${kind} ${method} ${path}`, caller, before, answer), before, 'nothing changed')
    }
    const narrowing: [string, string, unknown, number][] = [
      ['GET', '/api/members', undefined, 200],
      ['GET', '/api/invitations', undefined, 200],
      ['PATCH', `/api/members/${mia.id}`, { role: 'read_only', teams: [] }, 200],
      ['PATCH', `/api/roles/${fixture.closer}`, { grants: ['deals:view:own'] }, 200],
      ['PATCH', `/api/oauth-apps/${otherApp.id}`, { name: 'Calendar' }, 200],
      ['POST', `/api/members/${mia.id}/suspend`, undefined, 200],
      ['DELETE', `/api/invitations/${fixture.invitation}`, undefined, 204],
      ['DELETE', `/api/oauth-apps/${otherApp.id}/connections`, undefined, 204],
    ]
    for (const [method, path, body, status] of narrowing) {
      const before = await snapshot()
      const answer = await call(method, path, body)
      t.equal(answer.status, status, `${kind} ${method} ${path}: ${answer.text.slice(0, 200)}`)
      await checkCall(t, `${kind} ${method} ${path}`, caller, before, answer)
    }
    await restore()
  }
})

t.test('an unscoped personal token accepts; the new token lives no longer than it, and the default workspace stays', async (t) => {
  const other = await createTenant(url, { slug: 'invited-co', members: { 'boss@invited.test': 'admin' } })
  const target = await createTenant(url, { slug: 'home-co', members: { 'joe@home.test': 'member' } })
  const joe = target.members['joe@home.test']
  await owner.query('update crm.users set last_workspace_id = $1 where id = $2', [target.id, joe.id])
  const invited = await server.request('POST', '/api/invitations', {
    token: other.members['boss@invited.test'].token,
    body: { email: joe.email, role: 'member' },
  })
  const secret = new URL(invited.body.data.accept_url).searchParams.get('token')!
  const bearer = await mintToken(owner, joe.id, { ttl: '2 hours' })
  const accepted = await server.request('POST', '/api/invitations/accept', { token: bearer, body: { token: secret } })
  t.equal(accepted.status, 200, accepted.text)
  const bearerExpiry = (await owner.query('select expires_at from crm.tokens where token_hash = $1', [hashToken(bearer)])).rows[0]
    .expires_at
  t.ok(Date.parse(accepted.body.expires_at) <= bearerExpiry.getTime(), 'the new token expires no later than the bearer')
  const {
    rows: [issued],
  } = await owner.query('select kind, scopes from crm.tokens where id = $1', [accepted.body.token_id])
  t.same(issued, { kind: 'token', scopes: null })
  t.equal((await owner.query('select last_workspace_id from crm.users where id = $1', [joe.id])).rows[0].last_workspace_id, target.id)
  t.equal((await server.request('GET', '/api/me', { token: bearer })).body.data.workspace.slug, 'home-co', 'slug-less calls stay home')
})

/** The victim's browser session, aimed at by the token routes (made by the route test). */
const sessionTarget: string[] = []

/** The objects a path's parameters may name, by the path's first segments: what an attacker would aim at there. */
function targetsOf(path: string, caller: Caller): string[] {
  const [, , area, sub] = path.split('/')
  if (sub === 'import') return [randomUUID()]
  switch (area) {
    case 'tokens':
      return [caller.id, ...sessionTarget]
    case 'contacts':
      return [fixture.contact]
    case 'companies':
      return [fixture.company]
    case 'deals':
      return [fixture.deal]
    case 'associations':
      return [{ contacts: fixture.contact, companies: fixture.company, deals: fixture.deal }[sub] ?? randomUUID()]
    case 'webhook-subscriptions':
      return [subscriptionId]
    case 'invitations':
      return [fixture.invitation]
    case 'members':
      return [mia.id, sam.id, victim.id]
    case 'roles':
      return [fixture.closer, fixture.member]
    case 'teams':
      return [fixture.east]
    case 'oauth-apps':
      return [app.id, otherApp.id]
    default:
      // A new area: every object above, so that its route is aimed at something real.
      return [caller.id, fixture.contact, fixture.closer, fixture.east, fixture.invitation, app.id, mia.id]
  }
}

/** Every way to fill a path's parameters (a read changes nothing it could aim at: its first target is enough). */
function parameterChoices(definition: RouteDefinition, caller: Caller): Record<string, string>[] {
  const names = [...definition.path.matchAll(/:([a-z_]+)/g)].map((match) => match[1])
  if (names.length === 0) return [{}]
  const targets = targetsOf(definition.path, caller)
  return (definition.method === 'GET' ? targets.slice(0, 1) : targets).map((target) =>
    Object.fromEntries(names.map((name, index) => [name, index === 0 ? target : randomUUID()])),
  )
}

const ALL_GRANTS = ['contacts', 'companies', 'deals'].flatMap((resource) =>
  ['view', 'create', 'update', 'delete', 'import', 'export'].map((action) => `${resource}:${action}:all`),
)

/** Bodies worth sending: the documented example, an empty one, and those of the widening attacks on this path. */
async function bodyChoices(t: Test, definition: RouteDefinition, caller: Caller): Promise<unknown[]> {
  const { method, path } = definition
  if (path === '/api/invitations/accept') {
    const secret = await invitationForVictim()
    if (secret === null) t.fail('the victim cannot be invited again: an earlier accept let them into the workspace')
    return [{ token: secret ?? 'inv_none' }]
  }
  const bodies: unknown[] = [definition.example?.request ?? {}]
  if (!definition.body && !definition.formBody) return bodies
  if (method !== 'POST' || !definition.example) bodies.push({})
  if (path === '/api/tokens' && method === 'POST')
    bodies.push(
      { name: 'Within', scopes: caller.scopes, expires_in_days: 1 },
      { name: 'Long', scopes: caller.scopes, expires_in_days: 365 },
    )
  if (path === '/api/invitations' && method === 'POST') bodies.push({ email: 'newcomer@attacker.test', role: 'admin' })
  if (path === '/api/members/:user_id') bodies.push({ role: 'admin' }, { role: 'closer' }, { teams: ['east', 'west'] })
  if (path === '/api/roles') bodies.push({ name: 'boss', is_admin: true })
  if (path === '/api/roles/:id') bodies.push({ is_admin: true }, { grants: ALL_GRANTS }, { grants: ['deals:view:own'] })
  if (path === '/api/oauth-apps/:id') bodies.push({ redirect_uris: ['https://evil.example/cb'] }, { name: 'Renamed' })
  return bodies
}

function pathOf(definition: RouteDefinition, parameters: Record<string, string>): string {
  return definition.path.replace(/:([a-z_]+)/g, (_, name: string) => parameters[name])
}

/** The slot's caller, minted again when a call revoked or removed it. */
async function callerOf(slot: (typeof slots)[number]): Promise<Caller> {
  const live = slot.caller
    ? (await owner.query('select 1 from crm.tokens where id = $1 and revoked_at is null', [slot.caller.id])).rowCount === 1
    : false
  if (!live) slot.caller = await newCaller(slot.kind, slot.scopes)
  return slot.caller as Caller
}

t.test('every route, called by an admin with a token of each scope, of all scopes and an app token of each, widens nothing', async (t) => {
  const routes = allRoutes()
  t.ok(routes.length > 100, `${routes.length} routes`)
  const session = await mintToken(owner, victim.id, { kind: 'session' })
  sessionTarget.push((await owner.query('select id from crm.tokens where token_hash = $1', [hashToken(session)])).rows[0].id)
  await owner.query('insert into fixture_tokens select id from crm.tokens where id = $1', [sessionTarget[0]])
  let calls = 0
  let refusals = 0
  let widest = 0
  let unchanged: { state: Snapshot; writes: number } | null = null
  for (const definition of routes) {
    // A route that reads no bearer answers every caller alike: a personal token and an app's token are enough.
    for (const slot of definition.credentials === 'anonymous' ? slots.slice(0, 2) : slots) {
      let refusedBeforeHandler = false
      const choices = parameterChoices(definition, await callerOf(slot)).length
      for (let choice = 0; choice < choices && !refusedBeforeHandler; choice++) {
        for (const body of await bodyChoices(t, definition, await callerOf(slot))) {
          // A caller revoked or removed by the previous call is minted again, and the parameters aimed at it follow.
          const caller = await callerOf(slot)
          const parameters = parameterChoices(definition, caller)[choice]
          const label = `${slot.label} ${definition.method} ${definition.path} ${JSON.stringify(parameters)} ${JSON.stringify(body).slice(0, 80)}`
          const before: Snapshot = unchanged?.writes === testWrites ? unchanged.state : await snapshot()
          const writes = testWrites
          const answer = await server.request(definition.method, pathOf(definition, parameters), {
            token: caller.token,
            ...(definition.body || definition.formBody ? { body } : {}),
          })
          calls++
          if (answer.status >= 500 || answer.status === 429) t.fail(`${label}: ${answer.status} ${answer.text.slice(0, 200)}`)
          const after = await checkCall(t, label, caller, before, answer)
          const changed: boolean = JSON.stringify(after) !== JSON.stringify(before)
          if (answer.status === 401 || answer.status === 403) {
            refusals++
            if (changed) t.same(after, before, `${label}: a ${answer.status} changed state`)
            // The route's scope is checked before anything else: every other parameter and body gets the same answer.
            if (answer.body?.code === 'insufficient_scope') refusedBeforeHandler = true
          } else if (answer.status < 300 && slot.scopes.length > 1) widest++
          if (changed) await restore()
          unchanged = changed || writes !== testWrites ? null : { state: after, writes }
          if (refusedBeforeHandler) break
        }
      }
    }
  }
  t.ok(calls > 1000, `${calls} calls, ${refusals} refused with 401 or 403, ${widest} answered 2xx to a token of all scopes`)
})

t.test('UI pages take a browser session only: a scoped or app token in the cookie is signed out', async (t) => {
  for (const kind of ['scoped', 'app'] as const) {
    const caller = await newCaller(kind)
    const cookie = `crm_session=${caller.token}`
    const page = await fetch(`${server.url}/security`, { redirect: 'manual', headers: { cookie } })
    t.equal(page.status, 303, `${kind}: /security`)
    t.match(page.headers.get('location'), /^\/sign-in/)
    // The consent page would otherwise let an app's token allow the same app wider scopes.
    const consent = await fetch(
      `${server.url}/oauth/authorize?${new URLSearchParams({
        response_type: 'code',
        client_id: app.client_id,
        redirect_uri: app.redirect_uris[0],
        scope: 'workspace:admin contacts:write',
        state: 's',
        code_challenge: 'E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM',
        code_challenge_method: 'S256',
      })}`,
      { redirect: 'manual', headers: { cookie } },
    )
    t.not(consent.status, 200, `${kind}: no consent page`)
    t.match(consent.headers.get('location') ?? '', /^\/sign-in/)
  }
  const session = await sessionCookie(server, victim.id)
  t.equal((await fetch(`${server.url}/security`, { redirect: 'manual', headers: { cookie: session } })).status, 200, 'a session may')
})

t.test('turning two-factor off needs a code not used yet', async (t) => {
  const tenant = await createTenant(url, { slug: 'totp-co', members: { 'tess@totp.test': 'member' } })
  const tess = tenant.members['tess@totp.test']
  await setPassword(url, tess.email, PASSWORD)
  const enabled = crm(url, ['user', 'totp', 'enable', '--email', tess.email, '--json'])
  t.equal(enabled.status, 0, enabled.stderr)
  const secret = enabled.json.secret as string
  const codeAt = (offsetSeconds: number) => generateSync({ secret, epoch: Math.floor(Date.now() / 1000) + offsetSeconds })

  // Tess signs in with a code; whoever watched her type it tries it on her open session.
  const code = codeAt(0)
  const challenge = await server.request('POST', '/api/token', { body: { email: tess.email, password: PASSWORD, device_name: 'laptop' } })
  const signedIn = await server.request('POST', '/api/token/2fa-challenge', {
    body: { challenge_token: challenge.body.challenge_token, code },
  })
  t.equal(signedIn.status, 200, signedIn.text)

  const cookie = await sessionCookie(server, tess.id)
  const page = await fetch(`${server.url}/security`, { headers: { cookie } })
  const csrf = /name="csrf" value="([^"]+)"/.exec(await page.text())?.[1] ?? ''
  const turnOff = (value: string) =>
    fetch(`${server.url}/security/two-factor/disable`, {
      method: 'POST',
      redirect: 'manual',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ csrf, code: value }).toString(),
    })
  const isOn = async () =>
    (await owner.query('select confirmed_at is not null as on from crm.user_totp where user_id = $1', [tess.id])).rows[0]?.on === true

  const reused = await turnOff(code)
  t.equal(reused.status, 422, 'the code used at sign-in is refused')
  t.match(await reused.text(), /used already/)
  t.ok(await isOn(), 'two-factor is still on')

  // The next step's code (within the ±1 step drift) is new: it turns two-factor off, once.
  const next = codeAt(30)
  const off = await turnOff(next)
  t.equal(off.status, 303)
  t.match(off.headers.get('location'), /two-factor-off/)
  t.notOk(await isOn(), 'two-factor is off')

  // Turning it on uses up its code too: the confirming code cannot turn it off again.
  const form = (path: string, fields: Record<string, string> = {}) =>
    fetch(`${server.url}${path}`, {
      method: 'POST',
      redirect: 'manual',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ csrf, ...fields }).toString(),
    })
  t.equal((await form('/security/two-factor/start')).status, 303)
  const enrolment = await (await fetch(`${server.url}/security/two-factor`, { headers: { cookie } })).text()
  const newSecret = /id="totp-secret">([^<]+)</.exec(enrolment)?.[1].replace(/\s+/g, '') ?? ''
  const confirming = generateSync({ secret: newSecret, epoch: Math.floor(Date.now() / 1000) })
  t.equal((await form('/security/two-factor/confirm', { code: confirming })).status, 303)
  t.ok(await isOn(), 'two-factor is on again')
  const again = await turnOff(confirming)
  t.equal(again.status, 422, 'the code that turned it on is refused')
  t.ok(await isOn(), 'two-factor is still on')
})

t.test('SQL: a revoked token or grant stays revoked, for its user as crm_api and for the owner', async (t) => {
  const token = await mintToken(owner, victim.id, { ttl: '1 day' })
  const appToken = await mintToken(owner, victim.id, {
    kind: 'oauth',
    scopes: ['contacts:read'],
    workspaceId: victimTenant.id,
    oauthAppId: otherApp.id,
  })
  const {
    rows: [ids],
  } = await owner.query(
    `select (select id from crm.tokens where token_hash = $1) as token, (select oauth_grant_id from crm.tokens where token_hash = $2) as grant`,
    [hashToken(token), hashToken(appToken)],
  )
  await owner.query('update crm.tokens set revoked_at = now() where id = $1', [ids.token])
  await owner.query('update crm.oauth_grants set revoked_at = now() where id = $1', [ids.grant])

  const refusal = async (client: pg.Client, statement: string, values: unknown[]) => {
    await client.query('savepoint probe')
    try {
      const result = await client.query(statement, values)
      return `updated ${result.rowCount}`
    } catch (error) {
      return (error as { code?: string }).code
    } finally {
      await client.query('rollback to savepoint probe')
    }
  }
  await owner.query('begin')
  try {
    await owner.query(`select crm.act_as($1, 'victim-co')`, [victim.email])
    t.equal((await owner.query('select current_user as role')).rows[0].role, 'crm_api')
    t.equal(await refusal(owner, 'update crm.tokens set revoked_at = null where id = $1', [ids.token]), 'CR409', 'the token as its user')
    t.equal(
      await refusal(owner, 'update crm.oauth_grants set revoked_at = null where id = $1', [ids.grant]),
      'CR409',
      'the grant as its user',
    )
    t.equal(
      await refusal(owner, 'update crm.tokens set revoked_at = now() where id = $1', [ids.token]),
      'updated 1',
      'revoking again is no undo',
    )
  } finally {
    await owner.query('rollback')
  }
  await owner.query('begin')
  try {
    t.equal(await refusal(owner, 'update crm.tokens set revoked_at = null where id = $1', [ids.token]), 'CR409', 'nor the owner')
    t.equal(await refusal(owner, 'update crm.oauth_grants set revoked_at = null where id = $1', [ids.grant]), 'CR409')
  } finally {
    await owner.query('rollback')
  }
  const revoked = await server.request('GET', '/api/me', { token })
  t.equal(revoked.status, 401)
})
