// Webhook throughput and latency against a fast local receiver, with two baselines measured in the
// same run: graphile-worker's bare job throughput (no-op jobs, the same worker preset) and a bare
// signed-POST loop as the issue defines it: undici, concurrency 50, HMAC-SHA256 keyed with a
// KeyObject from crypto.createSecretKey, signing each request afresh, POSTing a body of exactly the
// size the deliveries send (one real delivery body) to the same receiver.
//
//   node bench/webhooks.ts       prints a markdown report (DATABASE_URL, or an embedded PostgreSQL)
//   BENCH_EVENTS=5000 node bench/webhooks.ts      a quicker run
//   BENCH_RECOVER=500 ...                         fewer deliveries to recover (default 10,000)
//
// The events are contacts with every field and a few custom fields filled, so that each delivery
// body is about 2 KB (the size the issue names). The loop is warmed up before it is timed and runs
// once before and once after the service; the ratio is taken against the faster of the two, so
// neither JIT warm-up nor a burst of other work on the machine flatters the service. The receiver
// runs in a child process, so it never shares an event loop with the worker.
//
// The CPU time per request of each process (worker or loop, receiver, PostgreSQL) is reported too,
// and from it a ceiling: the rate the service would reach if its worker and receiver cost no more
// per delivery than the faster loop's do per request, with PostgreSQL's share as measured and every
// core busy. It shows how much of the gap to the loop is the database's work that logs each attempt.
//
// Recovery (POST .../recover): BENCH_RECOVER deliveries already delivered are turned dead, as a
// receiver outage would leave them (seven failed attempts cost minutes of schedule, not what is
// measured here), then one recovery, as an admin, gives them fresh cycles: the time its transaction
// takes to re-queue them, then the rate at which they are delivered again, against the rate above.
import { type ChildProcess, fork } from 'node:child_process'
import { createHmac, createSecretKey } from 'node:crypto'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { availableParallelism } from 'node:os'
import { fileURLToPath } from 'node:url'
import { Logger, run } from 'graphile-worker'
import pg from 'pg'
import { Pool } from 'undici'
import { BENCH_APP_SECRET, postgresCpuMeter, processCpuMs, provision } from './_database.ts'

const SELF = fileURLToPath(import.meta.url)
const WEBHOOK_SECRET = 'whsec_benchsecret_0000000000000000000000000000000'
const EVENTS = Number(process.env.BENCH_EVENTS ?? 20_000)
const LOOP_WARM_UP = 5_000
const LOOP_CONCURRENCY = 50
const LATENCY_RATE = 100
const LATENCY_SECONDS = Number(process.env.BENCH_LATENCY_SECONDS ?? 10)
const RECOVER = Number(process.env.BENCH_RECOVER ?? 10_000)

type ReceiverStats = { count: number; bytes: number }

// ---------------------------------------------------------------------------------------------
// Child process: the receiver. Answers 200 at once, counts requests and body bytes, and remembers
// when each latency event arrived.
async function receiver(): Promise<void> {
  const arrivals = new Map<string, number>()
  const stats: ReceiverStats = { count: 0, bytes: 0 }
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      const body = Buffer.concat(chunks)
      stats.count++
      stats.bytes += body.length
      const tag = /"email": ?"([^"]+)"/.exec(body.toString('latin1'))?.[1]
      if (tag?.startsWith('lat-')) arrivals.set(tag, Date.now())
      res.end('ok')
    })
  })
  server.keepAliveTimeout = 60_000
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  process.send!({ port: (server.address() as AddressInfo).port })
  process.on('message', (message: { ask: string }) => {
    if (message.ask === 'stats') process.send!(stats)
    if (message.ask === 'arrivals') process.send!({ arrivals: [...arrivals] })
  })
}

function ask<T>(child: ChildProcess, question: string): Promise<T> {
  return new Promise((resolve) => {
    child.once('message', (answer) => resolve(answer as T))
    child.send({ ask: question })
  })
}

// ---------------------------------------------------------------------------------------------
async function until(check: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`${what}: not done within ${timeoutMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))]
const rate = (n: number, ms: number) => Math.round((n / ms) * 1000)
const formatted = (n: number) => n.toLocaleString('en-US')

type CpuPerRequest = { self: number; receiver: number; postgres: number }
/** Starts measuring CPU time; the function it returns gives the CPU per request of `count` requests since. */
type CpuMeter = () => (count: number) => CpuPerRequest

/**
 * The bare loop: `requests` signed POSTs of `body`, LOOP_CONCURRENCY at a time, after LOOP_WARM_UP
 * to warm up; requests per second and the CPU per request of the timed part alone.
 */
async function signedPostLoop(
  port: number,
  body: Buffer,
  requests: number,
  startCpu: CpuMeter,
): Promise<{ rate: number; cpu: CpuPerRequest }> {
  const key = createSecretKey(Buffer.from(WEBHOOK_SECRET, 'utf8'))
  const pool = new Pool(`http://127.0.0.1:${port}`, { connections: LOOP_CONCURRENCY })
  const loop = async (count: number) => {
    let sent = 0
    await Promise.all(
      Array.from({ length: LOOP_CONCURRENCY }, async () => {
        while (sent < count) {
          sent++
          const t = Math.floor(Date.now() / 1000)
          const signature = createHmac('sha256', key).update(`${t}.`).update(body).digest('hex')
          const answer = await pool.request({
            method: 'POST',
            path: '/hook',
            headers: { 'content-type': 'application/json', 'x-service-signature': `t=${t},v1=${signature}` },
            body,
          })
          await answer.body.dump()
        }
      }),
    )
  }
  try {
    await loop(LOOP_WARM_UP)
    const cpuSince = startCpu()
    const started = performance.now()
    await loop(requests)
    const elapsed = performance.now() - started
    return { rate: rate(requests, elapsed), cpu: cpuSince(requests) }
  } finally {
    await pool.close()
  }
}

// A contact as a CRM holds one: every field set, and a few custom fields.
const CONTACT_COLUMNS = `email, first_name, last_name, phone, job_title, city, country, custom_fields`
const contactValues = (
  email: string,
) => `${email}, 'Bench', 'Marker-Holloway', '+44 20 7946 0958', 'Head of Procurement and Vendor Management', 'Manchester', 'United Kingdom',
  jsonb_build_object('account_tier', 'enterprise', 'lead_source', 'partner webinar', 'renewal_month', 'september', 'seats_licensed', 250,
                     'nps', 9, 'newsletter', true, 'region', 'EMEA north', 'account_manager', 'Priya Raman-Whitfield',
                     'billing_address', 'Unit 4, Riverside Business Park, 18 Ordsall Lane, Salford, Greater Manchester M5 4SN',
                     'competitors', 'evaluating two alternatives; incumbent contract ends in March', 'preferred_language', 'en-GB',
                     'last_event', 'spring customer summit, Birmingham: attended the integration workshop and the roadmap session',
                     'notes', 'Prefers e-mail; quarterly business review in the first week of each quarter; procurement portal requires PO numbers on every invoice. ' ||
                              'Decision committee: finance, IT security and the regional operations lead. Evaluating the analytics add-on for the next renewal; ' ||
                              'asked for a data-processing agreement review and a named support contact before expansion. Travels often: calls before 10:00 UK time. ' ||
                              'Renewal owner changes in Q3; introduce the new owner to the customer success lead before the kickoff.')`

async function main(): Promise<void> {
  const db = await provision()
  const child = fork(SELF, ['receiver'], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] })
  const { port } = await new Promise<{ port: number }>((resolve) => child.once('message', (m) => resolve(m as { port: number })))
  const receiverUrl = `http://127.0.0.1:${port}/hook`
  const owner = new pg.Pool({ connectionString: db.url, max: 4 })
  owner.on('error', () => {}) // the database stops before the pool at the end
  try {
    const { migrate } = await import('../src/db/migrate.ts')
    await migrate(db.url)
    const { loadConfig } = await import('../src/config.ts')
    const config = loadConfig({
      DATABASE_URL: db.url,
      APP_SECRET: BENCH_APP_SECRET,
      LOG_LEVEL: 'silent',
      WEBHOOK_ALLOW_HTTP: 'true',
      WEBHOOK_ALLOWED_CIDRS: '127.0.0.0/8',
      // One loopback receiver: the per-host cap would measure itself, not the sender.
      WEBHOOK_HOST_RATE_PER_SECOND: '100000',
      ...(process.env.WORKER_CONCURRENCY ? { WORKER_CONCURRENCY: process.env.WORKER_CONCURRENCY } : {}),
      ...(process.env.WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION
        ? { WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION: process.env.WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION }
        : {}),
    })
    const rows: string[][] = []

    // Baseline 1: graphile-worker's bare job rate with the service's preset.
    await owner.query(
      `select graphile_worker.add_jobs(array(select row('bench_noop', '{}'::json, null, null, 1, null, null, null)::graphile_worker.job_spec from generate_series(1, $1)))`,
      [EVENTS],
    )
    const bareStarted = performance.now()
    const bare = await run({
      taskList: { bench_noop: async () => {} },
      noHandleSignals: true,
      logger: new Logger(() => () => {}),
      preset: {
        worker: {
          connectionString: db.url,
          concurrentJobs: config.workerConcurrency,
          maxPoolSize: config.workerConcurrency + 2,
          pollInterval: 1000,
          localQueue: { size: 100 },
          completeJobBatchDelay: 0,
          failJobBatchDelay: 0,
        },
      },
    })
    await until(
      async () => (await owner.query(`select count(*)::int as n from graphile_worker.jobs`)).rows[0].n === 0,
      300_000,
      'bare jobs',
    )
    const bareMs = performance.now() - bareStarted
    await bare.stop()
    rows.push([
      'graphile-worker bare no-op jobs (baseline)',
      `${formatted(rate(EVENTS, bareMs))} jobs/s`,
      `${formatted(EVENTS)} jobs, concurrency ${config.workerConcurrency}`,
    ])

    // The service: one pro workspace, one subscription to the receiver, the real worker.
    const { sealWebhookSecret, webhookSecretKey } = await import('../src/webhooks/secret-store.ts')
    const {
      rows: [ws],
    } = await owner.query(`insert into crm.workspaces (slug, name, plan) values ('bench-hooks', 'Bench', 'pro') returning id`)
    const {
      rows: [user],
    } = await owner.query(`insert into crm.users (email, name) values ('bench@hooks.test', 'Bench') returning id`)
    await owner.query(
      `insert into crm.memberships (workspace_id, user_id, role_id) select $1, $2, id from crm.roles where workspace_id = $1 and name = 'admin'`,
      [ws.id, user.id],
    )
    const sealed = sealWebhookSecret(webhookSecretKey(BENCH_APP_SECRET), WEBHOOK_SECRET, ws.id)
    const {
      rows: [subscription],
    } = await owner.query(
      `insert into crm.webhook_subscriptions (workspace_id, name, url, events, secret_encrypted, secret_last4) values ($1, 'bench', $2, '{contact.*}', $3, 'last') returning id`,
      [ws.id, receiverUrl, sealed],
    )
    const { createLogger } = await import('../src/log.ts')
    const { startWorker } = await import('../src/worker.ts')
    const { ensureWorkerRole } = await import('../src/db/runtime-role.ts')

    const insertContacts = async (prefix: string, from: number, count: number) => {
      const client = await owner.connect()
      try {
        await client.query('begin')
        await client.query(`select crm.act_as('bench@hooks.test', 'bench-hooks')`)
        await client.query(
          `insert into crm.contacts (${CONTACT_COLUMNS}) select ${contactValues(`$1 || g || '@example.com'`)} from generate_series($2::int, $3::int) g`,
          [prefix, from, from + count - 1],
        )
        await client.query('commit')
      } finally {
        client.release()
      }
    }
    const deliveredCount = async () =>
      (await owner.query(`select count(*)::int as n from crm.webhook_deliveries where status = 'delivered'`)).rows[0].n as number

    // EVENTS contacts committed first (statements of 100 rows, one fan_out_event job each), with
    // the worker stopped.
    const insertStarted = performance.now()
    for (let i = 0; i < EVENTS; i += 100) await insertContacts('tp-', i, Math.min(100, EVENTS - i))
    const insertedMs = performance.now() - insertStarted

    // Baseline 2, before the service: the loop's body is one of these deliveries' bodies exactly
    // as the worker builds it (only delivered_at differs from one attempt to the next).
    const { deliveryBody } = await import('../src/webhooks/delivery-body.ts')
    const {
      rows: [sample],
    } = await owner.query(
      `select body_head, body_tail from crm.webhook_first_attempts_to_send(array(select id from crm.events order by id limit 1))`,
    )
    const loopBody = deliveryBody(sample, new Date())
    // CPU per request of each process, so the ratio can be explained and not only stated.
    const postgresCpu = await postgresCpuMeter((text) => owner.query(text))
    const cpuNow = () => ({
      self: process.cpuUsage(),
      receiver: processCpuMs(child.pid!) ?? Number.NaN,
      postgres: postgresCpu?.() ?? Number.NaN,
    })
    const startCpu: CpuMeter = () => {
      const from = cpuNow()
      return (count) => {
        const to = cpuNow()
        const self = (to.self.user + to.self.system - from.self.user - from.self.system) / 1000
        return {
          self: (self * 1000) / count,
          receiver: ((to.receiver - from.receiver) * 1000) / count,
          postgres: ((to.postgres - from.postgres) * 1000) / count,
        }
      }
    }
    const loopBefore = await signedPostLoop(port, loopBody, EVENTS, startCpu)

    // Throughput: the worker starts and drains the EVENTS events: fan-out, then every delivery
    // with its attempt. Done when every delivery is recorded delivered (the receiver's count, asked
    // first, spares the database most of the polling).
    const before = await ask<ReceiverStats>(child, 'stats')
    const started = performance.now()
    const deliveryCpuSince = startCpu()
    const worker = await startWorker({
      databaseUrl: await ensureWorkerRole(db.url, config.appSecret),
      config,
      logger: createLogger('warn'),
    })
    // The receiver's count over time, for the steady rate: from the 10th to the 90th percentile of
    // arrivals, leaving out the worker's start (connections, first plans) and the tail.
    const arrivalsOverTime: { at: number; count: number }[] = []
    await until(
      async () => {
        const received = (await ask<ReceiverStats>(child, 'stats')).count - before.count
        arrivalsOverTime.push({ at: performance.now(), count: received })
        return received >= EVENTS
      },
      600_000,
      'deliveries received',
    )
    const firstPast = (share: number) => arrivalsOverTime.find((sample) => sample.count >= EVENTS * share)!
    const [steadyFrom, steadyTo] = [firstPast(0.1), firstPast(0.9)]
    const steadyRate = rate(steadyTo.count - steadyFrom.count, steadyTo.at - steadyFrom.at)
    await until(async () => (await deliveredCount()) >= EVENTS, 600_000, 'deliveries recorded')
    const deliveredMs = performance.now() - started
    const deliveryCpu = deliveryCpuSince(EVENTS)
    const after = await ask<ReceiverStats>(child, 'stats')
    const {
      rows: [attempts],
    } = await owner.query(`select count(*)::int as n from crm.webhook_attempts`)
    // A first attempt made by fan_out_event creates its delivery, delivered, at generation 1; one
    // deferred (no slot of the subscription within WAIT_FOR_SLOT_MS) is created pending at
    // generation 2 and attempted by a deliver_webhook job, which costs PostgreSQL a second read of
    // the body and an update (the receiver answers 200 at once: nothing is retried).
    const {
      rows: [deferred],
    } = await owner.query(`select count(*) filter (where generation > 1)::int as n from crm.webhook_deliveries`)
    const deliveryRate = rate(EVENTS, deliveredMs)
    const meanBodyBytes = Math.round((after.bytes - before.bytes) / (after.count - before.count))

    // Latency: 100 events a second, one transaction each, commit to receipt.
    const commits = new Map<string, number>()
    const latencyEvents = LATENCY_RATE * LATENCY_SECONDS
    const latencyStarted = Date.now()
    for (let i = 0; i < latencyEvents; i++) {
      const due = latencyStarted + (i * 1000) / LATENCY_RATE
      const wait = due - Date.now()
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
      await insertContacts('lat-', i, 1)
      commits.set(`lat-${i}@example.com`, Date.now())
    }
    await until(async () => (await deliveredCount()) >= EVENTS + latencyEvents, 120_000, 'latency deliveries')
    const { arrivals } = await ask<{ arrivals: [string, number][] }>(child, 'arrivals')
    const latencies = arrivals.map(([tag, at]) => at - (commits.get(tag) ?? at)).sort((a, b) => a - b)

    // Recovery: RECOVER delivered deliveries turned dead, then one recovery as the workspace's admin.
    const recoverCount = Math.min(RECOVER, EVENTS)
    await owner.query(
      `update crm.webhook_deliveries set status = 'dead', completed_at = now()
        where id in (select id from crm.webhook_deliveries where workspace_id = $1 and status = 'delivered' order by id limit $2)`,
      [ws.id, recoverCount],
    )
    await owner.query('analyze crm.webhook_deliveries')
    const recoverBefore = await ask<ReceiverStats>(child, 'stats')
    const deliveredBeforeRecovery = await deliveredCount()
    const recoverClient = await owner.connect()
    let requeueMs: number
    let recovered: number
    try {
      const requeueStarted = performance.now()
      await recoverClient.query('begin')
      await recoverClient.query(`select crm.act_as('bench@hooks.test', 'bench-hooks')`)
      const {
        rows: [answer],
      } = await recoverClient.query(`select crm.recover_webhook_deliveries($1, now() - interval '1 hour') as n`, [subscription.id])
      await recoverClient.query('commit')
      requeueMs = performance.now() - requeueStarted
      recovered = answer.n
    } finally {
      recoverClient.release()
    }
    if (recovered !== recoverCount) throw new Error(`recovery re-queued ${recovered} deliveries, not ${recoverCount}`)
    const recoverStarted = performance.now()
    await until(
      async () => (await ask<ReceiverStats>(child, 'stats')).count - recoverBefore.count >= recoverCount,
      600_000,
      'recovered deliveries received',
    )
    const recoverReceivedMs = performance.now() - recoverStarted
    await until(async () => (await deliveredCount()) >= deliveredBeforeRecovery + recoverCount, 600_000, 'recovered deliveries recorded')
    const recoverDeliveredMs = performance.now() - recoverStarted
    await worker.stop()

    // Baseline 2 again, after the service.
    const loopAfter = await signedPostLoop(port, loopBody, EVENTS, startCpu)
    const fasterLoop = loopAfter.rate >= loopBefore.rate ? loopAfter : loopBefore
    const loopBest = fasterLoop.rate

    const loopNotes = `${formatted(EVENTS)} requests of ${formatted(loopBody.length)} bytes after ${formatted(LOOP_WARM_UP)} to warm up`
    rows.push([
      `bare signed POST loop, undici, concurrency ${LOOP_CONCURRENCY}, KeyObject HMAC (baseline), before the service`,
      `${formatted(loopBefore.rate)} req/s`,
      loopNotes,
    ])
    rows.push([`the same loop after the service`, `${formatted(loopAfter.rate)} req/s`, loopNotes])
    rows.push([
      'events committed through the outbox (100 rows a statement)',
      `${formatted(rate(EVENTS, insertedMs))} events/s`,
      `${formatted(EVENTS)} contacts, worker stopped`,
    ])
    rows.push([
      'deliveries delivered, every attempt logged',
      `${formatted(deliveryRate)} deliveries/s`,
      `**${Math.round((deliveryRate / loopBest) * 100)}% of the faster loop**; from worker start, fan-out included; ${formatted(attempts.n)} attempts logged; ${formatted(deferred.n)} first attempts deferred to a deliver_webhook job; bodies of ${formatted(meanBodyBytes)} bytes on average`,
    ])
    rows.push([
      'deliveries received, steady rate',
      `${formatted(steadyRate)} deliveries/s`,
      `**${Math.round((steadyRate / loopBest) * 100)}% of the faster loop**; between the 10th and the 90th percentile of arrivals at the receiver (worker start and tail left out)`,
    ])
    rows.push([
      `commit to receipt at ${LATENCY_RATE} events/s, p50`,
      `${percentile(latencies, 50)} ms`,
      `${formatted(latencies.length)} events over ${LATENCY_SECONDS} s`,
    ])
    rows.push([`commit to receipt at ${LATENCY_RATE} events/s, p99`, `${percentile(latencies, 99)} ms`, ''])
    rows.push([
      `recovery of ${formatted(recoverCount)} dead deliveries: re-queued`,
      `${formatted(Math.round(requeueMs))} ms`,
      'one call of crm.recover_webhook_deliveries as the admin (its transaction: one UPDATE and the jobs, 100 deliveries a job)',
    ])
    rows.push([
      `recovery of ${formatted(recoverCount)} dead deliveries: delivered again`,
      `${formatted(rate(recoverCount, recoverDeliveredMs))} deliveries/s`,
      `from the commit to the last recorded delivered (${formatted(rate(recoverCount, recoverReceivedMs))}/s to the last received); the usual rate is the delivered row above`,
    ])

    const micros = (n: number) => (Number.isNaN(n) ? 'n/a' : `${formatted(Math.round(n))} µs`)
    const loopCpuRow = (label: string, cpu: CpuPerRequest) => [
      label,
      micros(cpu.self),
      micros(cpu.receiver),
      '—',
      micros(cpu.self + cpu.receiver),
    ]
    const postgresPerDelivery = Number.isNaN(deliveryCpu.postgres) ? 0 : deliveryCpu.postgres
    const cpuRows = [
      loopCpuRow('bare loop before the service, per request', loopBefore.cpu),
      loopCpuRow('bare loop after the service, per request', loopAfter.cpu),
      [
        'service, per delivery',
        micros(deliveryCpu.self),
        micros(deliveryCpu.receiver),
        micros(deliveryCpu.postgres),
        micros(deliveryCpu.self + deliveryCpu.receiver + postgresPerDelivery),
      ],
    ]
    // What the ratio could be at best with PostgreSQL's share as measured: a worker and a receiver
    // costing no more per delivery than per request of the faster loop, and every core busy.
    const cores = availableParallelism()
    const ceiling = (cores * 1_000_000) / (fasterLoop.cpu.self + fasterLoop.cpu.receiver + postgresPerDelivery)
    console.log(
      `## Webhooks\n\nOne worker process (concurrency ${config.workerConcurrency}, ${config.webhook.concurrencyPerSubscription} in flight per subscription), one subscription, a local receiver answering 200 at once; ${db.label}.\n`,
    )
    console.log('| measure | result | notes |\n|---|---|---|')
    for (const row of rows) console.log(`| ${row.join(' | ')} |`)
    console.log(
      `\nCPU time per request (user + system, from /proc; a loop's figures are for its timed requests; the worker's include fan-out and the job queue):\n`,
    )
    console.log('| | sender: loop or worker | receiver | PostgreSQL | total |\n|---|---:|---:|---:|---:|')
    for (const row of cpuRows) console.log(`| ${row.join(' | ')} |`)
    if (postgresPerDelivery > 0) {
      console.log(
        `\nCeiling: with a worker and a receiver as cheap per delivery as the faster loop is per request, PostgreSQL's ${micros(postgresPerDelivery)} per delivery as measured here, and all ${cores} cores busy, ` +
          `the service would deliver at most ${formatted(Math.round(ceiling))}/s, **${Math.round((ceiling / loopBest) * 100)}% of the faster loop**.`,
      )
    }
  } finally {
    await owner.end()
    child.kill()
    await db.stop()
  }
}

if (process.argv[2] === 'receiver') await receiver()
else await main()
