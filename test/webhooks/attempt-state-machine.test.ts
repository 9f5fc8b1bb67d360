// crm.record_webhook_attempts, the one state machine every attempt is recorded through: the
// schedule and the attempt count come from crm.webhook_retry_delays() (or the schedule a test
// passes), first and later attempts go through the same transition, and a death by a first attempt
// runs the auto-pause rule like any other.

import type pg from 'pg'
import t from 'tap'
import { type AttemptResult, attemptResultRecord } from '../../src/webhooks/batch-sender.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'

type Teardown = { teardown: (fn: () => unknown) => void }
type Attempt = {
  delivery_id: string
  event_id: string
  generation: number | null
  error: string | null
  started_at?: string | null
  excerpt?: string
}

async function setUp(t: Teardown) {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const owner = await ownerClient(t, url)
  const {
    rows: [subscription],
  } = await owner.query(
    `insert into crm.webhook_subscriptions (workspace_id, name, url, events, secret_encrypted, secret_last4)
     values ($1, 'machine', 'https://hooks.example.com/x', '{contact.*}', '\\x00', 'test') returning id`,
    [tenant.id],
  )
  const subscriptionId = subscription.id as string
  /** Events of contacts created in one statement, with the delivery id each gets. */
  const createEvents = async (count: number): Promise<{ event_id: string; delivery_id: string }[]> => {
    const emails = Array.from({ length: count }, (_, i) => `c${i}-${Math.random().toString(36).slice(2)}@example.com`)
    await owner.query('begin')
    await owner.query(`select crm.act_as('admin@a.test', $1)`, [tenant.slug])
    await owner.query(`insert into crm.contacts (email) select unnest($1::text[])`, [emails])
    await owner.query('commit')
    const { rows } = await owner.query(
      `select e.id as event_id, crm.webhook_delivery_id(e.id, $2) as delivery_id
         from crm.events e join crm.contacts c on c.workspace_id = e.workspace_id and c.id = e.record_id where c.email = any ($1) order by e.id`,
      [emails, subscriptionId],
    )
    return rows
  }
  /** One call of the state machine, in the caller's transaction when one is open. */
  const record = async (client: pg.ClientBase, attempts: Attempt[], retryDelays?: string[]) => {
    const results = attempts.map(
      (a): AttemptResult => ({
        delivery_id: a.delivery_id,
        event_id: a.event_id,
        generation: a.generation,
        started_at: a.started_at === undefined ? new Date().toISOString() : a.started_at,
        duration_ms: 5,
        response_status: a.error ? 500 : 200,
        error: a.error,
        response_body_excerpt: a.excerpt ?? 'x',
      }),
    )
    const { rows } = await client.query(
      'select crm.record_webhook_attempts($1, $2, $3::crm.webhook_attempt_result[], $4::interval[]) as outcomes',
      [tenant.id, subscriptionId, results.map(attemptResultRecord), retryDelays ?? null],
    )
    return rows[0].outcomes
  }
  const delivery = async (client: pg.ClientBase, id: string) =>
    (
      await client.query(
        `select status, attempt_count, cycle_attempts, generation, extract(epoch from next_attempt_at - now())::int as due_in_s, completed_at is not null as completed
           from crm.webhook_deliveries where id = $1`,
        [id],
      )
    ).rows[0]
  return { tenant, owner, subscriptionId, createEvents, record, delivery }
}

t.test('the schedule lives in SQL: 30 s, 2 min, 10 min, 1 h, 6 h, 24 h, dead at the 7th failure', async (t) => {
  const { owner, createEvents, record, delivery } = await setUp(t)
  t.same((await owner.query(`select crm.webhook_retry_delays()::text[] as delays`)).rows[0].delays, [
    '00:00:30',
    '00:02:00',
    '00:10:00',
    '01:00:00',
    '06:00:00',
    '24:00:00',
  ])
  const [event] = await createEvents(1)
  const seen: unknown[] = []
  // now() stands still inside a transaction, so each due time is exactly the delay.
  await owner.query('begin')
  t.same(await record(owner, [{ ...event, generation: null, error: 'http_status' }]), { retrying: 1 })
  seen.push(await delivery(owner, event.delivery_id))
  for (let attempt = 2; attempt <= 7; attempt++) {
    const { generation } = (await owner.query('select generation from crm.webhook_deliveries where id = $1', [event.delivery_id])).rows[0]
    await record(owner, [{ ...event, generation, error: 'timeout' }])
    seen.push(await delivery(owner, event.delivery_id))
  }
  await owner.query('commit')
  t.same(
    seen.map((d) => (d as { due_in_s: number | null }).due_in_s),
    [30, 120, 600, 3600, 21_600, 86_400, null],
    'each retry after the next delay of the schedule',
  )
  t.match(seen.at(-1), { status: 'dead', attempt_count: 7, cycle_attempts: 7, completed: true })
  t.match(seen.at(-2), { status: 'retrying', attempt_count: 6, cycle_attempts: 6 })
})

t.test('a schedule passed in replaces the database one, and its length sets the attempts of a cycle', async (t) => {
  const { owner, createEvents, record, delivery } = await setUp(t)
  const [event] = await createEvents(1)
  const short = ['1 second', '2 seconds']
  await owner.query('begin')
  await record(owner, [{ ...event, generation: null, error: 'http_status' }], short)
  t.match(await delivery(owner, event.delivery_id), { status: 'retrying', due_in_s: 1 })
  await record(owner, [{ ...event, generation: 2, error: 'http_status' }], short)
  t.match(await delivery(owner, event.delivery_id), { status: 'retrying', due_in_s: 2, cycle_attempts: 2 })
  t.same(await record(owner, [{ ...event, generation: 3, error: 'http_status' }], short), { dead: 1 })
  t.match(await delivery(owner, event.delivery_id), { status: 'dead', cycle_attempts: 3, completed: true })
  await owner.query('commit')
})

t.test('first and later attempts in one batch; a death by a first attempt runs the auto-pause rule', async (t) => {
  const { owner, subscriptionId, createEvents, record, delivery } = await setUp(t)
  const [later, first, notMade] = await createEvents(3)
  await record(owner, [{ ...later, generation: null, error: 'http_status' }])
  const outcomes = await record(owner, [
    { ...later, generation: 2, error: null, excerpt: ' "quoted", back\\slash, (paren) {brace} \n ü ' },
    { ...first, generation: null, error: 'http_status', excerpt: '' },
    { ...notMade, generation: null, error: null, started_at: null },
  ])
  t.same(outcomes, { delivered: 1, retrying: 1, pending: 1 })
  t.match(await delivery(owner, later.delivery_id), { status: 'delivered', attempt_count: 2 })
  t.same(
    (
      await owner.query('select response_body_excerpt from crm.webhook_attempts where delivery_id = $1 and attempt = 2', [
        later.delivery_id,
      ])
    ).rows[0].response_body_excerpt,
    ' "quoted", back\\slash, (paren) {brace} \n ü ',
    'any text reaches the attempt log as it was (record syntax inside an array)',
  )
  t.same(
    (await owner.query('select response_body_excerpt from crm.webhook_attempts where delivery_id = $1', [first.delivery_id])).rows,
    [{ response_body_excerpt: '' }],
    'an empty answer is not null',
  )
  t.match(await delivery(owner, first.delivery_id), { status: 'retrying', attempt_count: 1, generation: 2, due_in_s: 30 })
  t.match(await delivery(owner, notMade.delivery_id), { status: 'pending', attempt_count: 0, generation: 2 })

  // A schedule without delays: every first failure is the last attempt of its cycle.
  const doomed = await createEvents(10)
  const result = await record(
    owner,
    doomed.map((event) => ({ ...event, generation: null, error: 'connection_refused' })),
    [],
  )
  t.same(result, { dead: 10, paused: true }, '10 of 11 final deliveries dead: the subscription pauses itself')
  t.match((await owner.query('select status, paused_reason from crm.webhook_subscriptions where id = $1', [subscriptionId])).rows, [
    { status: 'paused', paused_reason: 'auto' },
  ])
})
