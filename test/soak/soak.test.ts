// Soak: mixed reads, writes (creates with Idempotency-Key, updates), CSV imports and webhooks
// against a real `crm serve --no-worker` and `crm worker` for SOAK_SECONDS (20 in `make test`,
// 300 in `make soak`). No 5xx and no connection error, memory of the API process flat, nothing
// lost; prints one markdown summary line (requests, p50/p99, RSS by quarter) on stderr.
import t from 'tap'
import { checkEvents, checkEveryEventDelivered, checkNoLostWrites } from '../faults/invariants.ts'
import { Load } from '../faults/load.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { eventually, ownerQuery, sleep, startCrm } from '../helpers/processes.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from '../webhooks/receiver.ts'

const SECONDS = Number(process.env.SOAK_SECONDS ?? 20)
const ENV = { ...WEBHOOK_TEST_ENV, RATE_LIMIT_PER_MINUTE: '1000000', LOG_LEVEL: 'warn' }
if (SECONDS > 100) t.setTimeout((SECONDS + 240) * 1000)

t.test(`soak for ${SECONDS} s: mixed reads, writes, imports and webhooks`, async (t) => {
  const databaseUrl = await createTestDatabase(t)
  const tenant = await createTenant(databaseUrl, { plan: 'pro', members: { 'admin@soak.test': 'admin' } })
  const token = tenant.members['admin@soak.test'].token
  const receiver = await startReceiver(t)
  const api = await startCrm(t, 'api', { databaseUrl, env: ENV })
  const worker = await startCrm(t, 'worker', { databaseUrl, env: ENV })
  const subscription = await fetch(`${api.url}/api/webhook-subscriptions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'soak', url: receiver.url, events: ['contact.*'] }),
  })
  t.equal(subscription.status, 201, 'subscription created')

  const load = new Load({ urls: [api.url], token, concurrency: 4, importEveryMs: 2000, importRows: 25 })
  const rss: number[] = []
  const started = Date.now()
  load.start()
  while (Date.now() - started < SECONDS * 1000) {
    await sleep(1000)
    const kib = api.rssKiB()
    if (kib !== null) rss.push(kib)
  }
  await load.stop()
  const elapsed = (Date.now() - started) / 1000

  // Imports finish on the worker: wait for each, then check its rows landed.
  const jobs = await eventually(
    'every import finished',
    async () => {
      const all = await Promise.all(
        load.imports.map(async (job) => {
          const response = await fetch(`${api.url}/api/contacts/import/${job.id}`, { headers: { authorization: `Bearer ${token}` } })
          return ((await response.json()) as { data: { status: string; counts: { created: number } } }).data
        }),
      )
      return all.every((job) => job.status === 'completed' || job.status === 'failed') ? all : null
    },
    60_000,
    500,
  )
  t.ok(load.imports.length > 0, `${load.imports.length} imports started`)
  t.ok(
    jobs.every((job) => job.status === 'completed' && job.counts.created === load.options.importRows),
    `every import completed with all ${load.options.importRows} rows`,
  )

  const summary = load.summary()
  const fiveHundreds = Object.values(summary.byKind).reduce(
    (n, kind) =>
      n +
      Object.entries(kind.statuses)
        .filter(([status]) => status.startsWith('5'))
        .reduce((m, [, c]) => m + c, 0),
    0,
  )
  const connectionErrors = Object.values(summary.byKind).reduce(
    (n, kind) =>
      n +
      Object.entries(kind.statuses)
        .filter(([status]) => status.startsWith('error:'))
        .reduce((m, [, c]) => m + c, 0),
    0,
  )
  t.equal(fiveHundreds, 0, `no 5xx in ${summary.requests} requests`)
  t.equal(connectionErrors, 0, 'no connection error and no hang')
  t.same(load.unexpected, [], 'no unexpected status')
  t.same(load.abandoned, [], 'no create gave up')

  // Memory, sampled every second. V8 and malloc grow to a working size while the load warms up; a
  // leak shows as growth that goes on. So: the loose bound over the whole run, and for runs long
  // enough to have a steady state, the last quarter against the third (the second half is flat).
  const mean = (values: number[]) => Math.round(values.reduce((a, b) => a + b, 0) / Math.max(1, values.length))
  const quarters = [0, 1, 2, 3].map((i) => mean(rss.slice(Math.floor((i * rss.length) / 4), Math.floor(((i + 1) * rss.length) / 4))))
  const mib = (kib: number) => Math.round(kib / 1024)
  const first = quarters[0]
  const last = quarters[3]
  const peak = Math.max(...rss)
  t.ok(
    last < Math.max(first * 2, first + 150 * 1024),
    `API RSS bounded: first quarter ${mib(first)} MiB, last quarter ${mib(last)} MiB, peak ${mib(peak)} MiB`,
  )
  if (SECONDS >= 120) {
    t.ok(
      last - quarters[2] < Math.max(quarters[2] * 0.1, 16 * 1024),
      `API RSS flat over the second half: ${mib(quarters[2])} → ${mib(last)} MiB`,
    )
  }

  const emails = load.imports.flatMap((job) => job.emails)
  const [landed] = await ownerQuery(
    databaseUrl,
    `select count(*)::int as n from crm.contacts where workspace_id = $1 and email = any($2::text[])`,
    [tenant.id, emails],
  )
  t.equal(landed.n, emails.length, `every imported row is in the database (${emails.length})`)
  await checkNoLostWrites(t, databaseUrl, tenant.id, load)
  await checkEvents(t, databaseUrl, tenant.id, load)
  const events = await checkEveryEventDelivered(t, databaseUrl, tenant.id, [receiver], 120_000)
  t.ok(api.running() && worker.running(), 'both processes are still up')
  t.same(api.errorLines().concat(worker.errorLines()).slice(0, 5), [], 'nothing logged at level error')

  const kinds = Object.entries(summary.byKind)
    .map(([kind, stats]) => `${kind} ${stats.count} (p50 ${stats.p50} / p99 ${stats.p99} ms)`)
    .join(', ')
  console.error(
    `| soak ${Math.round(elapsed)} s | ${summary.requests} requests (${Math.round(summary.requests / elapsed)}/s): ${kinds} | p50 ${summary.p50} ms, p99 ${summary.p99} ms | ` +
      `${load.imports.length} imports × ${load.options.importRows} rows | ${events} events delivered (${receiver.received.length} webhook requests) | ` +
      `API RSS by quarter ${quarters.map(mib).join(' → ')} MiB, peak ${mib(peak)} MiB | 0 lost, 0 doubled |`,
  )
})
