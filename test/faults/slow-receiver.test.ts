// A webhook receiver that hangs, trickles its answer, or answers slowly: the attempt deadline
// (WEBHOOK_TIMEOUT_MS, shortened here) holds, and another subscription's deliveries go through
// while the bad endpoint's attempts are still waiting for their deadline.
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import t, { type Test } from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, waitUntil } from '../webhooks/receiver.ts'

const TIMEOUT_MS = 3000
const ENV = {
  WEBHOOK_ALLOW_HTTP: 'true',
  WEBHOOK_ALLOWED_CIDRS: '127.0.0.0/8',
  WEBHOOK_TIMEOUT_MS: String(TIMEOUT_MS),
  // Only first attempts happen within the test.
  WEBHOOK_RETRY_SCHEDULE: '10m,10m,10m,10m,10m,10m',
  // The bad endpoint and the good one are both 127.0.0.1: the per-host cap is not what this is about.
  WEBHOOK_HOST_RATE_PER_SECOND: '100000',
  LOG_LEVEL: 'warn',
}
const EVENTS = 30

/**
 * trickle: answers 200 with its headers at once, then one byte every 200 ms, never ending.
 * hang: reads the request and never answers at all.
 */
async function startBadEndpoint(t: Test, behaviour: 'trickle' | 'hang'): Promise<{ url: string; requests: () => number }> {
  let requests = 0
  const timers = new Set<NodeJS.Timeout>()
  const server = createServer((req, res) => {
    requests++
    req.resume()
    if (behaviour === 'hang') return
    res.writeHead(200, { 'content-type': 'text/plain' })
    const timer = setInterval(() => res.write('.'), 200)
    timers.add(timer)
    res.on('close', () => {
      clearInterval(timer)
      timers.delete(timer)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    for (const timer of timers) clearInterval(timer)
    server.closeAllConnections()
    return new Promise<void>((resolve) => server.close(() => resolve()))
  })
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, requests: () => requests }
}

async function scenario(t: Test, badUrl: () => Promise<string>, expect: 'timeout' | 'delivered') {
  const server = await startTestServer(t, { worker: true, env: ENV })
  const tenant = await createTenant(server.databaseUrl, { plan: 'pro', members: { 'admin@slow.test': 'admin' } })
  const token = tenant.members['admin@slow.test'].token
  const fast = await startReceiver(t)
  const url = await badUrl()
  const bad = await server.request('POST', '/api/webhook-subscriptions', { token, body: { name: 'bad', url, events: ['contact.created'] } })
  const good = await server.request('POST', '/api/webhook-subscriptions', {
    token,
    body: { name: 'good', url: fast.url, events: ['contact.created'] },
  })
  t.equal(bad.status, 201, 'bad endpoint subscribed')
  t.equal(good.status, 201, 'good endpoint subscribed')
  const db = await ownerClient(t, server.databaseUrl)

  const started = Date.now()
  for (let i = 0; i < EVENTS; i++) await server.request('POST', '/api/contacts', { token, body: { first_name: `Slow ${i}` } })
  await fast.waitFor((all) => new Set(all.map((r) => r.body.id)).size === EVENTS, 60_000)
  const fastDoneMs = Date.now() - started
  const {
    rows: [atFastDone],
  } = await db.query(
    `select count(*)::int as n from crm.webhook_attempts a join crm.webhook_deliveries d on d.workspace_id = a.workspace_id and d.id = a.delivery_id where d.subscription_id = $1`,
    [bad.body.data.id],
  )
  if (expect === 'timeout') {
    // The bad endpoint can finish at most 10 (per-subscription cap) attempts per deadline.
    t.ok(
      atFastDone.n < EVENTS,
      `all ${EVENTS} deliveries of the other subscription arrived (${fastDoneMs} ms) while the bad endpoint had finished only ${atFastDone.n} of its ${EVENTS} first attempts`,
    )
  } else {
    t.pass(
      `all ${EVENTS} deliveries of the other subscription arrived in ${fastDoneMs} ms (the slow endpoint had finished ${atFastDone.n})`,
    )
  }

  const attempts = await waitUntil(
    async () => {
      const { rows } = await db.query(
        `select a.error, a.duration_ms, a.response_status from crm.webhook_attempts a join crm.webhook_deliveries d on d.workspace_id = a.workspace_id and d.id = a.delivery_id where d.subscription_id = $1`,
        [bad.body.data.id],
      )
      return rows.length >= EVENTS ? rows : null
    },
    60_000,
    `${EVENTS} attempts of the bad endpoint`,
  )
  const longest = Math.max(...attempts.map((a) => a.duration_ms))
  if (expect === 'timeout') {
    t.same([...new Set(attempts.map((a) => a.error))], ['timeout'], 'every attempt ended as a timeout')
    t.ok(
      attempts.every((a) => a.duration_ms >= TIMEOUT_MS - 50),
      'no attempt gave up before the deadline',
    )
    t.ok(longest < TIMEOUT_MS + 10_000, `the deadline held: the longest attempt took ${longest} ms (deadline ${TIMEOUT_MS} ms)`)
    const {
      rows: [states],
    } = await db.query(
      `select count(*) filter (where status = 'retrying')::int as retrying from crm.webhook_deliveries where subscription_id = $1`,
      [bad.body.data.id],
    )
    t.equal(states.retrying, EVENTS, 'each failed delivery is scheduled for its retry')
  } else {
    t.same([...new Set(attempts.map((a) => a.error))], [null], 'every slow answer within the deadline counts as delivered')
    t.ok(
      attempts.every((a) => a.response_status === 200),
      'each answered 200',
    )
  }
  return { fastDoneMs, longest }
}

t.test('a receiver that never answers: attempts time out, the other subscription is not held up', async (t) => {
  const { fastDoneMs, longest } = await scenario(t, async () => (await startBadEndpoint(t, 'hang')).url, 'timeout')
  console.error(
    `# hanging receiver: other subscription done in ${fastDoneMs} ms; longest timed-out attempt ${longest} ms (deadline ${TIMEOUT_MS})`,
  )
})

t.test('a receiver that sends headers then trickles its body forever: the whole-answer deadline holds', async (t) => {
  const { fastDoneMs, longest } = await scenario(t, async () => (await startBadEndpoint(t, 'trickle')).url, 'timeout')
  console.error(
    `# trickling receiver: other subscription done in ${fastDoneMs} ms; longest timed-out attempt ${longest} ms (deadline ${TIMEOUT_MS})`,
  )
})

t.test('a receiver that answers slowly within the deadline: delivered, the other subscription unaffected', async (t) => {
  const { fastDoneMs, longest } = await scenario(
    t,
    async () => {
      const slow = await startReceiver(t)
      slow.answer = () => ({ status: 200, delayMs: 1000 })
      return slow.url
    },
    'delivered',
  )
  console.error(`# slow receiver (1 s): other subscription done in ${fastDoneMs} ms; longest attempt ${longest} ms`)
})
