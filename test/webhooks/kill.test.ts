// Kill safety: a worker process killed with SIGKILL while deliveries are in flight leaves its
// jobs locked; the restarted worker's heartbeat unlocks them, so every event still reaches the
// receiver within a minute and no delivery stays stuck.
import { type ChildProcess, spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer, TEST_APP_SECRET } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV, waitUntil } from './receiver.ts'

const CLI = fileURLToPath(new URL('../../bin/crm.js', import.meta.url))

function startWorkerProcess(t: { teardown: (fn: () => unknown) => void }, databaseUrl: string): ChildProcess {
  const child = spawn(process.execPath, [CLI, 'worker'], {
    env: { ...process.env, ...WEBHOOK_TEST_ENV, DATABASE_URL: databaseUrl, APP_SECRET: TEST_APP_SECRET, LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'ignore', 'inherit'],
  })
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  })
  return child
}

t.test('kill -9 a worker mid-delivery, restart it: every event arrives, nothing stays stuck', async (t) => {
  const server = await startTestServer(t, { worker: false, env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  receiver.answer = () => ({ status: 200, delayMs: 300 })
  await server.request('POST', '/api/webhook-subscriptions', { token, body: { name: 'k', url: receiver.url, events: ['contact.created'] } })

  const first = startWorkerProcess(t, server.databaseUrl)
  const total = 40
  for (let i = 0; i < total; i++) await server.request('POST', '/api/contacts', { token, body: { email: `k${i}@example.com` } })
  await receiver.waitFor((all) => all.length >= 3, 30_000)
  const killedAt = Date.now()
  first.kill('SIGKILL')
  await new Promise((resolve) => first.once('exit', resolve))
  const receivedBeforeKill = new Set(receiver.received.map((r) => r.body.id)).size
  t.ok(receivedBeforeKill < total, `killed with deliveries outstanding (${receivedBeforeKill} of ${total} received)`)

  const owner = await ownerClient(t, server.databaseUrl)
  const {
    rows: [locked],
  } = await owner.query(`select count(*)::int as n from graphile_worker._private_jobs where locked_by is not null`)
  t.ok(locked.n > 0, `the killed worker left ${locked.n} jobs locked`)

  startWorkerProcess(t, server.databaseUrl)
  await receiver.waitFor((all) => new Set(all.map((r) => r.body.id)).size === total, 60_000)
  const recoveredMs = Date.now() - killedAt
  // The minute is the wait's deadline above; the time itself is reported, not asserted.
  t.comment(`every event arrived ${Math.round(recoveredMs / 1000)} s after the kill`)
  await waitUntil(
    async () => {
      const {
        rows: [row],
      } = await owner.query(
        `select count(*) filter (where status <> 'delivered')::int as open, count(*)::int as all from crm.webhook_deliveries`,
      )
      return row.open === 0 && row.all === total
    },
    10_000,
    'all deliveries delivered',
  )
  const {
    rows: [jobs],
  } = await owner.query(
    `select count(*)::int as n from graphile_worker._private_jobs where task_id = (select id from graphile_worker._private_tasks where identifier = 'deliver_webhook')`,
  )
  t.equal(jobs.n, 0, 'no deliver_webhook job is left behind')
})
