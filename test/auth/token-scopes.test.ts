// Scoped tokens (docs/api.md section 4a): what a token may do is its role's grants intersected with its
// scopes. Row-level security enforces it (the proven context carries the scopes), so SQL in that
// context refuses what a route would, and every route answers 403 insufficient_scope first.
import { createHash, randomBytes } from 'node:crypto'
import t from 'tap'
import { TOKEN_SCOPES } from '../../src/auth/scopes.ts'
import { hashToken } from '../../src/auth/tokens.ts'
import { assertScopesDeclared, type RouteDefinition } from '../../src/http/route.ts'
import { allRoutes } from '../../src/http/routes/index.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const url = server.databaseUrl
const tenant = await createTenant(url, {
  slug: 'acme',
  members: { 'ada@acme.test': 'admin', 'bob@acme.test': 'member' },
})
const other = await createTenant(url, { slug: 'globex', members: { 'gus@globex.test': 'admin' } })
const ada = tenant.members['ada@acme.test']
const bob = tenant.members['bob@acme.test']
const owner = await ownerClient(t, url)

// Ada is in both workspaces (her last used one is globex), so a bound token is put to the test.
await owner.query(
  `insert into crm.memberships (workspace_id, user_id, role_id) select $1, $2, id from crm.roles where workspace_id = $1 and name = 'member'`,
  [other.id, ada.id],
)
await owner.query('update crm.users set last_workspace_id = $1 where id = $2', [other.id, ada.id])

const scoped = (userId: string, scopes: string[]) => withOwner(url, (client) => mintToken(client, userId, { scopes }))

const {
  rows: [seed],
} = await owner.query(
  `with d as (insert into crm.deals (workspace_id, owner_id, name) values ($1, $2, 'Big deal') returning id),
        c as (insert into crm.contacts (workspace_id, owner_id, first_name, email) values ($1, $2, 'Big', 'big@example.com') returning id),
        s as (insert into crm.webhook_subscriptions (workspace_id, name, url, events, secret_encrypted, secret_last4)
              values ($1, 'hook', 'https://hooks.example.com/in', '{*}', '\\x00', 'abcd') returning id),
        i as (insert into crm.invitations (workspace_id, email, role_id, token_hash, invited_by, expires_at)
              select $1, 'new@acme.test', r.id, $3, $2, now() + interval '7 days' from crm.roles r where r.workspace_id = $1 and r.name = 'member'
              returning id)
   select (select id from d) as deal, (select id from c) as contact, (select id from s) as subscription, (select id from i) as invitation`,
  [tenant.id, ada.id, createHash('sha256').update('invitation').digest()],
)

/** Runs fn as a DBA acting as the member through a token with these scopes, then rolls back. */
async function actingAs<T>(email: string, scopes: string[] | null, fn: () => Promise<T>): Promise<T> {
  await owner.query('begin')
  try {
    await owner.query('select crm.act_as($1, $2, scopes => $3)', [email, 'acme', scopes])
    return await fn()
  } finally {
    await owner.query('rollback')
  }
}
const count = async (table: string) => (await owner.query(`select count(*)::int as n from crm.${table}`)).rows[0].n as number
const refused = async (statement: string, values: unknown[] = []) => {
  await owner.query('savepoint probe')
  try {
    await owner.query(statement, values)
    return null
  } catch (error) {
    return error as { code?: string; hint?: string }
  } finally {
    await owner.query('rollback to savepoint probe')
  }
}

t.test('the scope names in TypeScript are crm.known_scopes()', async (t) => {
  const { rows } = await owner.query('select crm.known_scopes() as scopes')
  t.same(rows[0].scopes, [...TOKEN_SCOPES])
})

t.test('SQL: a deals:read context reads deals and cannot write one', async (t) => {
  await actingAs('ada@acme.test', ['deals:read'], async () => {
    t.same((await owner.query('select crm.current_scopes() as s')).rows[0].s, ['deals:read'])
    t.equal(await count('deals'), 1, 'the deal is visible')
    t.equal(await count('contacts'), 0, 'contacts are not')
    const insert = await refused(`insert into crm.deals (workspace_id, owner_id, name) values ($1, $2, 'Sneaky')`, [tenant.id, ada.id])
    t.equal(insert?.code, '42501', 'insert refused by row-level security')
    t.equal((await owner.query(`update crm.deals set name = 'Changed' where id = $1`, [seed.deal])).rowCount, 0, 'update matches nothing')
    t.equal((await owner.query('delete from crm.deals where id = $1', [seed.deal])).rowCount, 0, 'delete matches nothing')
    t.equal((await owner.query(`select crm.grant_scope('deals', 'export') as g`)).rows[0].g, 'all', 'export goes with read')
    t.equal((await owner.query(`select crm.grant_scope('deals', 'import') as g`)).rows[0].g, null, 'import needs write')
  })
  // The same admin without scopes: the whole role.
  await actingAs('ada@acme.test', null, async () => {
    t.equal(await count('contacts'), 1)
    t.equal((await owner.query(`update crm.deals set name = 'Big deal' where id = $1`, [seed.deal])).rowCount, 1)
  })
})

t.test('SQL: contacts:write without deals:* sees no deal and writes contacts', async (t) => {
  await actingAs('bob@acme.test', ['contacts:write'], async () => {
    t.equal(await count('deals'), 0)
    t.equal(await count('contacts'), 1)
    t.equal((await owner.query(`insert into crm.contacts (workspace_id, first_name) values ($1, 'Mine')`, [tenant.id])).rowCount, 1)
    // A link needs write on one end, and both ends visible.
    const link = await refused('insert into crm.associations (contact_id, deal_id) values ($1, $2)', [seed.contact, seed.deal])
    t.equal(link?.code, '42501', 'a deal it cannot see cannot be linked')
  })
  await actingAs('ada@acme.test', ['contacts:read', 'deals:read'], async () => {
    const link = await refused('insert into crm.associations (contact_id, deal_id) values ($1, $2)', [seed.contact, seed.deal])
    t.equal(link?.code, '42501', 'read scopes on both ends do not link')
  })
  await actingAs('ada@acme.test', ['contacts:read', 'deals:write'], async () => {
    t.equal(
      (await owner.query('insert into crm.associations (contact_id, deal_id) values ($1, $2)', [seed.contact, seed.deal])).rowCount,
      1,
    )
  })
})

t.test('SQL: an admin whose token holds only deals:write has no admin areas', async (t) => {
  await actingAs('ada@acme.test', ['deals:write'], async () => {
    t.equal((await owner.query('select crm.is_admin() as a')).rows[0].a, true, 'the role is an admin role')
    t.equal(await count('webhook_subscriptions'), 0, 'no webhook subscriptions')
    t.equal(await count('memberships'), 2, 'only her own memberships, not the member list')
    t.equal(await count('invitations'), 0, 'no invitations')
    t.equal(await count('oauth_apps'), 0)
    t.equal((await refused(`insert into crm.teams (workspace_id, name) values ($1, 'intruders')`, [tenant.id]))?.code, '42501')
    t.equal((await owner.query(`update crm.memberships set suspended_at = now() where user_id = $1`, [bob.id])).rowCount, 0)
    const gate = await refused('select crm.require_webhook_access()')
    t.match(gate, { code: 'CR403', hint: 'insufficient_scope' }, 'the webhook functions name the missing scope')
  })
  await actingAs('ada@acme.test', ['webhooks:manage'], async () => {
    t.equal(await count('webhook_subscriptions'), 1)
    t.equal(await count('invitations'), 0, 'webhooks:manage opens webhooks only')
    t.equal(await count('deals'), 0, 'and no records')
  })
  await actingAs('ada@acme.test', ['workspace:admin'], async () => {
    t.equal(await count('memberships'), 3, 'the member list (and her own in globex)')
    t.equal(await count('invitations'), 1)
    t.equal(await count('webhook_subscriptions'), 0)
  })
  await actingAs('bob@acme.test', ['workspace:admin', 'webhooks:manage'], async () => {
    t.equal(await count('invitations'), 0, 'a scope never widens a role: bob is no admin')
    t.equal(await count('webhook_subscriptions'), 0)
  })
})

t.test('SQL: act_as refuses scopes that are not known, and the audit views', async (t) => {
  await owner.query('begin')
  const wrong = await refused(`select crm.act_as('ada@acme.test', 'acme', scopes => array['deals:delete'])`)
  t.equal(wrong?.code, 'CR422')
  await owner.query('rollback')
  await owner.query('begin')
  const { rows: said } = await owner.query(`select crm.act_as('ada@acme.test', 'acme', scopes => array['deals:read']) as said`)
  await owner.query('rollback')
  t.match(said[0].said, /acting as ada@acme\.test in acme with scopes deals:read/)

  const { rows: actions } = await owner.query(`select resource, action from crm.scope_actions where scope = 'deals:read' order by action`)
  t.same(actions, [
    { resource: 'deals', action: 'export' },
    { resource: 'deals', action: 'view' },
  ])
  await scoped(bob.id, ['deals:write', 'webhooks:manage'])
  const { rows: access } = await owner.query(
    `select workspace, resource, action, scope from crm.token_access where email = 'bob@acme.test' order by resource, action`,
  )
  t.same(
    access,
    [
      { workspace: 'acme', resource: 'deals', action: 'create', scope: 'own' },
      { workspace: 'acme', resource: 'deals', action: 'delete', scope: 'own' },
      { workspace: 'acme', resource: 'deals', action: 'update', scope: 'own' },
      { workspace: 'acme', resource: 'deals', action: 'view', scope: 'all' },
    ],
    'the member role intersected with deals:write; webhooks:manage adds nothing to a non-admin',
  )
  await scoped(ada.id, ['contacts:read', 'workspace:admin'])
  const { rows: adminAccess } = await owner.query(
    `select resource, action, scope from crm.token_access where email = 'ada@acme.test' and workspace = 'acme' order by resource, action`,
  )
  t.same(adminAccess, [
    { resource: 'contacts', action: 'export', scope: 'all' },
    { resource: 'contacts', action: 'view', scope: 'all' },
    { resource: 'workspace', action: 'admin', scope: 'all' },
  ])
})

t.test('SQL: the scopes are part of the context; set or widened by hand they change nothing', async (t) => {
  const token = await scoped(ada.id, ['deals:read'])
  const client = await ownerClient(t, url)
  const authenticate = () =>
    client.query(`select a.*, set_config('role', 'crm_api', true) from crm.authenticate($1, 'acme', 'api', 600) a`, [hashToken(token)])
  await client.query('begin')
  await authenticate()
  const { rows: proven } = await client.query(`select crm.current_user_id() as user_id, crm.current_scopes() as scopes,
    (select count(*)::int from crm.deals) as deals`)
  t.same(proven[0], { user_id: ada.id, scopes: ['deals:read'], deals: 1 })
  // The route check bypassed: SQL in the proven context is refused all the same.
  const write = await client
    .query(`insert into crm.deals (workspace_id, owner_id, name) values ($1, $2, 'Sneaky')`, [tenant.id, ada.id])
    .then(
      () => null,
      (error: { code?: string }) => error.code,
    )
  t.equal(write, '42501')
  await client.query('rollback')
  // The settings of the keyed proof set by hand are not read; the carrier cannot be set by crm_api.
  for (const hand of ['', '{deals:read,deals:write}', '{contacts:read}']) {
    await client.query('begin')
    await authenticate()
    await client.query(`select set_config('crm.scopes', $1, true), set_config('crm.context', $1, true)`, [hand])
    const { rows } = await client.query(`select crm.current_user_id() as user_id, crm.current_scopes() as scopes,
      (select count(*)::int from crm.deals) as deals, crm.is_admin_for('workspace:admin') as admin`)
    await client.query('rollback')
    t.same(rows[0], { user_id: ada.id, scopes: ['deals:read'], deals: 1, admin: false }, `crm.scopes set to '${hand}' by hand`)
  }
  await client.query('begin')
  await authenticate()
  const widened = await client.query("select set_config('backtrace_functions', 'crm_context', true)").then(
    () => null,
    (error: { code?: string }) => error.code,
  )
  await client.query('rollback')
  t.equal(widened, '42501', 'crm_api cannot write the carrier')
})

t.test('HTTP: a route the scopes do not cover answers 403 insufficient_scope with the challenge', async (t) => {
  const dealsRead = await scoped(ada.id, ['deals:read'])
  const dealsWrite = await scoped(ada.id, ['deals:write'])
  const hooks = await scoped(ada.id, ['webhooks:manage'])
  const csv = { 'content-type': 'text/csv', 'x-tenant-slug': 'acme' }
  const cases: [string, string, string, string, { body?: unknown; raw?: string; headers?: Record<string, string> }?][] = [
    // single-statement reads: one, list, per-type search
    [dealsRead, 'GET', `/api/contacts/${seed.contact}`, 'contacts:read'],
    [dealsRead, 'GET', '/api/contacts', 'contacts:read'],
    [dealsRead, 'GET', '/api/contacts/search?q=big', 'contacts:read'],
    // writes, associations, exports, imports
    [dealsRead, 'POST', '/api/deals', 'deals:write', { body: { name: 'Nope' } }],
    [dealsRead, 'PATCH', `/api/deals/${seed.deal}`, 'deals:write', { body: { name: 'Nope' } }],
    [dealsRead, 'DELETE', `/api/deals/${seed.deal}`, 'deals:write'],
    [dealsRead, 'PUT', `/api/associations/deals/${seed.deal}`, 'deals:write', { body: { contacts: [seed.contact] } }],
    [dealsWrite, 'GET', `/api/associations/contacts/${seed.contact}`, 'contacts:read'],
    [dealsWrite, 'POST', '/api/contacts/export', 'contacts:read', { body: {} }],
    [dealsRead, 'POST', '/api/deals/import/upload', 'deals:write', { raw: 'name\nA\n', headers: csv }],
    [hooks, 'GET', '/api/search?q=big', 'contacts:read companies:read deals:read'],
    [hooks, 'GET', '/api/deal-stages', 'deals:read'],
    // admin areas
    [dealsWrite, 'GET', '/api/webhook-subscriptions', 'webhooks:manage'],
    [dealsWrite, 'GET', '/api/members', 'workspace:admin'],
    [dealsWrite, 'GET', '/api/roles', 'workspace:admin'],
    [dealsWrite, 'POST', '/api/teams', 'workspace:admin', { body: { name: 'intruders' } }],
    [hooks, 'GET', '/api/invitations', 'workspace:admin'],
  ]
  for (const [token, method, path, scope, options = {}] of cases) {
    const answer = await server.request(method, path, {
      token,
      body: options.body,
      raw: options.raw,
      headers: options.headers ?? { 'x-tenant-slug': 'acme' },
    })
    t.equal(answer.status, 403, `${method} ${path}`)
    t.equal(answer.body?.code, 'insufficient_scope', `${method} ${path}: code`)
    t.equal(
      answer.headers.get('www-authenticate'),
      `Bearer realm="crm", error="insufficient_scope", scope="${scope}"`,
      `${method} ${path}: challenge`,
    )
  }
  t.equal((await owner.query(`select count(*)::int as n from crm.deals where name = 'Nope'`)).rows[0].n, 0, 'nothing was written')
  t.equal((await owner.query(`select name from crm.deals where id = $1`, [seed.deal])).rows[0].name, 'Big deal')
})

t.test('HTTP: what the scopes cover works, through the single-statement reads too', async (t) => {
  const dealsRead = await scoped(ada.id, ['deals:read'])
  const headers = { 'x-tenant-slug': 'acme' }
  const one = await server.request('GET', `/api/deals/${seed.deal}`, { token: dealsRead, headers })
  t.equal(one.status, 200)
  t.equal(one.body.data.name, 'Big deal')
  const list = await server.request('GET', '/api/deals', { token: dealsRead, headers })
  t.equal(list.body.data.length, 1)
  t.equal((await server.request('GET', '/api/deals/search?q=big', { token: dealsRead, headers })).body.data.length, 1)
  const everywhere = await server.request('GET', '/api/search?q=big', { token: dealsRead, headers })
  t.equal(everywhere.status, 200)
  t.same(
    everywhere.body.data.map((result: { type: string }) => result.type),
    ['deal'],
    'the contact named Big is left out: row-level security applied the scopes',
  )
  t.equal((await server.request('GET', '/api/deal-stages', { token: dealsRead, headers })).status, 200)
  t.equal((await server.request('GET', `/api/associations/deals/${seed.deal}`, { token: dealsRead, headers })).status, 200)
  const exported = await server.request('POST', '/api/deals/export', { token: dealsRead, headers, body: { format: 'ndjson' } })
  t.equal(exported.status, 200)
  t.match(exported.text, /Big deal/)

  const dealsWrite = await scoped(bob.id, ['deals:write'])
  const created = await server.request('POST', '/api/deals', { token: dealsWrite, headers, body: { name: 'Bob deal' } })
  t.equal(created.status, 201)
  t.equal(
    (await server.request('GET', `/api/deals/${created.body.data.id}`, { token: dealsWrite, headers })).status,
    200,
    'write reads too',
  )
  t.equal((await server.request('DELETE', `/api/deals/${created.body.data.id}`, { token: dealsWrite, headers })).status, 204)

  const hooks = await scoped(ada.id, ['webhooks:manage'])
  const subscriptions = await server.request('GET', '/api/webhook-subscriptions', { token: hooks, headers })
  t.equal(subscriptions.status, 200)
  t.equal(subscriptions.body.data.length, 1)
})

t.test('HTTP: /api/me and /api/tokens show the scopes; POST /api/tokens validates them', async (t) => {
  const headers = { 'x-tenant-slug': 'acme' }
  const me = await server.request('GET', '/api/me', { token: ada.token, headers })
  t.equal(me.body.data.token.scopes, null, 'unscoped')
  const refusals: [unknown, string][] = [
    [['deals:read', 'deals:read'], '/scopes/1'],
    [['deals:delete'], '/scopes/0'],
    [[], '/scopes'],
    [['offline_access'], '/scopes/0'],
    [[...TOKEN_SCOPES, 'deals:read'], '/scopes'],
    ['deals:read', '/scopes'],
  ]
  for (const [scopes, pointer] of refusals) {
    const answer = await server.request('POST', '/api/tokens', { token: ada.token, headers, body: { name: 'Reports', scopes } })
    t.equal(answer.status, 422, `scopes ${JSON.stringify(scopes)}`)
    t.equal(answer.body.code, 'validation_failed')
    t.ok(
      answer.body.errors.some((error: { pointer: string }) => error.pointer === pointer),
      `pointer ${pointer}: ${JSON.stringify(answer.body.errors)}`,
    )
  }
  t.equal((await server.request('POST', '/api/tokens', { token: ada.token, headers, body: { name: ' ' } })).status, 422)
  t.equal(
    (await server.request('POST', '/api/tokens', { token: ada.token, headers, body: { name: 'x', expires_in_days: 366 } })).status,
    422,
  )

  const created = await server.request('POST', '/api/tokens', {
    token: ada.token,
    headers,
    body: { name: 'Reports', expires_in_days: 30, scopes: ['deals:read', 'contacts:read'] },
  })
  t.equal(created.status, 201)
  t.match(created.body, { token_type: 'Bearer', name: 'Reports', scopes: ['deals:read', 'contacts:read'] })
  t.match(created.body.token, /^crm_/)
  const days = (Date.parse(created.body.expires_at) - Date.now()) / 86_400_000
  t.ok(days > 29.9 && days <= 30, `expires in 30 days (${days})`)
  const reports = created.body.token as string
  const itsMe = await server.request('GET', '/api/me', { token: reports, headers })
  t.same(itsMe.body.data.token.scopes, ['deals:read', 'contacts:read'])
  t.equal(itsMe.body.data.token.name, 'Reports')
  const listed = await server.request('GET', '/api/tokens', { token: ada.token, headers })
  t.same(listed.body.data.find((token: { id: string }) => token.id === created.body.token_id)?.scopes, ['deals:read', 'contacts:read'])
  t.equal((await server.request('GET', '/api/contacts', { token: reports, headers })).status, 200, 'the new token works')
  t.equal((await server.request('POST', '/api/contacts', { token: reports, headers, body: { first_name: 'x' } })).status, 403)

  // A scoped token creates no token at all, not even a narrower one (a part of the user's
  // authority never yields another credential).
  for (const [name, scopes] of [
    ['More', ['deals:write']],
    ['All', undefined],
    ['Less', ['deals:read']],
  ] as const) {
    const minted = await server.request('POST', '/api/tokens', { token: reports, headers, body: { name, ...(scopes ? { scopes } : {}) } })
    t.equal(minted.status, 403, `${name}: ${minted.text}`)
    t.equal(minted.body.code, 'forbidden')
  }
  // The database refuses the same, whatever the route says.
  await owner.query('begin')
  await owner.query(`select crm.act_as('ada@acme.test', 'acme', scopes => array['deals:read'])`)
  const direct = await refused(
    `insert into crm.tokens (user_id, kind, name, token_hash, expires_at, scopes) values ($1, 'token', 'x', $2, now() + interval '1 day', '{deals:read}')`,
    [ada.id, randomBytes(32)],
  )
  t.equal(direct?.code, '42501', 'not even within its scopes')
  await owner.query('rollback')
})

t.test('OAuth access tokens: bound to their workspace, events name the app, no personal tokens', async (t) => {
  const {
    rows: [app],
  } = await owner.query(
    `insert into crm.oauth_apps (workspace_id, name, client_id, client_secret_hash, client_secret_last4, redirect_uris)
     values ($1, 'Zapier-like', $2, $3, 'abcd', '{https://app.example.com/callback}') returning id`,
    [tenant.id, `crmapp_${randomBytes(16).toString('base64url').slice(0, 22)}`, randomBytes(32)],
  )
  const token = await withOwner(url, (client) =>
    mintToken(client, ada.id, { kind: 'oauth', scopes: ['deals:write'], workspaceId: tenant.id, oauthAppId: app.id }),
  )
  // Ada last used globex, yet the token knows only acme.
  const me = await server.request('GET', '/api/me', { token })
  t.equal(me.status, 200)
  t.equal(me.body.data.workspace.slug, 'acme')
  t.same(me.body.data.token.scopes, ['deals:write'])
  const elsewhere = await server.request('GET', '/api/me', { token, headers: { 'x-tenant-slug': 'globex' } })
  t.equal(elsewhere.status, 404)
  t.equal(elsewhere.body.code, 'workspace_not_found')
  t.equal(
    (await server.request('GET', '/api/deals', { token, headers: { 'x-tenant-slug': 'globex' } })).status,
    404,
    'single-statement too',
  )

  const created = await server.request('POST', '/api/deals', { token, body: { name: 'Through the app' } })
  t.equal(created.status, 201)
  const {
    rows: [event],
  } = await owner.query(`select actor from crm.events where record_id = $1 and event = 'deal.created'`, [created.body.data.id])
  t.same(event.actor, { type: 'user', id: ada.id, via: 'oauth', app_id: app.id })
  const personal = await server.request('POST', '/api/tokens', { token, body: { name: 'Escape', scopes: ['deals:write'] } })
  t.equal(personal.status, 403)
  t.equal(personal.body.code, 'forbidden')

  // API access off stops app tokens like personal ones.
  await owner.query('update crm.users set api_access = false where id = $1', [ada.id])
  t.equal((await server.request('GET', '/api/me', { token })).body.code, 'api_access_disabled')
  await owner.query('update crm.users set api_access = true where id = $1', [ada.id])
})

t.test('imports land within the scopes of the token that queued them', async (t) => {
  const {
    rows: [job],
  } = await owner.query(
    `insert into crm.imports (workspace_id, user_id, record_type, file_name, file_size, delimiter, columns, row_count, sample_rows,
                              suggested_mapping, status, token_scopes)
     values ($1, $2, 'contacts', 'x.csv', 1, ',', '{first_name}', 1, '[]', '{}', 'queued', '{contacts:write}') returning id`,
    [tenant.id, ada.id],
  )
  await owner.query('begin')
  try {
    await owner.query('select * from crm.begin_import_batch($1, $2)', [tenant.id, job.id])
    const { rows } = await owner.query(`select crm.current_scopes() as scopes, crm.current_via() as via,
      crm.grant_scope('contacts', 'import') as contacts, crm.grant_scope('companies', 'create') as companies`)
    t.same(rows[0], { scopes: ['contacts:write'], via: 'import', contacts: 'all', companies: null })
  } finally {
    await owner.query('rollback')
  }
})

t.test('the rate limit counts a scoped token against its user', async (t) => {
  // A batch of the whole limit: no request waits for a settlement, and the headers read the same
  // whether the timer settles between the requests or not.
  const limited = await startTestServer(t, {
    databaseUrl: url,
    env: { RATE_LIMIT_PER_MINUTE: '4', RATE_LIMIT_BATCH: '4', RATE_LIMIT_SETTLE_MS: '10000' },
  })
  const {
    members: { 'rita@acme.test': rita },
  } = await createTenant(url, { members: { 'rita@acme.test': 'member' } })
  const narrow = await scoped(rita.id, ['deals:read'])
  // Stay inside one clock-aligned minute.
  const second = new Date().getUTCSeconds()
  if (second > 50) await new Promise((resolve) => setTimeout(resolve, (61 - second) * 1000))
  const remaining: (string | null)[] = []
  for (const token of [rita.token, rita.token, narrow, narrow]) {
    const answer = await limited.request('GET', '/api/deals', { token })
    t.equal(answer.status, 200)
    remaining.push(answer.headers.get('ratelimit-remaining'))
  }
  t.same(remaining, ['3', '2', '1', '0'], 'one count for both tokens')
  const over = await limited.request('GET', '/api/me', { token: narrow })
  t.equal(over.status, 429)
  t.equal(over.body.code, 'rate_limited')
})

t.test('every authenticated route declares its scope, and the OpenAPI document lists it', async (t) => {
  t.doesNotThrow(() => assertScopesDeclared(allRoutes()))
  const missing: RouteDefinition = { method: 'GET', path: '/api/x', summary: 'x', tag: 'x', auth: 'required', handler: async () => {} }
  t.throws(() => assertScopesDeclared([missing]), /routes without a scope: GET \/api\/x/)
  const document = (await server.request('GET', '/api/openapi.json')).body
  t.equal(document.paths['/api/deals/{id}'].get['x-required-scope'], 'deals:read')
  t.equal(document.paths['/api/deals/{id}'].delete['x-required-scope'], 'deals:write')
  t.same(document.paths['/api/search'].get['x-required-scope'], ['contacts:read', 'companies:read', 'deals:read'])
  t.equal(document.paths['/api/webhook-subscriptions'].get['x-required-scope'], 'webhooks:manage')
  t.equal(document.paths['/api/me'].get['x-required-scope'], null)
  t.ok(document.paths['/api/deals/{id}'].get.responses['403'], '403 documented')
  t.ok(
    document.paths['/api/tokens'].post.responses['201'].content['application/json'].schema.properties.scopes,
    'POST /api/tokens echoes scopes',
  )
})
