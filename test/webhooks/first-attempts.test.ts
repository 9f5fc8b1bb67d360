// First attempts made by fan_out_event before their delivery rows exist: the row is created with
// the attempt, in the state it left the delivery in; a re-run after a crash sends again what was
// not recorded, with the same delivery id, and creates nothing twice. Also the read's held and
// plan-lapsed cases, the compatibility path for deliveries an earlier version left pending,
// housekeeping without its own index, and the cap on concurrent webhook statements.

import type { JobHelpers } from 'graphile-worker'
import pg from 'pg'
import t from 'tap'
import { loadConfig } from '../../src/config.ts'
import { type AttemptResult, attemptResultRecord, DATABASE_CONCURRENCY, WebhookBatchSender } from '../../src/webhooks/batch-sender.ts'
import { sealWebhookSecret, webhookSecretKey } from '../../src/webhooks/secret-store.ts'
import { closeWebhookConnections } from '../../src/webhooks/send.ts'
import { fanOutEvent } from '../../workers/fan_out_event.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { TEST_APP_SECRET } from '../helpers/server.ts'
import { type Receiver, startReceiver, WEBHOOK_TEST_ENV } from './receiver.ts'

type Teardown = { teardown: (fn: () => unknown) => void }
/** crm.record_webhook_attempts as the batch sender calls it, with the database's own schedule. */
const RECORD_ATTEMPTS = 'select crm.record_webhook_attempts($1, $2, $3::crm.webhook_attempt_result[]) as outcomes'

t.teardown(() => closeWebhookConnections())

async function setUp(t: Teardown) {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const owner = await ownerClient(t, url)
  const pool = new pg.Pool({ connectionString: url, max: 4 })
  // Teardowns run in the order they were added, so the database is dropped (with force) before
  // this pool ends: an idle connection it still holds is terminated then, which is no failure.
  pool.on('error', (error: Error & { code?: string }) => {
    if (error.code !== '57P01') throw error
  })
  t.teardown(() => pool.end())
  const receiver = await startReceiver(t)
  const sealed = sealWebhookSecret(webhookSecretKey(TEST_APP_SECRET), 'whsec_first-attempts-test', tenant.id)
  const {
    rows: [subscription],
  } = await owner.query(
    `insert into crm.webhook_subscriptions (workspace_id, name, url, events, secret_encrypted, secret_last4) values ($1, 'first', $2, '{contact.*}', $3, 'test') returning id`,
    [tenant.id, `${receiver.url}/hook`, sealed],
  )
  const config = loadConfig({ APP_SECRET: TEST_APP_SECRET, DATABASE_URL: url, ...WEBHOOK_TEST_ENV })
  const sender = new WebhookBatchSender(config)
  /** Contacts created in one statement, as the API or an import writes them; returns their events' ids. */
  const createContacts = async (emails: string[]): Promise<string[]> => {
    await owner.query('begin')
    await owner.query(`select crm.act_as('admin@a.test', $1)`, [tenant.slug])
    await owner.query(`insert into crm.contacts (email) select unnest($1::text[])`, [emails])
    await owner.query('commit')
    const { rows } = await owner.query(
      `select e.id from crm.events e join crm.contacts c on c.workspace_id = e.workspace_id and c.id = e.record_id where c.email = any ($1) order by e.id`,
      [emails],
    )
    return rows.map((row) => row.id as string)
  }
  /** graphile-worker's helpers as fan_out_event uses them; `failing` makes matching statements fail. */
  const helpers = (attempts: number, failing?: RegExp) =>
    ({
      job: { attempts },
      query: (text: string, values: unknown[]) =>
        failing?.test(text) ? Promise.reject(new Error('the database went away')) : pool.query(text, values),
    }) as unknown as JobHelpers
  const deliverJobs = async () =>
    (
      await owner.query(
        `select j.payload from graphile_worker._private_jobs j join graphile_worker._private_tasks k on k.id = j.task_id where k.identifier = 'deliver_webhook' order by j.id`,
      )
    ).rows.map((row) => row.payload)
  return { url, tenant, owner, receiver, subscriptionId: subscription.id as string, sender, createContacts, helpers, deliverJobs }
}

const deliveryIdsReceived = (receiver: Receiver) => receiver.received.map((request) => String(request.headers['x-service-delivery-id']))

t.test(
  'a first attempt is recorded with its delivery; a re-run sends again what was not recorded, with the same delivery id',
  async (t) => {
    const { owner, receiver, subscriptionId, sender, createContacts, helpers } = await setUp(t)
    const eventIds = await createContacts(['one@example.com', 'two@example.com', 'three@example.com'])
    const fanOut = fanOutEvent(sender)

    // The first run sends, then dies before its attempts are recorded (as after kill -9).
    await t.rejects(Promise.resolve(fanOut({ event_ids: eventIds }, helpers(1, /record_webhook_attempts/))), /the database went away/)
    t.equal(receiver.received.length, 3, 'the first run sent all three')
    t.equal((await owner.query('select count(*)::int as n from crm.webhook_deliveries')).rows[0].n, 0, 'and recorded nothing')
    const firstIds = deliveryIdsReceived(receiver)

    await fanOut({ event_ids: eventIds }, helpers(2))
    t.equal(receiver.received.length, 6, 'the re-run sent the three again')
    t.same(deliveryIdsReceived(receiver).slice(3).sort(), [...firstIds].sort(), 'with the delivery ids the receiver saw the first time')
    const { rows: deliveries } = await owner.query(
      `select d.id, d.status, d.attempt_count, d.cycle_attempts, d.generation, d.completed_at is not null as completed, d.event_id,
            crm.webhook_delivery_id(d.event_id, d.subscription_id) = d.id as derived,
            (select json_agg(json_build_object('attempt', a.attempt, 'status', a.response_status, 'error', a.error, 'excerpt', a.response_body_excerpt))
               from crm.webhook_attempts a where a.workspace_id = d.workspace_id and a.delivery_id = d.id) as attempts
       from crm.webhook_deliveries d where d.subscription_id = $1 order by d.event_id`,
      [subscriptionId],
    )
    t.equal(deliveries.length, 3, 'one delivery per event')
    for (const delivery of deliveries) {
      t.match(delivery, { status: 'delivered', attempt_count: 1, cycle_attempts: 1, generation: 1, completed: true, derived: true })
      t.same(delivery.attempts, [{ attempt: 1, status: 200, error: null, excerpt: 'ok' }], 'the recorded attempt is logged')
      t.equal(delivery.id.slice(0, 13), delivery.event_id.slice(0, 13), "the id carries its event's time")
      t.match(delivery.id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/, 'a UUIDv7')
    }
    const body = receiver.received[3].body
    t.same(Object.keys(body), ['id', 'event', 'occurred_at', 'delivered_at', 'delivery_id', 'workspace', 'data', 'actor'])
    t.ok(eventIds.includes(body.id))

    await fanOut({ event_ids: eventIds }, helpers(3))
    t.equal(receiver.received.length, 6, 'a third run finds everything recorded and sends nothing')
    t.equal((await owner.query('select count(*)::int as n from crm.webhook_attempts')).rows[0].n, 3)
  },
)

t.test('failed, held, deferred and already recorded first attempts', async (t) => {
  const { tenant, owner, receiver, subscriptionId, sender, createContacts, helpers, deliverJobs } = await setUp(t)
  receiver.answer = () => ({ status: 503, body: 'busy' })
  const failing = await createContacts(['failing@example.com'])
  await fanOutEvent(sender)({ event_ids: failing }, helpers(1))
  const {
    rows: [retrying],
  } = await owner.query(
    `select id, status, attempt_count, cycle_attempts, generation, next_attempt_at > created_at as later from crm.webhook_deliveries where event_id = $1`,
    failing,
  )
  t.match(
    retrying,
    { status: 'retrying', attempt_count: 1, cycle_attempts: 1, generation: 2, later: true },
    'retrying after the first delay',
  )
  t.match(await deliverJobs(), [{ w: tenant.id, s: subscriptionId, d: [retrying.id], g: [2] }], 'with its deliver_webhook job')
  const {
    rows: [attempt],
  } = await owner.query('select attempt, response_status, error, response_body_excerpt from crm.webhook_attempts where delivery_id = $1', [
    retrying.id,
  ])
  t.same(attempt, { attempt: 1, response_status: 503, error: 'http_status', response_body_excerpt: 'busy' })

  // What crm.webhook_first_attempts_to_send returned, then attempts recorded as the sender does.
  const [paused, deferred] = await createContacts(['paused@example.com', 'deferred@example.com'])
  const { rows: read } = await owner.query('select * from crm.webhook_first_attempts_to_send($1::uuid[])', [[paused, deferred]])
  t.equal(read.length, 2)
  const record = (rows: { delivery_id: string; event_id: string }[], attempted: boolean[], error: string | null) =>
    owner.query(RECORD_ATTEMPTS, [
      tenant.id,
      subscriptionId,
      rows
        .map(
          (row, i): AttemptResult => ({
            delivery_id: row.delivery_id,
            event_id: row.event_id,
            generation: null,
            started_at: attempted[i] ? new Date().toISOString() : null,
            duration_ms: attempted[i] ? 12 : null,
            response_status: attempted[i] ? (error ? 500 : 200) : null,
            error: attempted[i] ? error : null,
            response_body_excerpt: attempted[i] ? 'answer' : null,
          }),
        )
        .map(attemptResultRecord),
    ])
  // Paused between the attempt and its record: a failure is held, not retried.
  await owner.query(`update crm.webhook_subscriptions set status = 'paused', paused_reason = 'manual', paused_at = now() where id = $1`, [
    subscriptionId,
  ])
  const heldOutcome = await record(
    [read.find((row) => row.event_id === paused), read.find((row) => row.event_id === deferred)],
    [true, false],
    'http_status',
  )
  t.same(heldOutcome.rows[0].outcomes, { held: 1, pending: 1 })
  const states = async () =>
    Object.fromEntries(
      (
        await owner.query(
          `select event_id, status, attempt_count, generation, next_attempt_at is not null as due from crm.webhook_deliveries where event_id = any ($1)`,
          [[paused, deferred]],
        )
      ).rows.map((row) => [
        row.event_id === paused ? 'paused' : 'deferred',
        { status: row.status, attempt_count: row.attempt_count, generation: row.generation, due: row.due },
      ]),
    )
  t.same(await states(), {
    paused: { status: 'held', attempt_count: 1, generation: 1, due: false },
    deferred: { status: 'pending', attempt_count: 0, generation: 2, due: true },
  })
  t.ok(
    (await deliverJobs()).some((job) => job.d.includes(read.find((row) => row.event_id === deferred).delivery_id) && job.g[0] === 2),
    'the deferred one has its job',
  )

  // Recorded twice (two runs of one job at once): the second attempt is logged, the state stays.
  const again = await record([read.find((row) => row.event_id === paused)], [true], null)
  t.same(again.rows[0].outcomes, { existing: 1 })
  t.same((await states()).paused, { status: 'held', attempt_count: 2, generation: 1, due: false })
  const { rows: attempts } = await owner.query(
    `select a.attempt, a.response_status from crm.webhook_attempts a join crm.webhook_deliveries d on d.workspace_id = a.workspace_id and d.id = a.delivery_id where d.event_id = $1 order by a.attempt`,
    [paused],
  )
  t.same(attempts, [
    { attempt: 1, response_status: 500 },
    { attempt: 2, response_status: 200 },
  ])

  // A subscription deleted meanwhile: nothing to record the attempts on.
  const [orphan] = await createContacts(['orphan@example.com'])
  await owner.query(`update crm.webhook_subscriptions set status = 'active', paused_reason = null, paused_at = null where id = $1`, [
    subscriptionId,
  ])
  const { rows: orphanRead } = await owner.query('select * from crm.webhook_first_attempts_to_send($1::uuid[])', [[orphan]])
  await owner.query('delete from crm.webhook_subscriptions where id = $1', [subscriptionId])
  t.same((await record(orphanRead, [true], null)).rows[0].outcomes, {})
  t.equal((await owner.query('select count(*)::int as n from crm.webhook_deliveries')).rows[0].n, 0)
})

t.test(
  'the read: held for a paused subscription, nothing while the plan has lapsed, stranded pending deliveries handed to jobs on a re-run',
  async (t) => {
    const { tenant, owner, subscriptionId, createContacts, deliverJobs } = await setUp(t)
    await owner.query(`update crm.webhook_subscriptions set status = 'paused', paused_reason = 'manual', paused_at = now() where id = $1`, [
      subscriptionId,
    ])
    const [held] = await createContacts(['held@example.com'])
    t.equal(
      (await owner.query('select * from crm.webhook_first_attempts_to_send($1::uuid[])', [[held]])).rowCount,
      0,
      'nothing to send while paused',
    )
    t.match(
      (
        await owner.query(
          'select status, attempt_count, id = crm.webhook_delivery_id(event_id, subscription_id) as derived from crm.webhook_deliveries where event_id = $1',
          [held],
        )
      ).rows,
      [{ status: 'held', attempt_count: 0, derived: true }],
    )
    t.equal(
      (await owner.query('select * from crm.webhook_first_attempts_to_send($1::uuid[], true)', [[held]])).rowCount,
      0,
      'a re-run creates nothing twice',
    )
    t.equal((await owner.query('select count(*)::int as n from crm.webhook_deliveries')).rows[0].n, 1)

    await owner.query(`update crm.webhook_subscriptions set status = 'active', paused_reason = null, paused_at = null where id = $1`, [
      subscriptionId,
    ])
    await owner.query(`update crm.workspaces set plan = 'free', trial_ends_at = now() - interval '1 day' where id = $1`, [tenant.id])
    const [lapsed] = await createContacts(['lapsed@example.com'])
    t.equal(
      (await owner.query('select * from crm.webhook_first_attempts_to_send($1::uuid[])', [[lapsed]])).rowCount,
      0,
      'nothing to send without the plan',
    )
    t.equal(
      (await owner.query('select count(*)::int as n from crm.webhook_deliveries where event_id = $1', [lapsed])).rows[0].n,
      0,
      'and no delivery',
    )

    // A delivery an earlier version of fan_out_event created and never attempted.
    await owner.query(`update crm.workspaces set plan = 'pro' where id = $1`, [tenant.id])
    const [stranded] = await createContacts(['stranded@example.com'])
    const {
      rows: [old],
    } = await owner.query(
      `insert into crm.webhook_deliveries (workspace_id, subscription_id, event_id, event, record_type, record_id, status, next_attempt_at)
     select workspace_id, $2, id, event, record_type, record_id, 'pending', now() from crm.events where id = $1 returning id`,
      [stranded, subscriptionId],
    )
    t.equal(
      (await owner.query('select * from crm.webhook_first_attempts_to_send($1::uuid[], true)', [[stranded]])).rowCount,
      0,
      'not sent by the re-run itself',
    )
    t.match((await owner.query('select generation from crm.webhook_deliveries where id = $1', [old.id])).rows, [{ generation: 2 }])
    t.ok(
      (await deliverJobs()).some((job) => job.d.includes(old.id) && job.g[0] === 2),
      'handed to a deliver_webhook job',
    )
  },
)

t.test('housekeeping removes old final deliveries without an index of its own', async (t) => {
  const { tenant, owner, subscriptionId, createContacts } = await setUp(t)
  const events = await createContacts(['a@example.com', 'b@example.com', 'c@example.com', 'd@example.com'])
  const states: [string, string | null][] = [
    ['delivered', '40 days'],
    ['dead', '31 days'],
    ['delivered', '2 days'],
    ['held', null],
  ]
  for (const [i, [status, age]] of states.entries()) {
    await owner.query(
      `insert into crm.webhook_deliveries (workspace_id, subscription_id, event_id, event, record_type, record_id, status, created_at, completed_at)
       select workspace_id, $2, id, event, record_type, record_id, $3, now() - interval '60 days', now() - $4::interval from crm.events where id = $1`,
      [events[i], subscriptionId, status, age],
    )
  }
  const {
    rows: [pruned],
  } = await owner.query('select crm.prune_webhook_deliveries(30) as n')
  t.equal(Number(pruned.n), 2)
  const { rows: left } = await owner.query(`select status from crm.webhook_deliveries where workspace_id = $1 order by status`, [tenant.id])
  t.same(
    left.map((row) => row.status),
    ['delivered', 'held'],
    'recent and held deliveries stay',
  )
  t.equal(
    (await owner.query(`select count(*)::int as n from pg_indexes where schemaname = 'crm' and indexname = 'webhook_deliveries_prune'`))
      .rows[0].n,
    0,
  )
})

t.test('webhook statements run at most DATABASE_CONCURRENCY at once, in turn', async (t) => {
  const sender = new WebhookBatchSender(loadConfig({ APP_SECRET: TEST_APP_SECRET, DATABASE_URL: 'postgres://unused@127.0.0.1/unused' }))
  let running = 0
  let most = 0
  const order: number[] = []
  const helpers = {
    query: async (_text: string, values: unknown[]) => {
      running++
      most = Math.max(most, running)
      await new Promise((resolve) => setTimeout(resolve, 5))
      running--
      order.push(values[0] as number)
      return { rows: [{ n: values[0] }] }
    },
  } as unknown as JobHelpers
  const results = await Promise.all(Array.from({ length: 20 }, (_, n) => sender.query<{ n: number }>(helpers, 'select $1 as n', [n])))
  t.same(
    results.map((result) => result.rows[0].n),
    Array.from({ length: 20 }, (_, n) => n),
  )
  t.equal(most, DATABASE_CONCURRENCY)
  t.same(
    order.slice(0, DATABASE_CONCURRENCY).sort((a, b) => a - b),
    Array.from({ length: DATABASE_CONCURRENCY }, (_, n) => n),
    'first come, first served',
  )

  const failing = { query: async () => Promise.reject(new Error('boom')) } as unknown as JobHelpers
  await t.rejects(sender.query(failing, 'select 1', []), /boom/)
  const after = await Promise.all(
    Array.from({ length: DATABASE_CONCURRENCY }, (_, n) => sender.query<{ n: number }>(helpers, 'select $1 as n', [n])),
  )
  t.equal(after.length, DATABASE_CONCURRENCY, 'a failed statement gives its slot back')
})

t.test('statistics taken while the delivery tables were empty do not turn the worker statements into scans', async (t) => {
  // After ANALYZE of an empty table (a fresh install, vacuumdb after a restore or an upgrade) the
  // planner trusts "no rows", and a plan made then, such as the foreign-key check of every attempt
  // against its delivery, is kept by the connection until the next ANALYZE. Each attempt recorded
  // then scans every delivery: 5 times the cost per delivery at 5,000 deliveries, 15 times at
  // 20,000 (hence enable_seqscan = off on these functions, sql/definitions/40_events_and_webhooks.sql).
  const { tenant, owner, subscriptionId, createContacts } = await setUp(t)
  const emails = Array.from({ length: 60 }, (_, i) => `scan-${i}@example.com`)
  const events = await createContacts(emails)
  await owner.query('analyze crm.webhook_deliveries, crm.webhook_attempts')
  const deliveryIds = (
    await owner.query(`select array_agg(crm.webhook_delivery_id(e, $1) order by e) as ids from unnest($2::uuid[]) e`, [
      subscriptionId,
      events,
    ])
  ).rows[0].ids as string[]
  const each = <T>(value: T) => events.map(() => value)
  const started = new Date().toISOString()

  await owner.query('begin')
  // Failed first attempts: the deliveries are created retrying.
  const attempts = (generation: number | null, status: number, error: string | null, excerpt: string) =>
    events
      .map(
        (eventId, i): AttemptResult => ({
          delivery_id: deliveryIds[i],
          event_id: eventId,
          generation,
          started_at: started,
          duration_ms: 3,
          response_status: status,
          error,
          response_body_excerpt: excerpt,
        }),
      )
      .map(attemptResultRecord)
  await owner.query(RECORD_ATTEMPTS, [tenant.id, subscriptionId, attempts(null, 500, 'http_status', 'no')])
  // Their retries: the read, then the record of successful second attempts.
  const { rows: due } = await owner.query(
    'select delivery_id, generation from crm.webhook_deliveries_to_send($1, $2, $3::uuid[], $4::int[])',
    [tenant.id, subscriptionId, deliveryIds, each(2)],
  )
  t.equal(due.length, events.length, 'every delivery is due for its retry')
  await owner.query(RECORD_ATTEMPTS, [tenant.id, subscriptionId, attempts(2, 200, null, 'ok')])
  const { rows: scans } = await owner.query(
    `select relname, seq_scan from pg_stat_xact_user_tables where schemaname = 'crm' and relname in ('webhook_deliveries', 'webhook_attempts') order by relname`,
  )
  await owner.query('commit')
  t.same(
    scans,
    [
      { relname: 'webhook_attempts', seq_scan: '0' },
      { relname: 'webhook_deliveries', seq_scan: '0' },
    ],
    'no sequential scan of either table',
  )
  t.same((await owner.query(`select status, count(*)::int as n from crm.webhook_deliveries group by status`)).rows, [
    { status: 'delivered', n: events.length },
  ])
})
