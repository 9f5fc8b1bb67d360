// Webhook operations that make the sender work are bounded per subscription: test events (20 a
// minute) and recoveries (10 an hour) answer 429 with Retry-After past their limit, across
// processes (counted in the database), without touching another subscription; redeliver sends
// again a finished (dead or delivered) delivery, attempts a retrying one now, and refuses pending
// and held ones with 409, unchanged.
import fc from 'fast-check'
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from './receiver.ts'

const BASE = '/api/webhook-subscriptions'
// No worker: the deliveries these operations create stay as they are, which is what is checked.
const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
const other = await startTestServer(t, { env: WEBHOOK_TEST_ENV, databaseUrl: server.databaseUrl })
const db = await ownerClient(t, server.databaseUrl)
const tenant = await createTenant(server.databaseUrl, { members: { 'admin@hooks.test': 'admin' }, plan: 'pro' })
const token = tenant.members['admin@hooks.test'].token
const receiver = await startReceiver(t)

async function subscribe(): Promise<string> {
  const created = await server.request('POST', BASE, { token, body: { name: 'Endpoint', url: `${receiver.url}/in`, events: ['*'] } })
  if (created.status !== 201) throw new Error(`create answered ${created.status}: ${created.text}`)
  return created.body.data.id
}

t.test('test events: 20 a minute per subscription, shared by every process, then 429 with Retry-After', async (t) => {
  const [busy, quiet] = [await subscribe(), await subscribe()]
  const send = (target: typeof server, id: string) => target.request('POST', `${BASE}/${id}/test`, { token, body: {} })
  const statuses = []
  for (let i = 0; i < 20; i++) statuses.push((await send(i % 2 === 0 ? server : other, busy)).status)
  t.same(statuses, Array(20).fill(202), 'the first 20, through two processes, are sent')
  const refused = await send(other, busy)
  t.equal(refused.status, 429)
  t.equal(refused.body.code, 'rate_limited')
  const retryAfter = Number(refused.headers.get('retry-after'))
  t.ok(retryAfter >= 1 && retryAfter <= 60, `Retry-After is within the minute (${retryAfter})`)
  const { rows } = await db.query('select count(*)::int as n from crm.webhook_deliveries where subscription_id = $1 and is_test', [busy])
  t.equal(rows[0].n, 20, 'the refused one created no delivery')
  t.equal((await send(server, quiet)).status, 202, 'another subscription is not limited by it')
  t.equal(
    (await server.request('POST', `${BASE}/${busy}/test`, { token, body: { event: 'nope.made_up' } })).status,
    422,
    'bad input is still 422',
  )
})

t.test('recoveries: 10 an hour per subscription, then 429 with Retry-After', async (t) => {
  const [busy, quiet] = [await subscribe(), await subscribe()]
  const since = new Date(Date.now() - 3_600_000).toISOString()
  const recover = (id: string, body: unknown = { since }) => server.request('POST', `${BASE}/${id}/recover`, { token, body })
  t.equal((await recover(busy, { since: '2000-01-01T00:00:00Z' })).status, 422, 'a refused window does not count')
  const statuses = []
  for (let i = 0; i < 10; i++) statuses.push((await recover(busy)).status)
  t.same(statuses, Array(10).fill(202))
  const refused = await recover(busy)
  t.equal(refused.status, 429)
  t.equal(refused.body.code, 'rate_limited')
  const retryAfter = Number(refused.headers.get('retry-after'))
  t.ok(retryAfter > 60 && retryAfter <= 3600, `Retry-After is within the hour (${retryAfter})`)
  t.equal((await recover(quiet)).status, 202, 'another subscription is not limited by it')
})

t.test(
  'redeliver: a dead or delivered delivery gets a fresh cycle, a retrying one its next attempt now; pending and held ones get 409, unchanged',
  async (t) => {
    const subscription = await subscribe()
    const STATUSES = ['pending', 'retrying', 'held', 'dead', 'delivered'] as const
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...STATUSES), fc.integer({ min: 0, max: 7 }), fc.boolean(), async (status, cycleAttempts, due) => {
        // A fresh delivery of a test event (its limit's window started anew: not what is tested
        // here), then put in the state under test.
        await db.query('delete from crm.webhook_operation_counts where subscription_id = $1', [subscription])
        const sent = await server.request('POST', `${BASE}/${subscription}/test`, { token, body: {} })
        if (sent.status !== 202) throw new Error(`test answered ${sent.status}: ${sent.text}`)
        const id = sent.body.data.delivery_id
        const final = status === 'dead' || status === 'delivered'
        await db.query(
          `update crm.webhook_deliveries
            set status = $2, cycle_attempts = $3, attempt_count = $3, completed_at = case when $4 then now() end,
                next_attempt_at = case when $4 then null when $5 then now() - interval '1 second' else now() + interval '1 hour' end
          where id = $1`,
          [id, status, cycleAttempts, final, due],
        )
        const answer = await server.request('POST', `${BASE}/${subscription}/deliveries/${id}/redeliver`, { token })
        const {
          rows: [after],
        } = await db.query('select status, cycle_attempts, attempt_count from crm.webhook_deliveries where id = $1', [id])
        if (final) {
          return answer.status === 202 && after.status === 'pending' && after.cycle_attempts === 0
        }
        if (status === 'retrying') {
          // Attempted now in its cycle (pending until that attempt is recorded); one already due is
          // being attempted and stays as it is.
          return (
            answer.status === 202 &&
            after.status === (due ? 'retrying' : 'pending') &&
            after.cycle_attempts === cycleAttempts &&
            after.attempt_count === cycleAttempts
          )
        }
        return (
          answer.status === 409 &&
          answer.body.code === 'delivery_not_finished' &&
          after.status === status &&
          after.cycle_attempts === cycleAttempts
        )
      }),
      { numRuns: 40 },
    )
    t.pass('every status answered as its rule says')
  },
)
