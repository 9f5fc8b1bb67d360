// kill -9 of the API process and of the worker process under mixed load (creates retried with
// their Idempotency-Key on connection errors, updates, reads, webhooks to a loopback receiver),
// then restart both: nothing the service confirmed is lost, no key wrote twice, every committed
// change has its event, and every event still reaches the receiver.
import t from 'tap'
import { createTestDatabase } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { sleep, startCrm } from '../helpers/processes.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from '../webhooks/receiver.ts'
import { checkEvents, checkEveryEventDelivered, checkNoLostWrites } from './invariants.ts'
import { Load } from './load.ts'

const ENV = { ...WEBHOOK_TEST_ENV, RATE_LIMIT_PER_MINUTE: '1000000', LOG_LEVEL: 'warn' }

t.test('kill -9 the API and the worker under load, restart them: nothing lost, nothing doubled', async (t) => {
  const databaseUrl = await createTestDatabase(t)
  const tenant = await createTenant(databaseUrl, { plan: 'pro', members: { 'admin@kill.test': 'admin' } })
  const token = tenant.members['admin@kill.test'].token
  const receiver = await startReceiver(t)
  receiver.answer = () => ({ status: 200, delayMs: 30 })

  const api = await startCrm(t, 'api', { databaseUrl, env: ENV })
  const worker = await startCrm(t, 'worker', { databaseUrl, env: ENV })
  const subscription = await fetch(`${api.url}/api/webhook-subscriptions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'kill', url: receiver.url, events: ['contact.*'] }),
  })
  t.equal(subscription.status, 201, 'subscription created')

  const load = new Load({ urls: [api.url], token, concurrency: 6 })
  load.start()
  const started = Date.now()
  const faults: string[] = []

  await sleep(3000)
  const beforeApiKill = load.confirmed.size
  await api.kill9()
  faults.push(`API killed after ${beforeApiKill} confirmed creates`)
  await sleep(700)
  await api.start()
  await sleep(2500)

  const beforeWorkerKill = receiver.received.length
  await worker.kill9()
  faults.push(`worker killed after ${beforeWorkerKill} deliveries received`)
  await sleep(1500)

  // Both at once, mid-traffic.
  await Promise.all([api.kill9(), worker.kill9()])
  faults.push('API and worker killed together')
  await sleep(500)
  await Promise.all([api.start(), worker.start()])
  await sleep(3000)
  await load.stop()
  const loadSeconds = (Date.now() - started) / 1000

  const summary = load.summary()
  const connectionErrors = Object.values(load.summary().byKind).reduce(
    (sum, kind) =>
      sum +
      Object.entries(kind.statuses)
        .filter(([label]) => label.startsWith('error:'))
        .reduce((n, [, count]) => n + count, 0),
    0,
  )
  t.ok(
    load.confirmed.size > beforeApiKill,
    `creates went on after the restarts (${beforeApiKill} before the first kill, ${load.confirmed.size} in all)`,
  )
  t.ok(connectionErrors > 0, `the kills hit requests in flight (${connectionErrors} connection errors seen by clients)`)
  t.same(load.unexpected, [], 'no 500 and no unexpected status')
  t.equal(load.hangs, 0, 'no request hung')
  t.same(load.abandoned, [], 'every create eventually succeeded with its key')

  await checkNoLostWrites(t, databaseUrl, tenant.id, load)
  await checkEvents(t, databaseUrl, tenant.id, load)
  const events = await checkEveryEventDelivered(t, databaseUrl, tenant.id, [receiver])
  const uniqueDeliveries = new Set(receiver.received.map((r) => r.headers['x-service-delivery-id'])).size
  t.same(
    api
      .errorLines()
      .concat(worker.errorLines())
      .filter((line) => !/heartbeat/.test(line))
      .slice(0, 5),
    [],
    'no error logged by the restarted processes',
  )
  // stderr: tap passes it through to the terminal (stdout is the TAP stream).
  console.error(
    `# faults: ${faults.join('; ')}. ${summary.requests} requests in ${loadSeconds.toFixed(1)} s (${connectionErrors} connection errors during kills), ` +
      `${load.confirmed.size} creates confirmed (${load.retriedCreates} retries), ${load.updates.length} updates, ` +
      `${events} events, ${receiver.received.length} webhook requests for ${uniqueDeliveries} deliveries`,
  )
})
