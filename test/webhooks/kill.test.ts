// Kill safety: a worker process killed with SIGKILL while deliveries are in flight leaves its
// jobs locked; the restarted worker's heartbeat unlocks them, so every event still reaches the
// receiver and no delivery stays stuck. The test waits for conditions only: the receiver holds
// every answer until the kill, so deliveries are in flight then however fast or slow the machine
// is, and a job's completion (after its task's transaction commits) is waited for like the rest.
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
  let answerHeld = () => {}
  const held = new Promise<void>((resolve) => {
    answerHeld = resolve
  })
  t.teardown(() => answerHeld())
  receiver.answer = () => ({ status: 200, hold: held })
  await server.request('POST', '/api/webhook-subscriptions', { token, body: { name: 'k', url: receiver.url, events: ['contact.created'] } })

  const first = startWorkerProcess(t, server.databaseUrl)
  const total = 40
  for (let i = 0; i < total; i++) await server.request('POST', '/api/contacts', { token, body: { email: `k${i}@example.com` } })
  // Unanswered deliveries: the worker is mid-delivery, its jobs locked.
  await receiver.waitFor((all) => all.length >= 3, 60_000)
  const killedAt = Date.now()
  first.kill('SIGKILL')
  await new Promise((resolve) => first.once('exit', resolve))
  receiver.answer = () => ({ status: 200 })
  answerHeld()
  const receivedBeforeKill = new Set(receiver.received.map((r) => r.body.id)).size
  t.ok(receivedBeforeKill < total, `killed with deliveries outstanding (${receivedBeforeKill} of ${total} received)`)

  const owner = await ownerClient(t, server.databaseUrl)
  const {
    rows: [locked],
  } = await owner.query(`select count(*)::int as n from graphile_worker._private_jobs where locked_by is not null`)
  t.ok(locked.n > 0, `the killed worker left ${locked.n} jobs locked`)

  startWorkerProcess(t, server.databaseUrl)
  // The unlock comes 30 s after the killed pool's last beat (src/worker-heartbeat.ts); the deadlines
  // only bound a failure, and the time itself is reported, not asserted.
  await receiver.waitFor((all) => new Set(all.map((r) => r.body.id)).size === total, 120_000)
  const recoveredMs = Date.now() - killedAt
  t.comment(`every event arrived ${Math.round(recoveredMs / 1000)} s after the kill`)
  // graphile-worker removes a job after its task returned, so after the delivery was recorded:
  // the rows and the jobs are waited for together, not the one and then a single look at the other.
  const settled = await waitUntil(
    async () => {
      const {
        rows: [row],
      } = await owner.query(
        `select count(*) filter (where status <> 'delivered')::int as open, count(*)::int as all,
                (select count(*)::int from graphile_worker._private_jobs
                  where task_id = (select id from graphile_worker._private_tasks where identifier = 'deliver_webhook')) as jobs
           from crm.webhook_deliveries`,
      )
      return row.open === 0 && row.all === total && row.jobs === 0 ? row : null
    },
    // Events received before the kill are recorded only by the unlocked jobs' second run.
    90_000,
    'all deliveries delivered and no deliver_webhook job left',
  )
  t.same(settled, { open: 0, all: total, jobs: 0 }, 'every delivery delivered, no deliver_webhook job is left behind')
})
