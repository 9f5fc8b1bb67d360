// Credentials never widen (API.md section 4a: scopes narrow a token, never widen it). A scoped
// token or an OAuth app's access token must never yield a credential with more scopes, a longer
// life, another workspace or none of its binding, nor a membership, nor move the user's default
// workspace. Checked for the invitation attack by hand, then for every route of the route table
// with both kinds of token (new routes are covered without anyone listing them), and in SQL for
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
import { registerApp, sessionCookie } from '../oauth/helpers.ts'
import { setPassword } from '../ui/browser.ts'

const PASSWORD = 'correct horse battery'
// The loop below calls every route as one user about 600 times (48 s measured on two cores at a load
// average of 10 to 13): more time than the default, and no rate limit, which has its own tests.
t.setTimeout(360_000)
const server = await startTestServer(t, { env: { RATE_LIMIT_PER_MINUTE: '1000000' } })
const url = server.databaseUrl
const owner = await ownerClient(t, url)

// The victim administers workspace V, which they used last; their integrations call without a slug.
const victimTenant = await createTenant(url, { slug: 'victim-co', members: { 'vic@victim.test': 'admin' } })
const victim = victimTenant.members['vic@victim.test']
await owner.query('update crm.users set last_workspace_id = $1 where id = $2', [victimTenant.id, victim.id])
const app = await registerApp(server, victim.token, { name: 'Mail merge' })
const otherApp = await registerApp(server, victim.token, { name: 'Calendar sync' })
const {
  rows: [contact],
} = await owner.query(`insert into crm.contacts (workspace_id, owner_id, first_name) values ($1, $2, 'Kept') returning id`, [
  victimTenant.id,
  victim.id,
])

// The attacker signs up from the internet: workspace B.
const signedUp = await server.request('POST', '/api/signup', {
  body: { email: 'mallory@attacker.test', password: PASSWORD, name: 'Mallory', workspace_name: 'Attacker' },
})
if (signedUp.status !== 201) throw new Error(`sign-up answered ${signedUp.status}: ${signedUp.text}`)
const attacker = signedUp.body.token as string

/** A fresh invitation of the victim's email to the attacker's workspace: its secret (null once an accept let them in). */
async function invitationForVictim(): Promise<string | null> {
  const invited = await server.request('POST', '/api/invitations', { token: attacker, body: { email: victim.email, role: 'admin' } })
  if (invited.status !== 201) return null
  return new URL(invited.body.data.accept_url).searchParams.get('token')!
}

type Caller = { kind: 'scoped' | 'app'; token: string; id: string; grantId: string | null; expiresAt: Date; scopes: string[] }
const MINIMAL = ['contacts:read']

/** Removes a caller's token (and an app token's grant), so the snapshots stay small however many calls run. */
async function forget(caller: Pick<Caller, 'id' | 'grantId'>): Promise<void> {
  await owner.query('delete from crm.tokens where id = $1', [caller.id])
  if (caller.grantId) await owner.query('delete from crm.oauth_grants where id = $1', [caller.grantId])
}

async function newCaller(kind: Caller['kind']): Promise<Caller> {
  const token = await mintToken(
    owner,
    victim.id,
    kind === 'scoped'
      ? { scopes: MINIMAL }
      : { kind: 'oauth', scopes: MINIMAL, workspaceId: victimTenant.id, oauthAppId: app.id, ttl: '1 hour' },
  )
  const {
    rows: [row],
  } = await owner.query('select id, oauth_grant_id, expires_at from crm.tokens where token_hash = $1', [hashToken(token)])
  return { kind, token, id: row.id, grantId: row.oauth_grant_id, expiresAt: row.expires_at, scopes: MINIMAL }
}

/** What a request could change about credentials, access and records, as comparable JSON (one round trip). */
async function snapshot(): Promise<Snapshot> {
  const { rows } = await owner.query(`select json_build_object(
    'tokens', coalesce((select json_agg(json_build_object('id', id, 'user_id', user_id, 'kind', kind, 'revoked_at', revoked_at,
                                        'expires_at', expires_at, 'scopes', scopes, 'workspace_id', workspace_id,
                                        'oauth_app_id', oauth_app_id, 'grant', oauth_grant_id) order by id) from crm.tokens), '[]'),
    'grants', coalesce((select json_agg(json_build_object('id', id, 'user_id', user_id, 'revoked_at', revoked_at, 'scopes', scopes,
                                        'expires_at', expires_at) order by id) from crm.oauth_grants), '[]'),
    'memberships', (select json_agg(json_build_object('w', workspace_id, 'u', user_id, 'role', role_id, 'suspended', suspended_at)
                                    order by workspace_id, user_id) from crm.memberships),
    'users', (select json_agg(json_build_object('id', id, 'last', last_workspace_id, 'api', api_access, 'suspended', suspended_at,
                                                'password', password_hash) order by id) from crm.users),
    'invitations', (select json_agg(json_build_object('id', id, 'accepted', accepted_at) order by id) from crm.invitations),
    'totp', (select json_agg(json_build_object('u', user_id, 'confirmed', confirmed_at, 'step', last_used_step) order by user_id) from crm.user_totp),
    'apps', (select json_agg(json_build_object('id', id, 'name', name, 'secret', client_secret_hash, 'uris', redirect_uris) order by id)
               from crm.oauth_apps),
    'roles', (select json_agg(json_build_object('id', id, 'name', name, 'admin', is_admin) order by id) from crm.roles),
    'grants_of_roles', (select count(*) from crm.role_grants),
    'teams', (select json_agg(json_build_object('id', id, 'name', name) order by id) from crm.teams),
    'records', (select json_agg(r.v order by r.v) from (
                  select 'contact ' || id || ' ' || updated_at as v from crm.contacts
                  union all select 'company ' || id || ' ' || updated_at from crm.companies
                  union all select 'deal ' || id || ' ' || updated_at from crm.deals) r),
    'webhooks', (select json_agg(json_build_object('id', id, 'status', status, 'updated', updated_at) order by id)
                   from crm.webhook_subscriptions),
    'imports', (select count(*) from crm.imports)
  ) as state`)
  return rows[0].state
}

type TokenRow = {
  id: string
  user_id: string
  kind: string
  revoked_at: string | null
  scopes: string[] | null
  expires_at: string
  workspace_id: string | null
  oauth_app_id: string | null
  grant: string | null
}
type Snapshot = {
  tokens: TokenRow[]
  grants: { id: string; user_id: string; revoked_at: string | null }[]
  memberships: { w: string; u: string }[]
  users: { id: string; last: string | null }[]
  [table: string]: unknown
}

/** Why a credential of the victim is wider than the caller's, or null when it is within it. */
function widerThan(row: TokenRow, caller: Caller): string | null {
  if (row.kind === 'session') return 'a session'
  if (row.scopes === null) return 'unscoped'
  const extra = row.scopes.filter((scope) => !caller.scopes.includes(scope))
  if (extra.length > 0) return `more scopes: ${extra.join(' ')}`
  if (Date.parse(row.expires_at) > caller.expiresAt.getTime()) return `a longer life (${row.expires_at})`
  if (caller.kind === 'app' && (row.workspace_id !== victimTenant.id || row.oauth_app_id !== app.id))
    return 'not bound to the caller’s workspace and app'
  return null
}

/**
 * Checks what a call left behind for the victim: no wider credential (in the database or in the
 * answer), no membership, the same default workspace, and nothing revoked but the caller itself (a
 * part of the user's authority cannot sign the user out of everything).
 */
function assertNothingWider(
  t: Test,
  label: string,
  caller: Caller,
  before: Snapshot,
  after: Snapshot,
  answer: { status: number; text: string },
) {
  const known = new Set(before.tokens.map((token) => token.id))
  for (const row of after.tokens.filter((token) => token.user_id === victim.id && !known.has(token.id))) {
    const why = widerThan(row, caller)
    if (why) t.fail(`${label}: answered ${answer.status} and issued a credential wider than the caller's: ${why}`)
  }
  // A credential in the answer is a new row above, or of somebody else (a sign-up's new user), or unknown.
  if (/crm_[A-Za-z0-9_-]{43}/.test(answer.text) && !after.tokens.some((token) => !known.has(token.id)))
    t.fail(`${label}: the answer carries a credential that no new row stands for`)
  const revokedBefore = new Set([...before.tokens, ...before.grants].filter((row) => row.revoked_at !== null).map((row) => row.id))
  const others = [...after.tokens, ...after.grants.map((grant) => ({ ...grant, grant: grant.id }))].filter(
    (row) =>
      row.revoked_at !== null &&
      !revokedBefore.has(row.id) &&
      row.id !== caller.id &&
      (caller.grantId === null || row.grant !== caller.grantId),
  )
  if (others.length > 0)
    t.fail(`${label}: answered ${answer.status} and revoked ${others.length} credentials that are not the caller's own`)
  if (after.memberships.filter((membership) => membership.u === victim.id).length !== 1)
    t.fail(`${label}: answered ${answer.status} and the victim joined another workspace`)
  if (after.users.find((user) => user.id === victim.id)?.last !== victimTenant.id)
    t.fail(`${label}: answered ${answer.status} and moved the last used workspace`)
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
    const after = await snapshot()
    t.same(after, before, `${kind}: nothing changed (no token, no membership, the invitation still open, the same default)`)
    assertNothingWider(t, kind, caller, before, after, accepted)
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

/** Every way to fill a path's parameters: the credentials and records an attacker would aim at. */
async function parameterChoices(definition: RouteDefinition, caller: Caller): Promise<Record<string, string>[]> {
  const names = [...definition.path.matchAll(/:([a-z_]+)/g)].map((match) => match[1])
  if (names.length === 0) return [{}]
  const session = await mintToken(owner, victim.id, { kind: 'session' })
  const otherGrant = await mintToken(owner, victim.id, {
    kind: 'oauth',
    scopes: ['contacts:read', 'deals:write'],
    workspaceId: victimTenant.id,
    oauthAppId: otherApp.id,
  })
  const {
    rows: [ids],
  } = await owner.query(
    `select (select id from crm.tokens where token_hash = $1) as session,
            (select oauth_grant_id from crm.tokens where token_hash = $2) as grant`,
    [hashToken(session), hashToken(otherGrant)],
  )
  // A read changes nothing it could aim at: its own token and a record are enough to reach its handler.
  const ofId = definition.method === 'GET' ? [caller.id, contact.id] : [caller.id, ids.session, ids.grant, app.id, contact.id]
  return ofId.map((id) =>
    Object.fromEntries(names.map((name) => [name, name === 'id' ? id : name === 'user_id' ? victim.id : randomUUID()])),
  )
}

/** Bodies worth sending: the documented example, an empty one, and for the invitation a real secret of the attack. */
async function bodyChoices(t: Test, definition: RouteDefinition, caller: Caller): Promise<unknown[]> {
  if (definition.path === '/api/invitations/accept') {
    const secret = await invitationForVictim()
    if (secret === null) t.fail('the victim cannot be invited again: an earlier accept let them into the workspace')
    return [{ token: secret ?? 'inv_none' }]
  }
  const bodies: unknown[] = [definition.example?.request ?? {}]
  if (definition.path === '/api/tokens' && definition.method === 'POST')
    bodies.push(
      { name: 'Within', scopes: caller.scopes, expires_in_days: 1 },
      { name: 'Long', scopes: caller.scopes, expires_in_days: 365 },
    )
  return bodies
}

function pathOf(definition: RouteDefinition, parameters: Record<string, string>): string {
  return definition.path.replace(/:([a-z_]+)/g, (_, name: string) => parameters[name])
}

t.test('every route, called with a minimal scoped token and with an app token, widens nothing', async (t) => {
  const routes = allRoutes()
  t.ok(routes.length > 100, `${routes.length} routes`)
  let calls = 0
  let refusals = 0
  const { rows: baseline } = await owner.query('select array_agg(id) as ids from crm.tokens where user_id = $1', [victim.id])
  for (const definition of routes) {
    for (const kind of ['scoped', 'app'] as const) {
      // What the previous route left of the victim's (its targets, tokens it issued) goes, so each snapshot stays small.
      await owner.query('delete from crm.tokens where user_id = $1 and id <> all($2)', [victim.id, baseline[0].ids])
      await owner.query(
        'delete from crm.oauth_grants g where user_id = $1 and not exists (select from crm.tokens t where t.oauth_grant_id = g.id)',
        [victim.id],
      )
      const probe = await newCaller(kind)
      for (const parameters of await parameterChoices(definition, probe)) {
        for (const body of await bodyChoices(t, definition, probe)) {
          // A fresh caller per call: a call that revokes its own token must not decide the next one.
          const caller = await newCaller(kind)
          const chosen = Object.fromEntries(
            Object.entries(parameters).map(([name, value]) => [name, value === probe.id ? caller.id : value]),
          )
          const label = `${kind} ${definition.method} ${definition.path} ${JSON.stringify(chosen)} ${JSON.stringify(body).slice(0, 80)}`
          const before = await snapshot()
          const answer = await server.request(definition.method, pathOf(definition, chosen), {
            token: caller.token,
            ...(definition.body || definition.formBody ? { body } : {}),
          })
          calls++
          if (answer.status >= 500 || answer.status === 429) t.fail(`${label}: ${answer.status} ${answer.text.slice(0, 200)}`)
          const after = await snapshot()
          assertNothingWider(t, label, caller, before, after, answer)
          if (answer.status === 401 || answer.status === 403) {
            refusals++
            if (JSON.stringify(after) !== JSON.stringify(before)) t.same(after, before, `${label}: a ${answer.status} changed state`)
          }
          await forget(caller)
        }
      }
    }
  }
  t.ok(calls > 400, `${calls} calls, ${refusals} refused with 401 or 403`)
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
