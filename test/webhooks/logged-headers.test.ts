// The delivery log shows every header an attempt sent (docs/api.md section 7), secrets left out: a
// real receiver's received set, minus secrets, equals the logged set, attempt by attempt,
// the Standard Webhooks headers included.
import t from 'tap'
import { loggedHeaders } from '../../src/webhooks/request-headers.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV, waitUntil } from './receiver.ts'

const BASE = '/api/webhook-subscriptions'

t.test('each attempt logs exactly the headers the receiver got', async (t) => {
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  // The first attempt fails, the second succeeds: two attempts, each signed afresh.
  receiver.answer = (request) => ({ status: receiver.received.indexOf(request) === 0 ? 500 : 200 })
  const subscription = (
    await server.request('POST', BASE, { token, body: { name: 'Headers', url: `${receiver.url}/in?x=1`, events: ['contact.created'] } })
  ).body.data
  await server.request('POST', '/api/contacts', { token, body: { email: 'héaders@example.com' } })
  const path = `${BASE}/${subscription.id}/deliveries`
  const delivery = await waitUntil(
    async () => {
      const log = await server.request('GET', `${path}?status=delivered`, { token })
      const found = log.body.data[0]
      return found ? (await server.request('GET', `${path}/${found.delivery_id}`, { token })).body.data : null
    },
    15_000,
    'delivered on the second attempt',
  )
  t.equal(delivery.attempts.length, 2)
  t.equal(receiver.received.length, 2)
  for (const [i, attempt] of delivery.attempts.entries()) {
    const received = Object.fromEntries(
      Object.entries(receiver.received[i].headers).filter(([name]) => !['authorization', 'cookie'].includes(name)),
    )
    t.same(attempt.request_headers, received, `attempt ${attempt.attempt}: the logged set is the received set`)
    for (const name of ['webhook-id', 'webhook-timestamp', 'webhook-signature', 'x-service-signature', 'user-agent', 'content-length'])
      t.ok(attempt.request_headers[name], `attempt ${attempt.attempt} logs ${name}`)
  }
  t.not(
    delivery.attempts[0].request_headers['webhook-signature'],
    delivery.attempts[1].request_headers['webhook-signature'],
    'each attempt its own signature',
  )
  t.same(delivery.request_headers, delivery.attempts[1].request_headers, 'the delivery shows its latest attempt’s headers')
})

t.test('a header that carries a credential is never logged, whatever its case', async (t) => {
  const sent = {
    'content-type': 'application/json',
    Authorization: 'Bearer sk_live_1',
    'proxy-authorization': 'Basic eDp5',
    cookie: 'session=1',
    'x-api-key': 'k',
    'webhook-signature': 'v1,abc',
  }
  t.same(loggedHeaders(new URL('https://hooks.example.com:8443/in'), sent, 12), {
    host: 'hooks.example.com:8443',
    connection: 'keep-alive',
    'content-type': 'application/json',
    'webhook-signature': 'v1,abc',
    'content-length': '12',
  })
})
