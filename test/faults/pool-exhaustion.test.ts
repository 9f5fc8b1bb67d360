// A full connection pool: requests wait a bounded time for a connection, then get 503 with
// Retry-After; the admitted ones finish normally once the database moves again.
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t, { env: { DB_POOL_SIZE: '2', DB_WAIT_MS: '300' } })
const { members } = await createTenant(server.databaseUrl, { members: { 'ada@acme.test': 'admin' } })
const token = members['ada@acme.test'].token

t.test('requests beyond the pool wait, then get 503', async (t) => {
  const blocker = await ownerClient(t, server.databaseUrl)
  await blocker.query('begin')
  // Every authenticated request counts itself in this table: holding it stalls them all.
  await blocker.query('lock table crm.rate_limit_counters in access exclusive mode')
  const pending = Array.from({ length: 5 }, () => server.request('GET', '/api/me', { token }))
  // Three answer while the table is still locked: they waited DB_WAIT_MS, not for the database.
  let answered = 0
  await new Promise<void>((resolve) => {
    const count = () => ++answered === 3 && resolve()
    for (const request of pending) request.then(count, count)
  })
  t.equal(answered, 3, 'three answered while the database stood still')
  await blocker.query('rollback')
  const responses = await Promise.all(pending)
  const statuses = responses.map((response) => response.status).sort()
  t.same(statuses, [200, 200, 503, 503, 503], 'two admitted, three shed')
  const shed = responses.find((response) => response.status === 503)!
  t.equal(shed.body.code, 'unavailable')
  t.equal(shed.headers.get('retry-after'), '5')
  t.equal((await server.request('GET', '/api/me', { token })).status, 200, 'and the service recovers by itself')
})
