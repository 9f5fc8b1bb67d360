// Scale-out: two API processes and two worker processes against one database. The per-user rate
// limit holds across the API processes (600 a clock minute, with at most one batch of 6 more: the
// bound in the README), every
// event reaches the receiver at least once, and no delivery is ever attempted twice at the same
// time (no two attempt rows of one delivery overlap), although the two workers share the jobs and
// every first attempt fails so each delivery is retried.
import t from 'tap'
import { checkEveryEventDelivered } from '../faults/invariants.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { ownerQuery, sleep, startCrm } from '../helpers/processes.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from '../webhooks/receiver.ts'

const ENV = { ...WEBHOOK_TEST_ENV, LOG_LEVEL: 'warn', RATE_LIMIT_PER_MINUTE: '600' }

async function call(url: string, token: string, method: string, path: string, body?: unknown) {
  const response = await fetch(url + path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  })
  const text = await response.text()
  return { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : null }
}

/** Runs `fn(i)` for i in [0, n) with at most `concurrency` at once. */
async function pooled<T>(n: number, concurrency: number, fn: (i: number) => Promise<T>): Promise<T[]> {
  const results: T[] = new Array(n)
  let next = 0
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const i = next++
        results[i] = await fn(i)
      }
    }),
  )
  return results
}

const databaseUrl = await createTestDatabase(t)
const tenant = await createTenant(databaseUrl, { plan: 'pro', members: { 'admin@scale.test': 'admin', 'busy@scale.test': 'member' } })
const admin = tenant.members['admin@scale.test'].token
const busy = tenant.members['busy@scale.test'].token
const apis = [await startCrm(t, 'api', { databaseUrl, env: ENV }), await startCrm(t, 'api', { databaseUrl, env: ENV })]
// At debug level a worker logs every job it completes: proof that both took their share.
const COMPLETED_DELIVERY = /Completed task \d+ \((?:deliver_webhook|fan_out_event)/
const workerOptions = { databaseUrl, env: { ...ENV, LOG_LEVEL: 'debug' }, count: [COMPLETED_DELIVERY] }
const workers = [await startCrm(t, 'worker', workerOptions), await startCrm(t, 'worker', workerOptions)]

t.test('the rate limit holds across two API processes: 600 a minute, at most one batch more, then 429', async (t) => {
  // The window is the clock minute: start early in one so that every request fits in it.
  const [{ left }] = await ownerQuery(databaseUrl, `select 60 - floor(extract(second from now()))::int as left`)
  if (left < 40) await sleep(left * 1000 + 200)
  const [{ minute }] = await ownerQuery(databaseUrl, `select date_trunc('minute', now())::text as minute`)
  const answers = await pooled(600, 8, (i) => call(apis[i % 2].url, busy, 'GET', '/api/me'))
  t.same(
    answers.reduce<Record<number, number>>((counts, answer) => {
      counts[answer.status] = (counts[answer.status] ?? 0) + 1
      return counts
    }, {}),
    { 200: 600 },
    'the first 600 requests, spread over both API processes, are answered',
  )
  const remaining = answers.map((answer) => Number(answer.headers.get('ratelimit-remaining')))
  // Each process knows its own requests and the others' once settled (every 250 ms, or a batch of
  // 6): the headers may lag by what the other process has not settled yet.
  t.ok(Math.min(...remaining) <= 6, `the last of them says at most 6 remaining (${Math.min(...remaining)})`)
  // Past 600, each process admits what its view of the other's count still allows: at most one
  // batch (6) more in all, then every request is refused.
  let extra = 0
  for (const [index, api] of apis.entries()) {
    for (;;) {
      const answer = await call(api.url, busy, 'GET', '/api/me')
      if (answer.status === 200) {
        extra++
        if (extra > 6) break
        continue
      }
      t.equal(answer.status, 429, `API process ${index + 1} refuses`)
      t.equal(answer.body?.code, 'rate_limited', 'code rate_limited')
      t.ok(Number(answer.headers.get('retry-after')) > 0, 'with Retry-After')
      break
    }
  }
  t.ok(extra <= 6, `${extra} admitted past 600: within 600 + (2 − 1) × 6`)
  const [{ minute: minuteAfter }] = await ownerQuery(databaseUrl, `select date_trunc('minute', now())::text as minute`)
  t.equal(minuteAfter, minute, 'every request fell in one clock minute')
  const other = await call(apis[0].url, admin, 'GET', '/api/me')
  t.equal(other.status, 200, 'another user is not affected')
})

t.test('two workers: every event delivered at least once, no delivery attempted twice at once', async (t) => {
  const receiver = await startReceiver(t)
  // Every delivery fails its first attempt (and answers slowly), so each is retried, by either worker.
  const seen = new Set<string>()
  receiver.answer = (request) => {
    const id = String(request.headers['x-service-delivery-id'])
    if (seen.has(id)) return { status: 200, delayMs: 20 }
    seen.add(id)
    return { status: 500, delayMs: 60 }
  }
  const created = await call(apis[0].url, admin, 'POST', '/api/webhook-subscriptions', { name: 'scale', url: receiver.url, events: ['*'] })
  t.equal(created.status, 201, 'subscription created')

  const contacts = await pooled(120, 6, (i) => call(apis[i % 2].url, admin, 'POST', '/api/contacts', { first_name: `Scale ${i}` }))
  t.ok(
    contacts.every((answer) => answer.status === 201),
    '120 contacts created through both API processes',
  )
  const updates = await pooled(60, 6, (i) =>
    call(apis[i % 2].url, admin, 'PATCH', `/api/contacts/${contacts[i].body.data.id}`, { job_title: `Role ${i}` }),
  )
  t.ok(
    updates.every((answer) => answer.status === 200),
    '60 updates through both API processes',
  )

  const events = await checkEveryEventDelivered(t, databaseUrl, tenant.id, [receiver], 90_000)
  t.equal(events, 180, '180 events')
  const [attempts] = await ownerQuery(
    databaseUrl,
    `select count(*)::int as n, count(distinct delivery_id)::int as deliveries from crm.webhook_attempts where workspace_id = $1`,
    [tenant.id],
  )
  t.ok(attempts.n >= 2 * attempts.deliveries, `every delivery was retried (${attempts.n} attempts for ${attempts.deliveries} deliveries)`)
  const overlapping = await ownerQuery(
    databaseUrl,
    `select a.delivery_id, a.attempt as first, b.attempt as second
       from crm.webhook_attempts a
       join crm.webhook_attempts b on b.workspace_id = a.workspace_id and b.delivery_id = a.delivery_id and b.attempt > a.attempt
      where a.workspace_id = $1
        and b.started_at < a.started_at + make_interval(secs => a.duration_ms / 1000.0)
        and a.started_at < b.started_at + make_interval(secs => b.duration_ms / 1000.0)`,
    [tenant.id],
  )
  t.same(overlapping.slice(0, 5), [], 'no two attempts of one delivery overlap in time')
  const [beats] = await ownerQuery(databaseUrl, `select count(distinct host)::int as hosts from crm.worker_heartbeats`)
  t.equal(beats.hosts, 2, 'both worker processes are alive and beating')
  const shares = workers.map((worker) => worker.count(COMPLETED_DELIVERY))
  t.ok(
    shares.every((n) => n > 0),
    `both workers ran delivery jobs (${shares.join(' and ')})`,
  )
  const extra = receiver.received.length - attempts.n
  t.same(
    apis
      .concat(workers)
      .flatMap((p) => p.errorLines())
      .slice(0, 5),
    [],
    'no process logged an error',
  )
  console.error(
    `# scale-out: 2 API + 2 worker processes; ${events} events, ${attempts.deliveries} deliveries, ${attempts.n} attempts, no overlap; delivery jobs per worker ${shares.join('/')}; receiver saw ${receiver.received.length} requests (${extra} unrecorded)`,
  )
})
