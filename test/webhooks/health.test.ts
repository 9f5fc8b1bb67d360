// Honest webhook statistics (docs/api.md section 7): stats.success_rate counts every attempt of the
// last 24 hours, a retrying delivery's failures included, so an endpoint refusing connections never
// shows 100 %; health is paused, failing (the last 3 attempts failed) or healthy; test deliveries
// never count; both are read through one index.
import fc from 'fast-check'
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV, waitUntil } from './receiver.ts'

const BASE = '/api/webhook-subscriptions'

/** An attempt as the property draws it: its outcome, how many hours ago it started, whether its delivery is a test. */
type DrawnAttempt = { ok: boolean; hoursAgo: number; test: boolean }

const drawnAttempt = fc.record({
  // Failures twice as likely: three in a row (failing) comes up often.
  ok: fc.constantFrom(true, false, false),
  // Whole hours, never 24: an attempt is clearly inside or outside the window however long the run takes.
  hoursAgo: fc.oneof(fc.integer({ min: 0, max: 23 }), fc.integer({ min: 25, max: 60 })),
  test: fc.boolean(),
})

/** What section 7 says: successes over all non-test attempts started in the last 24 hours, 4 decimals, or null. */
function expectedSuccessRate(attempts: DrawnAttempt[]): number | null {
  const counted = attempts.filter((a) => !a.test && a.hoursAgo < 24)
  if (counted.length === 0) return null
  return Math.round((counted.filter((a) => a.ok).length / counted.length) * 10_000) / 10_000
}

/** What section 7 says of health; attempt i starts i seconds before the hour it is drawn at, so the order is total. */
function expectedHealth(attempts: DrawnAttempt[], paused: boolean): string {
  if (paused) return 'paused'
  const latest = attempts
    .map((attempt, i) => ({ ...attempt, i }))
    .filter((a) => !a.test)
    .sort((a, b) => a.hoursAgo - b.hoursAgo || a.i - b.i)
    .slice(0, 3)
  return latest.length === 3 && latest.every((a) => !a.ok) ? 'failing' : 'healthy'
}

t.test('success_rate and health follow the rule for any attempts, whatever state their deliveries are in', async (t) => {
  const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const owner = await ownerClient(t, server.databaseUrl)

  await fc.assert(
    fc.asyncProperty(fc.array(drawnAttempt, { maxLength: 12 }), fc.boolean(), async (attempts, paused) => {
      const created = await server.request('POST', BASE, {
        token,
        body: { name: 'p', url: 'http://127.0.0.1:1/', events: ['*'] },
      })
      const id = created.body.data.id
      // Each attempt its own retrying delivery, started at a distinct time.
      for (const [i, attempt] of attempts.entries()) {
        await owner.query(
          `with d as (
             insert into crm.webhook_deliveries (workspace_id, subscription_id, event_id, event, record_type, record_id, status,
                                                 attempt_count, cycle_attempts, is_test, test_event)
             values ($1, $2, gen_random_uuid(), 'contact.created', 'contact', gen_random_uuid(), 'retrying', 1, 1, $3,
                     case when $3 then '{"data": {"object": {}}, "actor": {}}'::jsonb end)
             returning workspace_id, id, subscription_id, is_test)
           insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, response_status, error,
                                             subscription_id, is_test)
           select d.workspace_id, d.id, 1, now() - make_interval(hours => $4, secs => $5), 5,
                  case when $6 then 200 end, case when $6 then null else 'connection_refused' end, d.subscription_id, d.is_test
             from d`,
          [tenant.id, id, attempt.test, attempt.hoursAgo, i, attempt.ok],
        )
      }
      if (paused) t.equal((await server.request('POST', `${BASE}/${id}/pause`, { token })).status, 200)
      const read = await server.request('GET', `${BASE}/${id}`, { token })
      t.equal(read.status, 200)
      const expected = { success_rate: expectedSuccessRate(attempts), health: expectedHealth(attempts, paused) }
      const got = { success_rate: read.body.data.stats.success_rate, health: read.body.data.health }
      t.same(got, expected, JSON.stringify({ attempts, paused }))
      t.equal((await server.request('DELETE', `${BASE}/${id}`, { token })).status, 204)
      return got.success_rate === expected.success_rate && got.health === expected.health
    }),
    { numRuns: 40 },
  )
})

t.test('an endpoint that starts refusing connections no longer shows 100 %', async (t) => {
  // A long schedule: a failed first attempt leaves its delivery retrying for the rest of the test.
  const server = await startTestServer(t, { worker: true, env: { ...WEBHOOK_TEST_ENV, WEBHOOK_RETRY_SCHEDULE: '1h,1h,1h,1h,1h,1h' } })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  const subscription = (
    await server.request('POST', BASE, { token, body: { name: 'Refusing', url: receiver.url, events: ['contact.created'] } })
  ).body.data
  const read = async () => (await server.request('GET', `${BASE}/${subscription.id}`, { token })).body.data
  for (const email of ['a@example.com', 'b@example.com']) await server.request('POST', '/api/contacts', { token, body: { email } })
  await waitUntil(async () => (await read()).stats.success_rate === 1, 15_000, 'two delivered')
  t.equal((await read()).health, 'healthy')

  // Port 1 on loopback refuses every connection.
  t.equal((await server.request('PATCH', `${BASE}/${subscription.id}`, { token, body: { url: 'http://127.0.0.1:1/' } })).status, 200)
  for (const email of ['c@example.com', 'd@example.com', 'e@example.com'])
    await server.request('POST', '/api/contacts', { token, body: { email } })
  const retrying = await waitUntil(
    async () => {
      const log = await server.request('GET', `${BASE}/${subscription.id}/deliveries?status=retrying`, { token })
      return log.body.data.length === 3 ? log.body.data : null
    },
    15_000,
    'three retrying deliveries',
  )
  t.ok(
    retrying.every((d: { attempt_count: number }) => d.attempt_count === 1),
    'each failed once and waits for its next attempt',
  )
  const after = await read()
  t.match(after.stats, { success_rate: 0.4, attempts_24h: 5, deliveries_24h: 5 }, '2 successes of 5 attempts, not 2 of 2 final deliveries')
  t.equal(after.health, 'failing', 'the last 3 attempts failed')
  t.equal((await server.request('POST', `${BASE}/${subscription.id}/pause`, { token })).body.data.health, 'paused')
})

t.test('the statistics read a subscription’s recent attempts through an index, not its whole log', async (t) => {
  const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const owner = await ownerClient(t, server.databaseUrl)
  const ids: string[] = []
  for (const name of ['busy', 'quiet'])
    ids.push((await server.request('POST', BASE, { token, body: { name, url: 'http://127.0.0.1:1/', events: ['*'] } })).body.data.id)
  // 30 days of a busy subscription's log: 3,000 deliveries with 2 attempts each.
  await owner.query(
    `with d as (
       insert into crm.webhook_deliveries (workspace_id, subscription_id, event_id, event, record_type, record_id, status,
                                           attempt_count, cycle_attempts, created_at, completed_at)
       select $1, $2, gen_random_uuid(), 'contact.created', 'contact', gen_random_uuid(), 'delivered', 2, 2,
              now() - make_interval(mins => g * 14), now() - make_interval(mins => g * 14)
         from generate_series(1, 3000) g
       returning workspace_id, id, subscription_id, created_at)
     insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, response_status, error,
                                       subscription_id, is_test)
     select d.workspace_id, d.id, n, d.created_at + make_interval(secs => n), 5, case n when 1 then 500 else 200 end,
            case n when 1 then 'http_status' end, d.subscription_id, false
       from d cross join generate_series(1, 2) n`,
    [tenant.id, ids[0]],
  )
  await owner.query('analyze crm.webhook_deliveries, crm.webhook_attempts')
  await owner.query('begin')
  await owner.query('select crm.webhook_subscription_json($1, $2)', [tenant.id, ids[0]])
  const { rows: scans } = await owner.query(
    `select seq_scan, idx_scan from pg_stat_xact_user_tables where schemaname = 'crm' and relname = 'webhook_attempts'`,
  )
  await owner.query('commit')
  t.same(scans, [{ seq_scan: '0', idx_scan: '2' }], 'two index scans of the attempts (rate and health), no sequential scan')
  const read = await server.request('GET', `${BASE}/${ids[0]}`, { token })
  t.equal(read.body.data.stats.success_rate, 0.5)
})
