// PostgreSQL goes away under load and comes back on the same port. While it is down the API
// answers 503 unavailable with Retry-After (never 500, never a hang) and /readyz says 503; when it
// is back the API recovers by itself, the worker reconnects and deliveries continue, and nothing
// confirmed before, during or after the outage is lost or doubled. The test runs its own embedded
// cluster in a temporary directory so it can stop and start it.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { migrate } from '../../src/db/migrate.ts'
import { type ProvisionedDatabase, startEmbeddedPostgres } from '../../src/db/provision.ts'
import { testPostgresBuild } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { eventually, sleep, startCrm } from '../helpers/processes.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from '../webhooks/receiver.ts'
import { checkEvents, checkEveryEventDelivered, checkNoLostWrites } from './invariants.ts'
import { Load } from './load.ts'

const ENV = { ...WEBHOOK_TEST_ENV, RATE_LIMIT_PER_MINUTE: '1000000', LOG_LEVEL: 'warn' }

t.test('restart PostgreSQL under load: 503 with Retry-After meanwhile, then recovery by itself', async (t) => {
  const baseDir = mkdtempSync(join(tmpdir(), 'crm-fault-pg-'))
  let database: ProvisionedDatabase = await startEmbeddedPostgres({
    baseDir,
    database: 'crm',
    durability: 'none',
    nativeDir: testPostgresBuild(),
  })
  t.teardown(async () => {
    await database.stop().catch(() => {})
    rmSync(baseDir, { recursive: true, force: true })
  })
  const databaseUrl = database.url
  const port = Number(new URL(databaseUrl).port)
  await migrate(databaseUrl)

  const tenant = await createTenant(databaseUrl, { plan: 'pro', members: { 'admin@pg.test': 'admin' } })
  const token = tenant.members['admin@pg.test'].token
  const receiver = await startReceiver(t)
  const api = await startCrm(t, 'api', { databaseUrl, env: ENV })
  const worker = await startCrm(t, 'worker', { databaseUrl, env: ENV })
  const created = await fetch(`${api.url}/api/webhook-subscriptions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'pg', url: receiver.url, events: ['contact.*'] }),
  })
  t.equal(created.status, 201, 'subscription created')

  const load = new Load({ urls: [api.url], token, concurrency: 4 })
  load.start()
  await sleep(2500)
  const deliveredBefore = receiver.received.length
  t.ok(deliveredBefore > 0, `deliveries flowed before the outage (${deliveredBefore})`)

  await database.stop()
  const downAt = Date.now()

  // During the outage: probes of each kind; every answer is 503 unavailable with Retry-After.
  const probes: { what: string; status: number; code?: string; retryAfter: string | null; ms: number }[] = []
  while (Date.now() - downAt < 4000) {
    for (const [what, init, path] of [
      ['GET /api/me', { method: 'GET' }, '/api/me'],
      ['GET /api/contacts', { method: 'GET' }, '/api/contacts?limit=5'],
      ['POST /api/contacts', { method: 'POST', body: JSON.stringify({ first_name: 'Outage' }) }, '/api/contacts'],
    ] as const) {
      const started = Date.now()
      const response = await fetch(api.url + path, {
        ...init,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        signal: AbortSignal.timeout(20_000),
      })
      const body = (await response.json().catch(() => null)) as { code?: string } | null
      probes.push({
        what,
        status: response.status,
        code: body?.code,
        retryAfter: response.headers.get('retry-after'),
        ms: Date.now() - started,
      })
    }
    await sleep(200)
  }
  const ready = await fetch(`${api.url}/readyz`, { signal: AbortSignal.timeout(20_000) })
  await ready.arrayBuffer()
  const health = await fetch(`${api.url}/healthz`, { signal: AbortSignal.timeout(20_000) })
  await health.arrayBuffer()
  const wrong = probes.filter((probe) => probe.status !== 503 || probe.code !== 'unavailable' || !probe.retryAfter)
  t.same(wrong.slice(0, 5), [], `every one of ${probes.length} requests during the outage answered 503 unavailable with Retry-After`)
  t.ok(Math.max(...probes.map((probe) => probe.ms)) < 15_000, `none hung (slowest ${Math.max(...probes.map((probe) => probe.ms))} ms)`)
  t.equal(ready.status, 503, '/readyz says 503 while the database is down')
  t.equal(health.status, 200, '/healthz still says the process is up')
  t.ok(api.running(), 'the API survived the outage', { lines: api.lines.slice(-15) })
  t.ok(worker.running(), 'the worker survived the outage', { lines: worker.lines.slice(-80) })

  database = await startEmbeddedPostgres({ baseDir, database: 'crm', durability: 'none', port, nativeDir: testPostgresBuild() })
  const upAt = Date.now()
  await eventually(
    'the API answers 200 again',
    async () => {
      const response = await fetch(`${api.url}/api/me`, {
        headers: { authorization: `Bearer ${token}` },
        signal: AbortSignal.timeout(20_000),
      })
      await response.arrayBuffer()
      return response.status === 200
    },
    30_000,
    200,
  )
  const recoveredMs = Date.now() - upAt
  t.pass(`the API recovered by itself ${recoveredMs} ms after PostgreSQL came back`)
  const readyAgain = await eventually(
    '/readyz 200',
    async () => {
      const response = await fetch(`${api.url}/readyz`)
      await response.arrayBuffer()
      return response.status === 200
    },
    30_000,
    200,
  )
  t.ok(readyAgain, '/readyz says 200 again')

  const confirmedAtRestart = load.confirmed.size
  await sleep(3000)
  await load.stop()
  t.ok(load.confirmed.size > confirmedAtRestart, `creates went on after the restart (${confirmedAtRestart} → ${load.confirmed.size})`)
  t.same(load.unexpected, [], 'no 500 and no unexpected status under load (503 unavailable with Retry-After only)')
  t.equal(load.hangs, 0, 'no request hung')
  t.same(load.abandoned, [], 'every create eventually succeeded with its key')

  await checkNoLostWrites(t, databaseUrl, tenant.id, load)
  await checkEvents(t, databaseUrl, tenant.id, load)
  const events = await checkEveryEventDelivered(t, databaseUrl, tenant.id, [receiver], 60_000)
  t.ok(api.running() && worker.running(), 'the API and the worker are still the original processes')
  const workerRestarts = worker.lines.filter((line) => line.includes('worker restarted')).length
  const summary = load.summary()
  const shed = Object.values(summary.byKind).reduce((n, kind) => n + (kind.statuses['503'] ?? 0), 0)
  console.error(
    `# postgres restart: ${probes.length} probes during the outage all 503 + Retry-After; API recovered ${recoveredMs} ms after restart, worker runner restarted ${workerRestarts}x in-process; ` +
      `${summary.requests} load requests (${shed} answered 503), ${load.confirmed.size} creates confirmed (${load.retriedCreates} retries), ${events} events all delivered`,
  )
})
