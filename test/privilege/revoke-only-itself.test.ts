// A scoped token revokes only itself, and an app's access token only its own authorization, by the
// database's word (sql/definitions/20_tenancy_and_access.sql), not only the route's: as crm_api, after the
// request's authentication, `update crm.tokens set revoked_at = now()` and the same on
// crm.oauth_grants touch no other row. Tried for every kind of caller and any scopes, through both
// ways a request authenticates (crm.authenticate, crm.resume_identity), on both carriers of the
// context (the parameter, the keyed proof).
import fc from 'fast-check'
import pg from 'pg'
import t from 'tap'
import { PERSONAL_TOKEN_SCOPES, TOKEN_SCOPES } from '../../src/auth/scopes.ts'
import { hashToken } from '../../src/auth/tokens.ts'
import { migrate } from '../../src/db/migrate.ts'
import { ensureRuntimeRole } from '../../src/db/runtime-role.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { createTenant, mintToken } from '../helpers/fixtures.ts'
import { TEST_APP_SECRET } from '../helpers/server.ts'

const url = await createTestDatabase(t)
const tenant = await createTenant(url, { slug: 'revoke', members: { 'ada@revoke.test': 'admin', 'bob@revoke.test': 'member' } })
const users = [tenant.members['ada@revoke.test'], tenant.members['bob@revoke.test']]

const connect = async (connectionString: string) => {
  const client = new pg.Client({ connectionString })
  await client.connect()
  t.teardown(() => client.end())
  return client
}
const owner = await connect(url)
const runtime = await connect(await ensureRuntimeRole(url, TEST_APP_SECRET))
const {
  rows: [app],
} = await owner.query(
  `insert into crm.oauth_apps (workspace_id, name, client_id, redirect_uris, confidential)
   values ($1, 'Mail merge', 'crmapp_abcdefghijklmnopqrstuv', '{https://mailmerge.example/callback}', false) returning id`,
  [tenant.id],
)

type Kind = 'unscoped' | 'session' | 'scoped' | 'app'
type Caller = { kind: Kind; userIndex: number; scopes: string[]; resumed: boolean }

const tokenId = async (token: string) =>
  (await owner.query('select id, oauth_grant_id from crm.tokens where token_hash = $1', [hashToken(token)])).rows[0] as {
    id: string
    oauth_grant_id: string | null
  }
const ids = async (text: string, values: unknown[]) => (await owner.query(text, values)).rows.map((row) => row.id as string).sort()

/** Every user gets an unscoped token, a session, a scoped token and an app's token (its own grant) besides the caller. */
async function population(): Promise<void> {
  await owner.query('delete from crm.tokens where user_id = any($1)', [users.map((user) => user.id)])
  await owner.query('delete from crm.oauth_grants where workspace_id = $1', [tenant.id])
  for (const user of users) {
    await mintToken(owner, user.id)
    await mintToken(owner, user.id, { kind: 'session' })
    await mintToken(owner, user.id, { scopes: ['deals:read'] })
    await mintToken(owner, user.id, { kind: 'oauth', scopes: ['contacts:read'], workspaceId: tenant.id, oauthAppId: app.id })
  }
}

/** The caller's token; an app's token gets a second access token under its grant, which is its own authorization too. */
async function callerToken(caller: Caller): Promise<string> {
  const user = users[caller.userIndex]
  if (caller.kind === 'unscoped') return mintToken(owner, user.id)
  if (caller.kind === 'session') return mintToken(owner, user.id, { kind: 'session' })
  if (caller.kind === 'scoped') return mintToken(owner, user.id, { scopes: caller.scopes })
  const token = await mintToken(owner, user.id, { kind: 'oauth', scopes: caller.scopes, workspaceId: tenant.id, oauthAppId: app.id })
  const { oauth_grant_id } = await tokenId(token)
  await owner.query(
    `insert into crm.tokens (user_id, kind, name, token_hash, expires_at, scopes, workspace_id, oauth_app_id, oauth_grant_id)
     values ($1, 'oauth', 'sibling', $2, now() + interval '1 hour', $3, $4, $5, $6)`,
    [user.id, hashToken(`${token}-sibling`), caller.scopes, tenant.id, app.id, oauth_grant_id],
  )
  return token
}

/** Runs `statement` as crm_api after the caller's authentication (in full, or resumed as a cached identity), then rolls back. */
async function asCaller(caller: Caller, token: string, statement: string): Promise<string[]> {
  const via = caller.kind === 'session' ? 'ui' : 'api'
  await runtime.query('begin')
  try {
    const {
      rows: [auth],
    } = await runtime.query(
      "select a.failure, a.access_version, set_config('role', 'crm_api', true) from crm.authenticate($1, 'revoke', $2, 1000000) a",
      [hashToken(token), via],
    )
    if (auth.failure !== null) throw new Error(`authentication failed: ${auth.failure}`)
    if (caller.resumed) {
      await runtime.query('rollback')
      await runtime.query('begin')
      const {
        rows: [resumed],
      } = await runtime.query("select r.failure, set_config('role', 'crm_api', true) from crm.resume_identity($1, $2, $3, $4, false) r", [
        hashToken(token),
        tenant.id,
        auth.access_version,
        via,
      ])
      if (resumed.failure !== null) throw new Error(`resume failed: ${resumed.failure}`)
    }
    return (await runtime.query(statement)).rows.map((row) => row.id as string).sort()
  } finally {
    await runtime.query('rollback')
  }
}

/** What the caller may revoke: the whole authority all of its user's, a scoped token itself, an app's token its authorization. */
async function allowed(caller: Caller, token: string): Promise<{ tokens: string[]; grants: string[] }> {
  const user = users[caller.userIndex]
  const own = await tokenId(token)
  const whole = caller.kind === 'unscoped' || caller.kind === 'session'
  const tokens = whole
    ? await ids('select id from crm.tokens where user_id = $1', [user.id])
    : caller.kind === 'scoped'
      ? [own.id]
      : await ids('select id from crm.tokens where oauth_grant_id = $1', [own.oauth_grant_id])
  // workspace:admin (an admin's role, and a token's scopes that allow it) disconnects any app of the workspace.
  const admin = user.role === 'admin' && (whole || caller.scopes.includes('workspace:admin'))
  const grants = admin
    ? await ids('select id from crm.oauth_grants where workspace_id = $1', [tenant.id])
    : whole
      ? await ids('select id from crm.oauth_grants where user_id = $1', [user.id])
      : caller.kind === 'app'
        ? [own.oauth_grant_id as string]
        : []
  return { tokens, grants }
}

const callers = fc.oneof(
  fc.record({
    kind: fc.constantFrom<Kind>('unscoped', 'session'),
    userIndex: fc.integer({ min: 0, max: 1 }),
    scopes: fc.constant<string[]>([]),
    resumed: fc.boolean(),
  }),
  fc.record({
    kind: fc.constant<Kind>('scoped'),
    userIndex: fc.integer({ min: 0, max: 1 }),
    scopes: fc.subarray([...PERSONAL_TOKEN_SCOPES], { minLength: 1 }),
    resumed: fc.boolean(),
  }),
  fc.record({
    kind: fc.constant<Kind>('app'),
    userIndex: fc.integer({ min: 0, max: 1 }),
    scopes: fc.subarray([...TOKEN_SCOPES], { minLength: 1 }),
    resumed: fc.boolean(),
  }),
)

const revokesOnlyItsOwn = () =>
  fc.assert(
    fc.asyncProperty(callers, async (caller) => {
      await population()
      const token = await callerToken(caller)
      const expected = await allowed(caller, token)
      const tokens = await asCaller(caller, token, 'update crm.tokens set revoked_at = now() returning id')
      const grants = await asCaller(caller, token, 'update crm.oauth_grants set revoked_at = now() returning id')
      const seen = JSON.stringify({ tokens, grants })
      if (seen !== JSON.stringify(expected))
        throw new Error(`${JSON.stringify(caller)}: revoked ${seen}, allowed ${JSON.stringify(expected)}`)
    }),
    { numRuns: 40 },
  )

t.test('a scoped token revokes itself only; an app token its own authorization only (the parameter)', async (t) => {
  const { rows } = await runtime.query(
    "select not (select prosecdef from pg_proc where oid = 'crm.context_text()'::regprocedure) as carrier",
  )
  t.ok(rows[0].carrier, 'the parameter path is in use')
  await revokesOnlyItsOwn()
  t.pass('held for every caller tried')
})

t.test('the same on the keyed proof', async (t) => {
  t.equal((await migrate(url, { contextCarrier: 'keyed_proof' })).contextCarrier, 'keyed_proof')
  t.teardown(() => migrate(url))
  await revokesOnlyItsOwn()
  t.pass('held for every caller tried')
})

t.test('the context names the calling token and its grant, and nothing without a request', async (t) => {
  const user = users[0]
  const token = await mintToken(owner, user.id, { kind: 'oauth', scopes: ['contacts:read'], workspaceId: tenant.id, oauthAppId: app.id })
  const own = await tokenId(token)
  await runtime.query('begin')
  await runtime.query("select set_config('role', 'crm_api', true)")
  t.same((await runtime.query('select crm.current_token_id() as token, crm.current_oauth_grant_id() as grant')).rows[0], {
    token: null,
    grant: null,
  })
  await runtime.query("select a.failure from crm.authenticate($1, 'revoke', 'api', 1000000) a", [hashToken(token)])
  t.same((await runtime.query('select crm.current_token_id() as token, crm.current_oauth_grant_id() as grant')).rows[0], {
    token: own.id,
    grant: own.oauth_grant_id,
  })
  await runtime.query('rollback')
})
