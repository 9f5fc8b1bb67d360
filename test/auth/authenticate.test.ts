// Every way a token stops working, workspace choice, and the headers of authenticated answers.
import t from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const url = server.databaseUrl
const acme = await createTenant(url, { slug: 'acme', members: { 'ada@acme.test': 'admin', 'bob@acme.test': 'member' } })
const globex = await createTenant(url, { slug: 'globex', members: { 'ada@acme.test': 'read_only', 'eve@globex.test': 'admin' } })
const ada = acme.members['ada@acme.test']
const bob = acme.members['bob@acme.test']
const sql = (text: string, values: unknown[] = []) => withOwner(url, (client) => client.query(text, values))

t.test('no, malformed and unknown credentials', async (t) => {
  const none = await server.request('GET', '/api/me')
  t.equal(none.status, 401)
  t.equal(none.body.code, 'token_missing')
  t.equal(none.headers.get('www-authenticate'), 'Bearer realm="crm", error="invalid_token"')
  t.equal((await server.request('GET', '/api/me', { headers: { authorization: 'Basic abc' } })).body.code, 'token_invalid')
  t.equal((await server.request('GET', '/api/me', { token: 'crm_short' })).body.code, 'token_invalid')
  t.equal((await server.request('GET', '/api/me', { token: 'crm_' + 'A'.repeat(43) })).body.code, 'token_invalid')
})

t.test('GET /api/me', async (t) => {
  const me = await server.request('GET', '/api/me', { token: bob.token, headers: { 'X-Tenant-Slug': 'acme' } })
  t.equal(me.status, 200)
  t.match(me.body.data, {
    user: { id: bob.id, email: 'bob@acme.test' },
    workspace: { slug: 'acme', plan: 'free' },
    role: { name: 'member', is_admin: false },
    token: { id: /^[0-9a-f-]{36}$/, name: 'test' },
  })
  t.ok(me.body.data.role.permissions.includes('deals:view:all'))
  t.ok(me.body.data.role.permissions.includes('deals:update:own'))
  t.notOk(me.body.data.role.permissions.includes('deals:export:own'))
  t.equal(me.headers.get('ratelimit-limit'), '600')
  t.ok(Number(me.headers.get('ratelimit-remaining')) < 600)
  const reset = Number(me.headers.get('ratelimit-reset'))
  t.ok(reset >= 1 && reset <= 60, `RateLimit-Reset ${reset}`)
  t.match(me.headers.get('x-request-id'), /^[0-9a-f-]{36}$/)
  const echoed = await server.request('GET', '/api/me', { token: bob.token, headers: { 'X-Request-Id': 'erp-sync-42' } })
  t.equal(echoed.headers.get('x-request-id'), 'erp-sync-42', 'a sane caller id is kept')
  const insane = await server.request('GET', '/api/me', { token: bob.token, headers: { 'X-Request-Id': 'a b <script>' } })
  t.not(insane.headers.get('x-request-id'), 'a b <script>')
})

t.test('workspace choice: header, else last used, else oldest joined', async (t) => {
  const workspaces = await server.request('GET', '/api/workspaces', { token: ada.token })
  t.same(
    workspaces.body.data.map((w: { slug: string; role: string }) => [w.slug, w.role]),
    [
      ['acme', 'admin'],
      ['globex', 'read_only'],
    ],
  )
  t.equal((await server.request('GET', '/api/me', { token: ada.token })).body.data.workspace.slug, 'acme', 'oldest joined first')
  t.equal(
    (await server.request('GET', '/api/me', { token: ada.token, headers: { 'X-Tenant-Slug': 'globex' } })).body.data.workspace.slug,
    'globex',
  )
  t.equal((await server.request('GET', '/api/me', { token: ada.token })).body.data.workspace.slug, 'globex', 'then the last used')
  const foreign = await server.request('GET', '/api/me', { token: bob.token, headers: { 'X-Tenant-Slug': 'globex' } })
  t.equal(foreign.status, 404)
  t.equal(foreign.body.code, 'workspace_not_found')
  t.equal(
    (await server.request('GET', '/api/me', { token: bob.token, headers: { 'X-Tenant-Slug': 'no-such' } })).body.code,
    'workspace_not_found',
  )
  t.equal(
    (await server.request('GET', '/api/me', { token: bob.token, headers: { 'X-Tenant-Slug': "x'; drop table crm.users; --" } })).body.code,
    'workspace_not_found',
  )
})

t.test('tokens: list, revoke one, revoke all', async (t) => {
  const second = await withOwner(url, (client) => mintToken(client, bob.id))
  const list = await server.request('GET', '/api/tokens', { token: second })
  t.equal(list.status, 200)
  t.equal(list.body.data.length, 2)
  t.equal(list.body.data.filter((row: { current: boolean }) => row.current).length, 1)
  t.notOk(JSON.stringify(list.body).includes(second), 'never the value')
  const other = list.body.data.find((row: { current: boolean }) => !row.current)
  t.equal((await server.request('DELETE', `/api/tokens/${other.id}`, { token: second })).status, 204)
  t.equal((await server.request('GET', '/api/me', { token: bob.token })).body.code, 'token_revoked', 'stops at once')
  t.equal((await server.request('DELETE', `/api/tokens/${other.id}`, { token: second })).status, 404)
  const adaTokens = await server.request('GET', '/api/tokens', { token: ada.token })
  t.equal(
    (await server.request('DELETE', `/api/tokens/${adaTokens.body.data[0].id}`, { token: second })).status,
    404,
    "someone else's token is not found",
  )
  t.equal((await server.request('DELETE', '/api/tokens/not-a-uuid', { token: second })).status, 404)
  const third = await withOwner(url, (client) => mintToken(client, bob.id, { kind: 'session' }))
  t.equal((await server.request('GET', '/api/me', { token: third })).body.code, 'token_invalid', 'a UI session is not an API token')
  t.equal((await server.request('DELETE', '/api/tokens', { token: second })).status, 204)
  t.equal((await server.request('GET', '/api/me', { token: second })).body.code, 'token_revoked', 'the calling token too')
  const revoked = await withOwner(url, (client) =>
    client.query('select revoked_at from crm.tokens where token_hash = $1', [hashToken(third)]),
  )
  t.ok(revoked.rows[0].revoked_at, 'sessions too')
})

t.test('a token stops at once on expiry, suspension and API access off', async (t) => {
  const carol = await createTenant(url, { members: { 'carol@x.test': 'member', 'admin@x.test': 'admin' } })
  const token = carol.members['carol@x.test'].token
  const userId = carol.members['carol@x.test'].id
  t.equal((await server.request('GET', '/api/me', { token })).status, 200)

  await sql('update crm.memberships set suspended_at = now() where user_id = $1', [userId])
  t.equal((await server.request('GET', '/api/me', { token })).body.code, 'user_suspended', 'membership suspended')
  await sql('update crm.memberships set suspended_at = null where user_id = $1', [userId])

  await sql('update crm.users set suspended_at = now() where id = $1', [userId])
  t.equal((await server.request('GET', '/api/me', { token })).body.code, 'user_suspended', 'user suspended on the platform')
  await sql('update crm.users set suspended_at = null where id = $1', [userId])

  await sql('update crm.users set api_access = false where id = $1', [userId])
  const off = await server.request('GET', '/api/me', { token })
  t.equal(off.status, 401)
  t.equal(off.body.code, 'api_access_disabled')
  await sql('update crm.users set api_access = true where id = $1', [userId])

  // Expired by its row, not by waiting: a loaded machine may take longer than any short lifetime
  // before the first request.
  const shortLived = await withOwner(url, (client) => mintToken(client, userId))
  t.equal((await server.request('GET', '/api/me', { token: shortLived })).status, 200)
  await sql('update crm.tokens set expires_at = now() where token_hash = $1', [hashToken(shortLived)])
  t.equal((await server.request('GET', '/api/me', { token: shortLived })).body.code, 'token_expired')
  t.equal((await server.request('GET', '/api/me', { token })).status, 200, 'the other token still works')
})

t.test('authentication is one statement per request', async (t) => {
  const before = await withOwner(
    url,
    async (client) => (await client.query('select count(*)::int as n from crm.tokens where last_used_at is not null')).rows[0].n,
  )
  const counted = await startTestServer(t, { databaseUrl: url, countQueries: true })
  counted.queries.length = 0
  const response = await counted.request('GET', '/api/workspaces', { token: ada.token })
  t.equal(response.status, 200)
  t.equal(counted.queries.length, 2, `auth + the route's own query: ${counted.queries.map((q) => q.slice(0, 40)).join(' | ')}`)
  t.match(counted.queries[0], /crm\.authenticate/)
  t.ok(before >= 1)
})

t.test('reads that are one query send one statement: authentication and the query together', async (t) => {
  const counted = await startTestServer(t, { databaseUrl: url, countQueries: true })
  const acmeHeader = { 'x-tenant-slug': 'acme' }
  const created = await counted.request('POST', '/api/contacts', {
    token: ada.token,
    headers: acmeHeader,
    body: { first_name: 'Single', email: 'single@statement.test' },
  })
  t.equal(created.status, 201)
  for (const path of [`/api/contacts/${created.body.data.id}`, '/api/contacts?limit=5', '/api/contacts/search?q=single']) {
    counted.queries.length = 0
    const response = await counted.request('GET', path, { token: ada.token, headers: acmeHeader })
    t.equal(response.status, 200, path)
    t.equal(counted.queries.length, 1, `${path}: one statement, no BEGIN or COMMIT`)
    t.match(
      counted.queries[0],
      /crm\.(authenticate|resume_identity)\(/,
      `${path}: authentication (the token's cached identity after its first request)`,
    )
    t.ok(Number(response.headers.get('ratelimit-remaining')) > 0, `${path}: rate-limit headers come from the same statement`)
  }
  const one = await counted.request('GET', `/api/contacts/${created.body.data.id}`, { token: ada.token, headers: acmeHeader })
  t.equal(one.body.data.email, 'single@statement.test')
  const refused = await counted.request('GET', `/api/contacts/${created.body.data.id}`, {
    token: 'crm_' + 'x'.repeat(43),
    headers: acmeHeader,
  })
  t.equal(refused.status, 401, 'a wrong token is refused, and the record is not sent')
  t.notOk(refused.body.data)
  // A request the route refuses before its query (malformed id, bad filter) is still authenticated first.
  for (const path of ['/api/contacts/not-a-uuid', '/api/contacts?filter[nope]=1']) {
    t.equal(
      (await counted.request('GET', path, { token: 'crm_' + 'x'.repeat(43), headers: acmeHeader })).status,
      401,
      `${path} with a wrong token: 401`,
    )
    const valid = await counted.request('GET', path, { token: ada.token, headers: acmeHeader })
    t.ok(valid.status === 404 || valid.status === 400, `${path} with a good token: the route's own answer (${valid.status})`)
    t.ok(Number(valid.headers.get('ratelimit-remaining')) > 0, `${path}: counted, with rate-limit headers`)
  }
})

t.test('a request that fails after authentication still counts against the limit', async (t) => {
  const { members } = await createTenant(url, { members: { 'dan@y.test': 'admin' } })
  const token = members['dan@y.test'].token
  const first = Number((await server.request('GET', '/api/me', { token })).headers.get('ratelimit-remaining'))
  const failed = await server.request('DELETE', '/api/tokens/00000000-0000-7000-8000-000000000000', { token })
  t.equal(failed.status, 404)
  const after = Number((await server.request('GET', '/api/me', { token })).headers.get('ratelimit-remaining'))
  t.equal(first - after, 2, 'the failed request was counted')
})
void globex
