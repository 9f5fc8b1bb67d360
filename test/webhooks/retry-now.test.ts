// "Retry now" (docs/api.md section 7): redeliver on a retrying delivery attempts it at once, in its
// cycle (its attempt count goes on, the schedule after it continues), and two calls at once make one
// attempt: the second is refused with 409 while the first one's attempt is on its way.
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV, waitUntil } from './receiver.ts'

const BASE = '/api/webhook-subscriptions'

t.test('retry now attempts a retrying delivery at once, one attempt for two concurrent calls, and the cycle goes on', async (t) => {
  // A long schedule: between attempts a delivery waits an hour, far beyond the test.
  const server = await startTestServer(t, { worker: true, env: { ...WEBHOOK_TEST_ENV, WEBHOOK_RETRY_SCHEDULE: '1h,1h,1h,1h,1h,1h' } })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  let release: () => void = () => {}
  let held: Promise<void> | undefined
  let status = 500
  receiver.answer = () => ({ status, hold: held })
  const subscription = (
    await server.request('POST', BASE, { token, body: { name: 'Flaky', url: receiver.url, events: ['contact.created'] } })
  ).body.data
  const path = `${BASE}/${subscription.id}/deliveries`
  await server.request('POST', '/api/contacts', { token, body: { email: 'flaky@example.com' } })
  const first = await waitUntil(
    async () => (await server.request('GET', `${path}?status=retrying`, { token })).body.data[0],
    15_000,
    'a retrying delivery',
  )
  t.match(first, { attempt_count: 1 })
  const waitsFor = Date.parse(first.next_attempt_at) - Date.now()
  t.ok(waitsFor > 30 * 60_000, 'its next attempt is an hour away')

  // The receiver holds the next request open: the attempt stays on its way while both calls run.
  held = new Promise<void>((resolve) => {
    release = resolve
  })
  const retryNow = () => server.request('POST', `${path}/${first.delivery_id}/redeliver`, { token })
  const answers = await Promise.all([retryNow(), retryNow()])
  t.same(answers.map((answer) => answer.status).sort(), [202, 409], 'one call attempts it, the other is refused')
  const refused = answers.find((answer) => answer.status === 409)
  t.equal(refused?.body.code, 'delivery_not_finished')
  const accepted = answers.find((answer) => answer.status === 202)
  t.match(accepted?.body.data, { delivery_id: first.delivery_id, status: 'pending', attempt_count: 1 })
  await receiver.waitFor((all) => all.length === 2)
  release()
  const second = await waitUntil(
    async () => {
      const one = (await server.request('GET', `${path}/${first.delivery_id}`, { token })).body.data
      return one.attempt_count === 2 ? one : null
    },
    15_000,
    'the second attempt recorded',
  )
  t.match(second, { status: 'retrying', attempt_count: 2 }, 'failed again: retrying, its count goes on')
  t.ok(Date.parse(second.next_attempt_at) - Date.now() > 30 * 60_000, 'the schedule goes on: the next attempt an hour later')
  t.same(
    second.attempts.map((a: { attempt: number }) => a.attempt),
    [1, 2],
  )
  t.equal(receiver.received.length, 2, 'two calls, one attempt')

  // Retry now again, and this time the endpoint answers: delivered on the third attempt.
  held = undefined
  status = 204
  t.equal((await retryNow()).status, 202)
  const delivered = await waitUntil(
    async () => {
      const one = (await server.request('GET', `${path}/${first.delivery_id}`, { token })).body.data
      return one.status === 'delivered' ? one : null
    },
    15_000,
    'delivered',
  )
  t.equal(delivered.attempt_count, 3)
  t.equal(receiver.received.length, 3)
  t.same(
    receiver.received.map((r) => r.headers['webhook-id']),
    [first.delivery_id, first.delivery_id, first.delivery_id],
    'one delivery_id throughout',
  )
})
