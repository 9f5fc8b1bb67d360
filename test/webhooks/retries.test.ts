// The retry schedule (shortened by WEBHOOK_RETRY_SCHEDULE), the dead state, redeliver, held
// retries while paused, and the auto-pause rule at exactly its edge.
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV, waitUntil } from './receiver.ts'

t.test('seven failures make a delivery dead; redeliver starts a fresh cycle with the same delivery_id', async (t) => {
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  let failing = true
  receiver.answer = () => (failing ? { status: 500, body: 'x'.repeat(5000) } : { status: 204 })
  const {
    body: { data: subscription },
  } = await server.request('POST', '/api/webhook-subscriptions', {
    token,
    body: { name: 'R', url: receiver.url, events: ['deal.created'] },
  })

  await server.request('POST', '/api/deals', { token, body: { name: 'Big deal', amount: '100.00' } })
  const path = `/api/webhook-subscriptions/${subscription.id}/deliveries`
  const dead = await waitUntil(
    async () => {
      const log = await server.request('GET', `${path}?status=dead`, { token })
      return log.body.data[0]
    },
    15_000,
    'dead delivery',
  )
  t.equal(receiver.received.length, 7, 'exactly 7 attempts')
  t.equal(new Set(receiver.received.map((r) => r.headers['x-service-delivery-id'])).size, 1, 'one delivery_id throughout')
  const gaps = receiver.received.slice(1).map((r, i) => r.at - receiver.received[i].at)
  t.ok(
    gaps.every((gap) => gap >= 40),
    `retries wait for the schedule (gaps ${gaps.join(',')} ms)`,
  )
  const delivered = new Set(receiver.received.map((r) => r.body.delivered_at))
  t.equal(delivered.size, 7, 'delivered_at is set per attempt')

  const detail = await server.request('GET', `${path}/${dead.delivery_id}`, { token })
  t.match(detail.body.data, { status: 'dead', attempt_count: 7, next_attempt_at: null })
  t.ok(detail.body.data.completed_at)
  t.same(
    detail.body.data.attempts.map((a: any) => a.attempt),
    [1, 2, 3, 4, 5, 6, 7],
  )
  t.ok(detail.body.data.attempts.every((a: any) => a.error === 'http_status' && a.response_status === 500))
  t.equal(Buffer.byteLength(detail.body.data.attempts[0].response_body_excerpt), 2048, 'the excerpt keeps 2 KiB')

  failing = false
  const redeliver = await server.request('POST', `${path}/${dead.delivery_id}/redeliver`, { token })
  t.equal(redeliver.status, 202, redeliver.text)
  t.equal(redeliver.body.data.delivery_id, dead.delivery_id)
  await receiver.waitFor((all) => all.length === 8)
  t.equal(receiver.received[7].headers['x-service-delivery-id'], dead.delivery_id)
  const after = await waitUntil(async () => {
    const answer = await server.request('GET', `${path}/${dead.delivery_id}`, { token })
    return answer.body.data.status === 'delivered' ? answer.body.data : null
  })
  t.equal(after.attempt_count, 8)
  t.match(after.attempts[7], { attempt: 8, response_status: 204, error: null })

  // A refused connection is its own error class.
  const closed = await server.request('POST', '/api/webhook-subscriptions', {
    token,
    body: { name: 'Closed', url: 'http://127.0.0.1:9/', events: ['deal.updated'] },
  })
  await server.request('PATCH', `/api/deals/${receiver.received[0].body.data.object.id}`, { token, body: { stage: 'won' } })
  const refused = await waitUntil(async () => {
    const log = await server.request('GET', `/api/webhook-subscriptions/${closed.body.data.id}/deliveries`, { token })
    const id = log.body.data[0]?.delivery_id
    if (!id) return null
    const one = await server.request('GET', `/api/webhook-subscriptions/${closed.body.data.id}/deliveries/${id}`, { token })
    return one.body.data.attempts[0]
  })
  t.match(refused, { error: 'connection_refused', response_status: null })
})

t.test('a retry that falls due while paused is held; resume sends it with the attempts it had left', async (t) => {
  const server = await startTestServer(t, {
    worker: true,
    env: { ...WEBHOOK_TEST_ENV, WEBHOOK_RETRY_SCHEDULE: '1s,50ms,50ms,50ms,50ms,50ms' },
  })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  receiver.answer = () => ({ status: 503 })
  const {
    body: { data: subscription },
  } = await server.request('POST', '/api/webhook-subscriptions', { token, body: { name: 'R', url: receiver.url, events: ['*'] } })
  await server.request('POST', '/api/companies', { token, body: { name: 'Held Co' } })
  await receiver.waitFor((all) => all.length === 1)
  const paused = await server.request('POST', `/api/webhook-subscriptions/${subscription.id}/pause`, { token })
  t.match(paused.body.data, { status: 'paused', paused_reason: 'manual' })
  const path = `/api/webhook-subscriptions/${subscription.id}/deliveries`
  const held = await waitUntil(async () => (await server.request('GET', `${path}?status=held`, { token })).body.data[0], 5000, 'held')
  t.equal(held.attempt_count, 1)
  t.equal(receiver.received.length, 1, 'nothing is sent while paused')

  const resumed = await server.request('POST', `/api/webhook-subscriptions/${subscription.id}/resume`, { token })
  t.match(resumed.body.data, { status: 'active', paused_reason: null, paused_at: null })
  await waitUntil(async () => (await server.request('GET', `${path}?status=dead`, { token })).body.data[0], 10_000, 'dead')
  t.equal(receiver.received.length, 7, 'resume kept the six attempts that were left')
})

t.test('auto-pause: 9 final deliveries never pause; 10 with 5 dead do', async (t) => {
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  receiver.answer = (request) =>
    String(request.body?.data?.object?.name ?? request.body?.data?.object?.email).startsWith('fail') ? { status: 500 } : { status: 200 }
  const nine = (
    await server.request('POST', '/api/webhook-subscriptions', {
      token,
      body: { name: 'Nine', url: `${receiver.url}/nine`, events: ['company.*'] },
    })
  ).body.data
  const ten = (
    await server.request('POST', '/api/webhook-subscriptions', {
      token,
      body: { name: 'Ten', url: `${receiver.url}/ten`, events: ['contact.*'] },
    })
  ).body.data
  const finals = async (id: string) => {
    const log = await server.request('GET', `/api/webhook-subscriptions/${id}/deliveries?limit=200`, { token })
    return log.body.data.filter((d: any) => d.status === 'delivered' || d.status === 'dead').length
  }

  for (let i = 0; i < 9; i++) await server.request('POST', '/api/companies', { token, body: { name: `fail-${i}` } })
  await waitUntil(async () => (await finals(nine.id)) === 9, 20_000, 'nine dead')
  const nineAfter = await server.request('GET', `/api/webhook-subscriptions/${nine.id}`, { token })
  t.match(nineAfter.body.data, { status: 'active', paused_reason: null }, '9 dead of 9 final: below the minimum of 10')
  t.equal(nineAfter.body.data.stats.success_rate, 0)

  for (let i = 0; i < 5; i++) await server.request('POST', '/api/contacts', { token, body: { email: `ok-${i}@example.com` } })
  await waitUntil(async () => (await finals(ten.id)) === 5, 20_000, 'five delivered')
  for (let i = 0; i < 4; i++) await server.request('POST', '/api/contacts', { token, body: { email: `fail-${i}@example.com` } })
  await waitUntil(async () => (await finals(ten.id)) === 9, 20_000, 'four dead')
  t.equal(
    (await server.request('GET', `/api/webhook-subscriptions/${ten.id}`, { token })).body.data.status,
    'active',
    '4 dead of 9 final: no pause',
  )
  await server.request('POST', '/api/contacts', { token, body: { email: 'fail-last@example.com' } })
  const paused = await waitUntil(
    async () => {
      const answer = await server.request('GET', `/api/webhook-subscriptions/${ten.id}`, { token })
      return answer.body.data?.status === 'paused' ? answer.body.data : null
    },
    20_000,
    'auto-pause',
  )
  // Half the final deliveries are dead, but success_rate counts attempts: 5 successes of 5 + 5 × 7.
  t.match(paused, { paused_reason: 'auto', stats: { success_rate: 0.125 } })
  t.ok(paused.paused_at)

  // While auto-paused, new events are held, and the owner sees the same in SQL.
  await server.request('POST', '/api/contacts', { token, body: { email: 'later@example.com' } })
  const owner = await ownerClient(t, server.databaseUrl)
  await waitUntil(
    async () =>
      (await owner.query(`select 1 from crm.webhook_deliveries where subscription_id = $1 and status = 'held'`, [ten.id])).rowCount === 1,
    5000,
    'held',
  )
})
