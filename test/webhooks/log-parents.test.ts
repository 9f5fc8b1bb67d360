// The delivery log's parents, kept by statement-level triggers since migration 000014 (two foreign
// keys checked and locked them once per row): an attempt's delivery and a delivery's subscription
// must exist, a concurrent delete of the parent either waits for the insert or makes it fail, and
// deleting a subscription or a delivery deletes what hangs from it. Also the worker's encoding of a
// batch of attempts, which PostgreSQL must read back field for field.

import fc from 'fast-check'
import type pg from 'pg'
// @ts-expect-error: pg's own parameter encoding, untyped
import { prepareValue } from 'pg/lib/utils.js'
import t from 'tap'
import { type AttemptResult, attemptResultRecord, attemptResultsParameter } from '../../src/webhooks/batch-sender.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { until } from '../helpers/until.ts'

type Teardown = { teardown: (fn: () => unknown) => void }

async function setUp(t: Teardown) {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const owner = await ownerClient(t, url)
  const subscription = async () =>
    (
      await owner.query(
        `insert into crm.webhook_subscriptions (workspace_id, name, url, events, secret_encrypted, secret_last4)
         values ($1, 'parents', 'https://hooks.example.com/x', '{contact.*}', '\\x00', 'test') returning id`,
        [tenant.id],
      )
    ).rows[0].id as string
  /** Inserts a delivery of `subscriptionId` (its event need not exist: the log keeps deliveries of pruned events). */
  const insertDelivery = async (client: pg.ClientBase, subscriptionId: string) =>
    (
      await client.query(
        `insert into crm.webhook_deliveries (workspace_id, subscription_id, event_id, event, record_type, record_id)
         values ($1, $2, gen_random_uuid(), 'contact.created', 'contact', gen_random_uuid()) returning id`,
        [tenant.id, subscriptionId],
      )
    ).rows[0].id as string
  const insertAttempts = (client: pg.ClientBase, subscriptionId: string, deliveryIds: string[]) =>
    client.query(
      `insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, subscription_id, is_test)
       select $1, d, 1, now(), 1, $2, false from unnest($3::uuid[]) d`,
      [tenant.id, subscriptionId, deliveryIds],
    )
  const count = async (table: string, subscriptionId: string) =>
    (await owner.query(`select count(*)::int as n from crm.${table} where subscription_id = $1`, [subscriptionId])).rows[0].n as number
  return { url, tenant, owner, subscription, insertDelivery, insertAttempts, count }
}

const sqlState = (error: unknown) => (error as { code?: string }).code

t.test('an insert of attempts succeeds exactly when every delivery it names exists', async (t) => {
  const { tenant, owner, subscription, insertDelivery, insertAttempts, count } = await setUp(t)
  const subscriptionId = await subscription()
  let attemptNumbers = 100
  const existing = [await insertDelivery(owner, subscriptionId), await insertDelivery(owner, subscriptionId)]
  const missing = ['00000000-0000-7000-8000-000000000001', '00000000-0000-7000-8000-000000000002']
  await fc.assert(
    fc.asyncProperty(fc.array(fc.constantFrom(...existing, ...missing), { minLength: 1, maxLength: 6 }), async (named) => {
      const before = await count('webhook_attempts', subscriptionId)
      await owner.query('begin')
      try {
        // Attempt numbers only need to be unique: the property is about the deliveries named.
        await owner.query(
          `insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, subscription_id, is_test)
           select $1, d.id, $4 + d.n::int, now(), 1, $2, false from unnest($3::uuid[]) with ordinality d(id, n)`,
          [tenant.id, subscriptionId, named, (attemptNumbers += 10)],
        )
        await owner.query('commit')
        t.ok(
          named.every((id) => existing.includes(id)),
          'accepted only when every delivery exists',
        )
        t.equal(await count('webhook_attempts', subscriptionId), before + named.length)
      } catch (error) {
        await owner.query('rollback')
        t.equal(sqlState(error), '23503', 'a missing delivery is a foreign-key violation')
        t.ok(
          named.some((id) => missing.includes(id)),
          'refused only when a delivery is missing',
        )
        t.equal(await count('webhook_attempts', subscriptionId), before)
      }
    }),
    { numRuns: 25 },
  )
  // A delivery of a subscription that does not exist is refused the same way.
  const error = await insertDelivery(owner, '00000000-0000-7000-8000-000000000003').catch((e) => e)
  t.equal(sqlState(error), '23503')
  await insertAttempts(owner, subscriptionId, existing)
})

t.test('deleting a subscription deletes its deliveries and their attempts; deleting deliveries deletes their attempts', async (t) => {
  const { owner, subscription, insertDelivery, insertAttempts, count } = await setUp(t)
  const [doomed, kept] = [await subscription(), await subscription()]
  for (const subscriptionId of [doomed, kept]) {
    const deliveries = [await insertDelivery(owner, subscriptionId), await insertDelivery(owner, subscriptionId)]
    await insertAttempts(owner, subscriptionId, deliveries)
  }
  await owner.query('delete from crm.webhook_subscriptions where id = $1', [doomed])
  t.same([await count('webhook_deliveries', doomed), await count('webhook_attempts', doomed)], [0, 0])
  t.same([await count('webhook_deliveries', kept), await count('webhook_attempts', kept)], [2, 2])
  await owner.query('delete from crm.webhook_deliveries where subscription_id = $1', [kept])
  t.equal(await count('webhook_attempts', kept), 0)
})

t.test('a subscription deleted while a delivery of it is inserted: the later one waits, and nothing is left orphaned', async (t) => {
  const { url, owner, subscription, insertDelivery, insertAttempts, count } = await setUp(t)
  const other = await ownerClient(t, url)
  const watcher = await ownerClient(t, url)
  const waitingFor = (pid: number) =>
    until('the second transaction waits for the first', async () => {
      const { rows } = await watcher.query(`select wait_event_type from pg_stat_activity where pid = $1`, [pid])
      return rows[0]?.wait_event_type === 'Lock' ? true : null
    })
  const otherPid = (await other.query('select pg_backend_pid() as pid')).rows[0].pid as number

  // The insert first: the delete waits for its commit, then takes the new delivery and its attempt with it.
  const first = await subscription()
  await owner.query('begin')
  await insertAttempts(owner, first, [await insertDelivery(owner, first)])
  const deleting = other.query('delete from crm.webhook_subscriptions where id = $1', [first])
  await waitingFor(otherPid)
  await owner.query('commit')
  await deleting
  t.same([await count('webhook_deliveries', first), await count('webhook_attempts', first)], [0, 0], 'nothing orphaned')

  // The delete first: the insert waits for it, then fails as a foreign key would.
  const second = await subscription()
  const ownerPid = (await owner.query('select pg_backend_pid() as pid')).rows[0].pid as number
  await other.query('begin')
  await other.query('delete from crm.webhook_subscriptions where id = $1', [second])
  const inserting = insertDelivery(owner, second).catch((e) => e)
  await waitingFor(ownerPid)
  await other.query('commit')
  t.equal(sqlState(await inserting), '23503', 'the insert fails once the delete commits')
  t.equal(await count('webhook_deliveries', second), 0)
})

t.test("the worker's batch parameter is pg's own quoting of the records, and PostgreSQL reads every field back", async (t) => {
  const { owner } = await setUp(t)
  const text = fc.option(
    fc.string({ unit: 'grapheme', maxLength: 40 }).map((s) => s.replaceAll('\u0000', '')),
    { nil: null },
  )
  const result = fc.record({
    delivery_id: fc.uuid(),
    event_id: fc.uuid(),
    generation: fc.option(fc.integer({ min: 0, max: 1000 }), { nil: null }),
    started_at: fc.option(fc.constant('2026-11-28T10:00:00.123Z'), { nil: null }),
    duration_ms: fc.option(fc.nat(100_000), { nil: null }),
    response_status: fc.option(fc.integer({ min: 100, max: 599 }), { nil: null }),
    error: fc.option(fc.constantFrom('timeout', 'http_status'), { nil: null }),
    response_body_excerpt: text,
    signature: text,
    request_headers: fc.option(
      fc.dictionary(fc.string({ maxLength: 8 }), text).map((headers) => JSON.stringify(headers)),
      { nil: null },
    ),
  }) satisfies fc.Arbitrary<AttemptResult>
  await fc.assert(
    fc.asyncProperty(fc.array(result, { maxLength: 5 }), async (results) => {
      const parameter = attemptResultsParameter(results)
      t.equal(parameter, prepareValue(results.map(attemptResultRecord)))
      const { rows } = await owner.query(
        `select x.delivery_id, x.response_body_excerpt as excerpt, x.signature, x.request_headers
           from unnest($1::crm.webhook_attempt_result[]) with ordinality x order by x.ordinality`,
        [parameter],
      )
      t.same(
        rows.map((row) => [row.delivery_id, row.excerpt, row.signature, row.request_headers]),
        results.map((r) => [
          r.delivery_id,
          r.response_body_excerpt,
          r.signature,
          r.request_headers === null ? null : JSON.parse(r.request_headers),
        ]),
      )
    }),
    { numRuns: 50 },
  )
})
