// Webhook throughput and latency against a fast local receiver, with two baselines measured in the
// same run: graphile-worker's bare job throughput (no-op jobs, the same worker preset) and a bare
// signed-POST loop (undici, concurrency 50, same receiver).
//
//   node bench/webhooks.ts       prints a markdown report (DATABASE_URL, or an embedded PostgreSQL)
//   BENCH_EVENTS=5000 node bench/webhooks.ts      a quicker run
//
// The receiver runs in a child process, so it never shares an event loop with the worker.
import { fork, type ChildProcess } from 'node:child_process'
import { createHmac } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { run, Logger } from 'graphile-worker'
import { Pool } from 'undici'

const SELF = fileURLToPath(import.meta.url)
const APP_SECRET = 'bench-app-secret-that-is-long-enough-0123456789'
const EVENTS = Number(process.env.BENCH_EVENTS ?? 20_000)
const LATENCY_RATE = 100
const LATENCY_SECONDS = Number(process.env.BENCH_LATENCY_SECONDS ?? 10)

// ---------------------------------------------------------------------------------------------
// Child process: the receiver. Answers 200 at once and remembers when each event arrived.
async function receiver(): Promise<void> {
  const arrivals = new Map<string, number>()
  let count = 0
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      count++
      const tag = /"email":"([^"]+)"/.exec(Buffer.concat(chunks).toString('latin1'))?.[1]
      if (tag?.startsWith('lat-')) arrivals.set(tag, Date.now())
      res.end('ok')
    })
  })
  server.keepAliveTimeout = 60_000
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  process.send!({ port: (server.address() as AddressInfo).port })
  process.on('message', (message: { ask: string }) => {
    if (message.ask === 'count') process.send!({ count })
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
async function database(): Promise<{ url: string; stop: () => Promise<void> }> {
  if (process.env.DATABASE_URL) return { url: process.env.DATABASE_URL, stop: async () => {} }
  const { startEmbeddedPostgres } = await import('../src/db/provision.ts')
  const baseDir = mkdtempSync(join(tmpdir(), 'crm-bench-webhooks-'))
  const db = await startEmbeddedPostgres({ baseDir, database: 'crm_bench', persistent: false, durability: 'none' })
  return {
    url: db.url,
    stop: async () => {
      await db.stop()
      rmSync(baseDir, { recursive: true, force: true })
    },
  }
}

async function until(check: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`${what}: not done within ${timeoutMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))]
const rate = (n: number, ms: number) => Math.round((n / ms) * 1000)

async function main(): Promise<void> {
  const db = await database()
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
      APP_SECRET,
      LOG_LEVEL: 'silent',
      WEBHOOK_ALLOW_HTTP: 'true',
      WEBHOOK_ALLOWED_CIDRS: '127.0.0.0/8',
      ...(process.env.WORKER_CONCURRENCY ? { WORKER_CONCURRENCY: process.env.WORKER_CONCURRENCY } : {}),
      ...(process.env.WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION ? { WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION: process.env.WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION } : {}),
    })
    const rows: string[][] = []

    // Baseline 1: graphile-worker's bare job rate with the service's preset.
    await owner.query(`select graphile_worker.add_jobs(array(select row('bench_noop', '{}'::json, null, null, 1, null, null, null)::graphile_worker.job_spec from generate_series(1, $1)))`, [EVENTS])
    const bareStarted = performance.now()
    const bare = await run({
      taskList: { bench_noop: async () => {} },
      noHandleSignals: true,
      logger: new Logger(() => () => {}),
      preset: { worker: { connectionString: db.url, concurrentJobs: config.workerConcurrency, maxPoolSize: config.workerConcurrency + 2, pollInterval: 1000, localQueue: { size: 100 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
    })
    await until(async () => (await owner.query(`select count(*)::int as n from graphile_worker.jobs`)).rows[0].n === 0, 300_000, 'bare jobs')
    const bareMs = performance.now() - bareStarted
    await bare.stop()
    rows.push(['graphile-worker bare no-op jobs (baseline)', `${rate(EVENTS, bareMs)} jobs/s`, `${EVENTS} jobs, concurrency ${config.workerConcurrency}`])

    // Baseline 2: a bare signed-POST loop, undici, concurrency 50.
    const body = JSON.stringify({ id: 'x', event: 'contact.created', data: { object: { email: 'x@example.com', first_name: 'Bench', custom_fields: {} } }, pad: 'p'.repeat(600) })
    const pool = new Pool(`http://127.0.0.1:${port}`, { connections: 50 })
    let sent = 0
    const loopStarted = performance.now()
    await Promise.all(
      Array.from({ length: 50 }, async () => {
        while (sent < EVENTS) {
          sent++
          const t = Math.floor(Date.now() / 1000)
          const signature = createHmac('sha256', 'whsec_benchsecret').update(`${t}.`).update(body).digest('hex')
          const answer = await pool.request({ method: 'POST', path: '/hook', headers: { 'content-type': 'application/json', 'x-service-signature': `t=${t},v1=${signature}` }, body })
          await answer.body.dump()
        }
      }),
    )
    const loopMs = performance.now() - loopStarted
    await pool.close()
    const loopRate = rate(EVENTS, loopMs)
    rows.push(['bare signed POST loop, undici, concurrency 50 (baseline)', `${loopRate} req/s`, `${EVENTS} requests`])

    // The service: one pro workspace, one subscription to the receiver, the real worker.
    const { sealWebhookSecret, webhookSecretKey } = await import('../src/webhooks/secret-store.ts')
    const { rows: [ws] } = await owner.query(`insert into crm.workspaces (slug, name, plan) values ('bench-hooks', 'Bench', 'pro') returning id`)
    const { rows: [user] } = await owner.query(`insert into crm.users (email, name) values ('bench@hooks.test', 'Bench') returning id`)
    await owner.query(`insert into crm.memberships (workspace_id, user_id, role_id) select $1, $2, id from crm.roles where workspace_id = $1 and name = 'admin'`, [ws.id, user.id])
    const sealed = sealWebhookSecret(webhookSecretKey(APP_SECRET), 'whsec_benchsecret_0000000000000000000000000000000', ws.id)
    await owner.query(`insert into crm.webhook_subscriptions (workspace_id, name, url, events, secret_encrypted, secret_last4) values ($1, 'bench', $2, '{contact.*}', $3, 'last')`, [ws.id, receiverUrl, sealed])
    const { createLogger } = await import('../src/log.ts')
    const { startWorker } = await import('../src/worker.ts')

    const insertContacts = async (prefix: string, from: number, count: number) => {
      const client = await owner.connect()
      try {
        await client.query('begin')
        await client.query(`select crm.act_as('bench@hooks.test', 'bench-hooks')`)
        await client.query(`insert into crm.contacts (email, first_name) select $1 || g || '@example.com', 'Bench' from generate_series($2::int, $3::int) g`, [prefix, from, from + count - 1])
        await client.query('commit')
      } finally {
        client.release()
      }
    }
    const countDeliveries = async (status?: string) =>
      (await owner.query(`select count(*)::int as n from crm.webhook_deliveries ${status ? `where status = '${status}'` : ''}`)).rows[0].n as number

    // Throughput: EVENTS contacts committed first (statements of 100 rows, one fan_out_event job
    // each), then the worker starts and drains them: fan-out, then every delivery with its attempt.
    const insertStarted = performance.now()
    for (let i = 0; i < EVENTS; i += 100) await insertContacts('tp-', i, Math.min(100, EVENTS - i))
    const insertedMs = performance.now() - insertStarted
    const started = performance.now()
    const worker = await startWorker({ databaseUrl: db.url, config, logger: createLogger('warn') })
    let fannedOutMs = 0
    await until(async () => (await countDeliveries()) >= EVENTS, 600_000, 'fan-out').then(() => (fannedOutMs = performance.now() - started))
    await until(async () => (await countDeliveries('delivered')) >= EVENTS, 600_000, 'deliveries')
    const deliveredMs = performance.now() - started
    const { rows: [attempts] } = await owner.query(`select count(*)::int as n from crm.webhook_attempts`)
    rows.push(['events committed through the outbox (100 rows a statement)', `${rate(EVENTS, insertedMs)} events/s`, `${EVENTS} contacts, worker stopped`])
    rows.push(['events fanned out (deliveries created)', `${rate(EVENTS, fannedOutMs)} events/s`, 'from worker start'])
    const deliveryRate = rate(EVENTS, deliveredMs)
    rows.push(['deliveries delivered, every attempt logged', `${deliveryRate} deliveries/s`, `${attempts.n} attempts logged; ${Math.round((deliveryRate / loopRate) * 100)}% of the bare loop; includes the fan-out`])

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
    await until(async () => (await countDeliveries('delivered')) >= EVENTS + latencyEvents, 120_000, 'latency deliveries')
    const { arrivals } = await ask<{ arrivals: [string, number][] }>(child, 'arrivals')
    const latencies = arrivals.map(([tag, at]) => at - (commits.get(tag) ?? at)).sort((a, b) => a - b)
    rows.push([`commit to receipt at ${LATENCY_RATE} events/s, p50`, `${percentile(latencies, 50)} ms`, `${latencies.length} events over ${LATENCY_SECONDS} s`])
    rows.push([`commit to receipt at ${LATENCY_RATE} events/s, p99`, `${percentile(latencies, 99)} ms`, ''])
    await worker.stop()

    console.log(`## Webhooks\n\nOne worker process (concurrency ${config.workerConcurrency}, ${config.webhook.concurrencyPerSubscription} in flight per subscription), one subscription, a local receiver answering 200 at once.\n`)
    console.log('| measure | result | notes |\n|---|---|---|')
    for (const row of rows) console.log(`| ${row.join(' | ')} |`)
  } finally {
    await owner.end()
    child.kill()
    await db.stop()
  }
}

if (process.argv[2] === 'receiver') await receiver()
else await main()
