// A request the service refuses keeps its database connection. The pools' libraries close a
// connection after any error by default (pg's Pool.query, slonik's connection handler), so every
// 4xx decided in the database cost the next request a new backend: its start, its caches and its
// PL/pgSQL functions built again (src/db/pool.ts, transactionKeepingConnection;
// src/db/request/statement-pool.ts, runStatement). Whatever mix of refusals comes (decided in SQL
// inside a request transaction or in a single statement, or before the database), the server's
// backends stay the ones it had.
import { randomUUID } from 'node:crypto'
import fc from 'fast-check'
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant, mintToken } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const owner = await ownerClient(t, server.databaseUrl)
const tenant = await createTenant(server.databaseUrl, {
  members: { 'admin@acme.test': 'admin', 'reader@acme.test': 'read_only' },
})
const admin = tenant.members['admin@acme.test']
const reader = tenant.members['reader@acme.test']
const narrowAdmin = await mintToken(owner, admin.id, { scopes: ['workspace:admin'] })
const created = await server.request('POST', '/api/deals', { token: admin.token, body: { name: 'Kept', stage: 'lead' } })
const dealId: string = created.body.data.id

type Refusal = { label: string; send: () => Promise<{ status: number }>; status: number }
const refusals: Refusal[] = [
  {
    label: 'a deal that is not there (single statement)',
    send: () => server.request('GET', `/api/deals/${randomUUID()}`, { token: admin.token }),
    status: 404,
  },
  {
    label: 'a read-only member creates (request transaction)',
    send: () => server.request('POST', '/api/deals', { token: reader.token, body: { name: 'No', stage: 'lead' } }),
    status: 403,
  },
  {
    label: 'an owner who is not a member (a constraint in SQL)',
    send: () => server.request('POST', '/api/deals', { token: admin.token, body: { name: 'No', stage: 'lead', owner_id: randomUUID() } }),
    status: 422,
  },
  {
    label: 'a stale If-Match',
    send: () =>
      server.request('PATCH', `/api/deals/${dealId}`, { token: admin.token, headers: { 'if-match': '"stale"' }, body: { name: 'No' } }),
    status: 412,
  },
  {
    label: 'a scoped token widens a role (refused by a rule in SQL)',
    send: () => server.request('POST', '/api/roles', { token: narrowAdmin, body: { name: 'boss', is_admin: true } }),
    status: 403,
  },
]

/** The server's backends: every client backend of the test database but the owner's own. */
async function serverBackends(): Promise<Set<number>> {
  const { rows } = await owner.query<{ pid: number }>(
    `select pid from pg_stat_activity where datname = current_database() and backend_type = 'client backend' and pid <> pg_backend_pid()`,
  )
  return new Set(rows.map((row) => row.pid))
}

t.test('refusals, in any order, open no new connection', async (t) => {
  // Each kind once, and a success on each pool, before counting: the pools open what they need.
  for (const refusal of refusals) t.equal((await refusal.send()).status, refusal.status, refusal.label)
  t.equal((await server.request('GET', `/api/deals/${dealId}`, { token: admin.token })).status, 200)
  t.equal((await server.request('PATCH', `/api/deals/${dealId}`, { token: admin.token, body: { name: 'Kept' } })).status, 200)
  const before = await serverBackends()
  const opened = new Set<number>()
  let answered = 0
  await fc.assert(
    fc.asyncProperty(fc.array(fc.constantFrom(...refusals), { minLength: 1, maxLength: 8 }), async (sequence) => {
      for (const refusal of sequence) {
        const { status } = await refusal.send()
        if (status !== refusal.status) throw new Error(`${refusal.label}: answered ${status}, not ${refusal.status}`)
        answered++
        for (const pid of await serverBackends()) if (!before.has(pid)) opened.add(pid)
      }
    }),
    { numRuns: 20 },
  )
  // A pool may still replace a connection its idle timer closed meanwhile (the request pool keeps
  // one, the others none): a couple, against one per refusal when refusals closed them.
  t.ok(answered >= 20, `${answered} refusals`)
  t.ok(opened.size <= 2, `${opened.size} new connections for ${answered} refusals`)
})
