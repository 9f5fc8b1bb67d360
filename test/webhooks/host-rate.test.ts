// WEBHOOK_HOST_RATE_PER_SECOND caps the attempts to one destination host across every workspace and
// subscription: 200 deliveries to one host, from two workspaces, at a cap of 20 a second, arrive
// spread over at least nine seconds, and none is dropped. The bound per one-second window is a
// property of the token bucket, checked on a simulated clock (host-rate-limiter.test.ts): arrivals
// lag their tokens unevenly on a loaded machine, so counting them per window here would test the
// machine's scheduler, not the limiter.
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from './receiver.ts'

const RATE = 20
const server = await startTestServer(t, { worker: true, env: { ...WEBHOOK_TEST_ENV, WEBHOOK_HOST_RATE_PER_SECOND: String(RATE) } })
const receiver = await startReceiver(t)

t.test('200 deliveries to one host at 20 a second', async (t) => {
  const tokens: string[] = []
  for (const slug of ['reflector-a', 'reflector-b']) {
    const tenant = await createTenant(server.databaseUrl, { slug, plan: 'pro', members: { [`admin@${slug}.test`]: 'admin' } })
    const token = tenant.members[`admin@${slug}.test`].token
    tokens.push(token)
    for (const path of ['one', 'two']) {
      const created = await server.request('POST', '/api/webhook-subscriptions', {
        token,
        body: { name: path, url: `${receiver.url}/${slug}/${path}`, events: ['contact.*'] },
      })
      t.equal(created.status, 201, `subscription ${slug}/${path}`)
    }
  }
  // 50 contacts in each workspace, two subscriptions each: 200 deliveries to 127.0.0.1.
  for (let i = 0; i < 50; i++) {
    for (const token of tokens) {
      const contact = await server.request('POST', '/api/contacts', { token, body: { first_name: `Victim ${i}` } })
      if (contact.status !== 201) t.fail(contact.text)
    }
  }
  await receiver.waitFor((all) => new Set(all.map((request) => request.headers['x-service-delivery-id'])).size >= 200, 60_000)

  const ids = new Set(receiver.received.map((request) => request.headers['x-service-delivery-id']))
  t.equal(ids.size, 200, 'every delivery arrived: none dropped')
  const arrivals = receiver.received.map((request) => request.at).sort((a, b) => a - b)
  const spreadMs = arrivals.at(-1)! - arrivals[0]
  t.comment(`${arrivals.length} requests over ${spreadMs} ms`)
  t.ok(spreadMs >= 9000, `200 arrivals at ${RATE}/s spread over at least 9 s (saw ${spreadMs} ms)`)
})
