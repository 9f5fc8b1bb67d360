// A record's create, update or delete by a token the process knows travels with its
// authentication as one statement (src/db/request/statement-connection.ts, wrappedWrite in
// src/auth/authenticate.ts). Checked here: it is one statement with its event; it answers exactly
// what the same write answers in a transaction (a property over actors, targets and bodies, against
// a second process with WRITES_IN_ONE_STATEMENT=false on the same database); a failed
// authentication or a failed write leaves nothing behind and counts the request once.
import { deepStrictEqual } from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import fc from 'fast-check'
import t from 'tap'
import { addMember, createTenant, type Member, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer, type TestResponse, type TestServer } from '../helpers/server.ts'

const oneStatement = await startTestServer(t, { countQueries: true })
const url = oneStatement.databaseUrl
const inTransaction = await startTestServer(t, { databaseUrl: url, env: { WRITES_IN_ONE_STATEMENT: 'false' } })
const tenant = await createTenant(url, {
  slug: 'onestatement',
  members: { 'admin@one.test': 'admin', 'ann@one.test': 'member', 'bob@one.test': 'member', 'reader@one.test': 'read_only' },
})
const elsewhere = await createTenant(url, { slug: 'elsewhere', members: { 'eve@else.test': 'admin' } })
const ann = tenant.members['ann@one.test']

/** Callers: members by role, and scoped tokens of ann's (one that may write contacts, one that may only read them). */
const actors: Record<string, Member> = {
  admin: tenant.members['admin@one.test'],
  ann,
  reader: tenant.members['reader@one.test'],
  ...(await withOwner(url, async (client) => ({
    annContactsWrite: { ...ann, token: await mintToken(client, ann.id, { scopes: ['contacts:write'] }) },
    annContactsRead: { ...ann, token: await mintToken(client, ann.id, { scopes: ['contacts:read'] }) },
  }))),
}

type Server = TestServer
const call = (server: Server, method: string, path: string, token: string, body?: unknown, headers: Record<string, string> = {}) =>
  server.request(method, path, { token, body, headers: { 'x-tenant-slug': tenant.slug, ...headers } })

// Every actor's identity is cached in both processes (a first request authenticates in full, in a transaction).
for (const server of [oneStatement, inTransaction])
  for (const actor of Object.values(actors)) {
    const answer = await call(server, 'GET', '/api/contacts', actor.token)
    if (answer.status !== 200) throw new Error(`warming ${actor.email}: ${answer.status}`)
  }

/** Each type's table and its name column (a contact's is first_name). */
const TYPES = {
  contacts: { table: 'crm.contacts', name: 'first_name' },
  deals: { table: 'crm.deals', name: 'name' },
  companies: { table: 'crm.companies', name: 'name' },
}
type TypePath = keyof typeof TYPES

/** A record made as the owner, owned by `owner` in `workspace`: the twin each process writes to. */
async function record(type: TypePath, workspaceId: string, ownerId: string): Promise<string> {
  return withOwner(url, async (client) => {
    const { rows } = await client.query(
      `insert into ${TYPES[type].table} (workspace_id, owner_id, created_by, updated_by, ${TYPES[type].name}) values ($1, $2, $2, $2, 'Twin') returning id`,
      [workspaceId, ownerId],
    )
    return rows[0].id as string
  })
}

async function eventsOf(id: string): Promise<string[]> {
  return withOwner(url, async (client) => {
    const { rows } = await client.query('select event from crm.events where record_id = $1 order by id', [id])
    return rows.map((row) => row.event as string)
  })
}

t.test('a known token writes in one statement, its event in it', async (t) => {
  const token = actors.ann.token
  oneStatement.queries.length = 0
  const created = await call(oneStatement, 'POST', '/api/deals', token, { name: 'One trip', amount: '10.00' })
  t.equal(created.status, 201)
  const id = created.body.data.id
  t.equal(created.body.data.owner_id, ann.id, 'owned by the caller, from the context')
  t.equal(created.body.data.created_by, ann.id)
  t.equal((await call(oneStatement, 'PUT', `/api/deals/${id}`, token, { amount: '20.00' })).body.data.amount, '20.00')
  t.equal((await call(oneStatement, 'PATCH', `/api/deals/${id}`, token, {})).status, 200, 'an empty update answers the record')
  t.equal((await call(oneStatement, 'DELETE', `/api/deals/${id}`, token)).status, 204)
  t.equal(oneStatement.queries.length, 4, 'four requests, four statements: no second query')
  for (const text of oneStatement.queries) {
    t.match(text, /crm\.resume_identity\(/, 'authentication travels in the statement')
    t.match(text, /\b(insert into|update|delete from) "crm"\."deals"/, 'and so does the write')
  }
  t.same(
    await eventsOf(id),
    ['deal.created', 'deal.updated', 'deal.deleted'],
    'each write wrote its event (an update that changes nothing, none)',
  )
})

t.test('the first request of a token is authenticated in a transaction of its own, then its write travels in one statement', async (t) => {
  // Its body is read only once the token is proven (test/hostile/unproven-bodies.test.ts), and the
  // route's scope was checked then, so the write may go with the resumed identity.
  const fresh = await withOwner(url, (client) => mintToken(client, ann.id))
  oneStatement.queries.length = 0
  t.equal((await call(oneStatement, 'POST', '/api/contacts', fresh, { first_name: 'First' })).status, 201)
  const writes = (text: string) => /\b(insert into|update|delete from) "crm"\./.test(text)
  t.ok(
    oneStatement.queries.some((text) => /crm\.authenticate\(/.test(text)) &&
      !oneStatement.queries.some((text) => /crm\.authenticate\(/.test(text) && writes(text)),
    'crm.authenticate ran with no write',
  )
  t.ok(
    oneStatement.queries.some((text) => /crm\.resume_identity\(/.test(text) && writes(text)),
    'the write travelled with the resumed identity',
  )
})

t.test('Idempotency-Key, If-Match and a scope that refuses take a transaction', async (t) => {
  const id = await record('contacts', tenant.id, ann.id)
  const cases: [string, () => Promise<TestResponse>, number][] = [
    [
      'Idempotency-Key',
      () => call(oneStatement, 'POST', '/api/contacts', ann.token, { first_name: 'Keyed' }, { 'idempotency-key': randomUUID() }),
      201,
    ],
    ['If-Match', () => call(oneStatement, 'PUT', `/api/contacts/${id}`, ann.token, { first_name: 'Matched' }, { 'if-match': '*' }), 200],
    ['a scope that refuses', () => call(oneStatement, 'DELETE', `/api/contacts/${id}`, actors.annContactsRead.token), 403],
  ]
  for (const [name, send, status] of cases) {
    oneStatement.queries.length = 0
    const answer = await send()
    t.equal(answer.status, status, name)
    t.ok(
      !oneStatement.queries.some(
        (text) => /crm\.(authenticate|resume_identity)\(/.test(text) && /\b(insert into|update|delete from) "crm"\./.test(text),
      ),
      `${name}: no write travelled with authentication`,
    )
  }
  t.equal((await call(oneStatement, 'DELETE', `/api/contacts/${id}`, actors.annContactsRead.token)).body.code, 'insufficient_scope')
})

t.test('a known token revoked writes nothing and answers 401', async (t) => {
  const member = await withOwner(url, (client) => addMember(client, tenant.id, `gone-${randomUUID()}@one.test`, 'member'))
  const token = member.token
  const id = await record('deals', tenant.id, member.id)
  t.equal((await call(oneStatement, 'GET', `/api/deals/${id}`, token)).status, 200, 'the identity is cached')
  await withOwner(url, (client) => client.query('update crm.tokens set revoked_at = now() where user_id = $1', [member.id]))
  for (const [method, path, body] of [
    ['POST', '/api/deals', { name: 'After revocation' }],
    ['PUT', `/api/deals/${id}`, { name: 'After revocation' }],
    ['DELETE', `/api/deals/${id}`, undefined],
  ] as const) {
    const answer = await call(oneStatement, method, path, token, body)
    t.equal(answer.status, 401, `${method} ${path}`)
    t.equal(answer.body.code, 'token_revoked')
  }
  const rows = await withOwner(url, (client) =>
    client.query("select count(*)::int as n from crm.deals where workspace_id = $1 and name = 'After revocation'", [tenant.id]),
  )
  t.equal(rows.rows[0].n, 0, 'nothing was created or renamed')
  t.same(await eventsOf(id), ['deal.created'], 'no event but its creation as the owner')
})

t.test('a write that fails in the database answers its problem, keeps the rate-limit headers and counts once', async (t) => {
  // A member only this process serves: the other process's counts for the same user would reach the
  // remaining figure whenever they settle.
  const { token } = await withOwner(url, (client) => addMember(client, tenant.id, `failing-${randomUUID()}@one.test`, 'admin'))
  t.equal((await call(oneStatement, 'GET', '/api/companies', token)).status, 200, 'the identity is cached')
  const before = Number((await call(oneStatement, 'GET', '/api/companies', token)).headers.get('ratelimit-remaining'))
  const failed = await call(oneStatement, 'POST', '/api/deals', token, { name: 'Nowhere', stage: 'no_such_stage' })
  t.equal(failed.status, 422, 'an unknown stage is refused by its foreign key')
  t.equal(failed.body.errors?.[0]?.pointer, '/stage')
  t.equal(Number(failed.headers.get('ratelimit-remaining')), before - 1, 'counted once, with its headers')
  const after = Number((await call(oneStatement, 'GET', '/api/companies', token)).headers.get('ratelimit-remaining'))
  t.equal(after, before - 2, 'the next request sees one count for the failed write')
})

t.test('a read that fails after its statement answered counts once', async (t) => {
  // A token's first request authenticates in full in its statement, which commits its count: the
  // 404 that follows must not count it a second time. A member of their own: the limit is per user.
  const member = await withOwner(url, (client) => addMember(client, tenant.id, `counted-${randomUUID()}@one.test`, 'member'))
  t.equal((await call(oneStatement, 'GET', `/api/deals/${randomUUID()}`, member.token)).status, 404)
  const counted = await withOwner(url, (client) =>
    client.query('select coalesce(sum(count), 0)::int as n from crm.rate_limit_counters where user_id = $1', [member.id]),
  )
  t.equal(counted.rows[0].n, 1, 'one request, one count in the database')
})

/** What a client can compare across the two processes: the status, the problem's code, the record minus what differs per twin. */
function comparable(answer: TestResponse) {
  const data = answer.body?.data
  if (!data) return { status: answer.status, code: answer.body?.code ?? null }
  const { id, created_at, updated_at, stage_changed_at, ...fields } = data
  return { status: answer.status, fields }
}

t.test('property: a write answers and leaves the same in one statement as in a transaction', async (t) => {
  const others = { bob: tenant.members['bob@one.test'].id, eve: elsewhere.members['eve@else.test'].id }
  const arbitrary = fc.record({
    actor: fc.constantFrom(...(Object.keys(actors) as (keyof typeof actors)[])),
    type: fc.constantFrom(...(Object.keys(TYPES) as TypePath[])),
    operation: fc.constantFrom('create', 'update', 'empty update', 'delete'),
    target: fc.constantFrom('own', 'colleague', 'other workspace', 'missing'),
    body: fc.constantFrom<Record<string, unknown>>(
      { name: 'Renamed' },
      { name: 'Renamed', owner_id: ann.id },
      { owner_id: others.bob },
      { owner_id: randomUUID() },
      { custom_fields: { tier: 'gold' } },
      { name: '' },
    ),
  })
  await fc.assert(
    fc.asyncProperty(arbitrary, async ({ actor, type, operation, target, body }) => {
      const member = actors[actor]
      const twin = async () =>
        target === 'missing'
          ? randomUUID()
          : record(
              type,
              target === 'other workspace' ? elsewhere.id : tenant.id,
              target === 'own' ? member.id : target === 'other workspace' ? others.eve : others.bob,
            )
      // A contact's name is its first_name.
      const fields = Object.fromEntries(Object.entries(body).map(([key, value]) => [key === 'name' ? TYPES[type].name : key, value]))
      const send = async (server: Server) => {
        const id = await twin()
        const path = `/api/${type}/${id}`
        const answer =
          operation === 'create'
            ? await call(server, 'POST', `/api/${type}`, member.token, fields)
            : operation === 'delete'
              ? await call(server, 'DELETE', path, member.token)
              : await call(server, 'PUT', path, member.token, operation === 'empty update' ? {} : fields)
        const written = answer.body?.data?.id ?? id
        const state = await withOwner(url, async (client) => {
          const { rows } = await client.query(
            `select ${TYPES[type].name} as name, owner_id, custom_fields from ${TYPES[type].table} where id = $1`,
            [written],
          )
          return rows[0] ?? null
        })
        return { answer: comparable(answer), state, events: await eventsOf(written) }
      }
      const one = await send(oneStatement)
      const transaction = await send(inTransaction)
      // Thrown, not asserted: fast-check then shrinks a difference to its smallest case.
      deepStrictEqual(one, transaction, `${actor} ${operation} ${type} (${target}) ${JSON.stringify(body)}`)
      if (one.answer.status >= 500) throw new Error(`a write answered ${one.answer.status}`)
    }),
    { numRuns: 120 },
  )
  t.pass('120 writes answered and left the same on both paths')
})
