// The events feed's long polling (docs/api.md section 8a): BENCH_FEED_CLIENTS clients (default
// 1,000) wait on GET /api/events?wait=30 against one API process; an event is committed; each
// client's latency is the time from just before the COMMIT was sent to its answer's last byte
// read, both on this process's clock. The clients are raw keep-alive sockets in this process (one
// each, opened once; no node:http, answers parsed after all have arrived), the API runs in a
// process of its own: on a 2-core machine the clients still share the cores with it. Repeated
// BENCH_FEED_ROUNDS times (default 5), every client asking again with its new cursor, after
// BENCH_FEED_WARM_UP rounds (default 1) timed and printed apart: a service that has served traffic
// has its code optimised by V8, and a first wake measures that compilation more than the wake. The API
// process's database connections (pg_stat_activity, its login role) are sampled every 20 ms
// throughout. Baseline in the same run: a bare pg client LISTENing to the same channel, timed from
// the same point to its notification.
//
//   node bench/events-feed.ts
//   BENCH_FEED_CLIENTS=100 BENCH_FEED_ROUNDS=2 node bench/events-feed.ts
import { spawn } from 'node:child_process'
import net from 'node:net'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { benchWorkspace, provision, startBenchApi } from './_database.ts'

const CLIENTS = Number(process.env.BENCH_FEED_CLIENTS ?? 1000)
const ROUNDS = Number(process.env.BENCH_FEED_ROUNDS ?? 5)
const WARM_UP = Number(process.env.BENCH_FEED_WARM_UP ?? 1)
/** slonik's idle timeout of a pooled connection (5 s), and a little more. */
const POOL_IDLE_MS = 6000

const SELF = fileURLToPath(import.meta.url)

const quantile = (sorted: number[], q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? NaN
const ms = (value: number) => value.toFixed(1)

async function main(): Promise<string> {
  const database = await provision()
  const owner = new pg.Client({ connectionString: database.url })
  const bare = new pg.Client({ connectionString: database.url })
  try {
    const { tenant, slug, admin } = await benchWorkspace(database.url)
    const service = await startServer(database.url)
    await owner.connect()
    await bare.connect()
    await bare.query('listen crm_events')
    let bareHeard: (() => void) | null = null
    bare.on('notification', () => bareHeard?.())

    const { port } = new URL(service.url)
    const request = (cursor: string, wait: number) =>
      `GET /api/events?wait=${wait}&after=${cursor} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer ${admin.token}\r\nx-tenant-slug: ${slug}\r\n\r\n`
    const clients = Array.from({ length: CLIENTS }, () => feedClient(Number(port)))
    const ask = (client: FeedClient, cursor: string, wait: number) => client.get(request(cursor, wait))
    const parsed = ({ at, status, body }: Answer) => {
      const text = body.toString('utf8')
      if (status !== 200) throw new Error(`GET /api/events answered ${status}: ${text}`)
      return { at, body: JSON.parse(text) as { data: unknown[]; next_cursor: string } }
    }
    const start = parsed(await ask(clients[0], '', 0)).body.next_cursor

    // The API process's connections, sampled throughout.
    const samples: number[] = []
    let sampling = true
    const sampler = (async () => {
      while (sampling) {
        const { rows } = await owner.query(
          "select count(*)::int as n from pg_stat_activity where datname = current_database() and usename like 'crm\\_runtime%'",
        )
        samples.push(rows[0].n)
        await new Promise((resolve) => setTimeout(resolve, 20))
      }
    })()

    const processConnections = async () =>
      (
        await owner.query(
          "select count(*)::int as n from pg_stat_activity where datname = current_database() and usename like 'crm\\_runtime%'",
        )
      ).rows[0].n as number
    const atWaitStart: number[] = []
    const latencies: number[] = []
    const bareLatencies: number[] = []
    let heldIdle = Number.NaN
    let cursors = Array.from({ length: CLIENTS }, () => start)
    // ROUNDS rounds with the pool as traffic keeps it, then one more after the clients have waited
    // past the pool's idle timeout: what the waits hold then, and a wake on the connection the pool keeps.
    const coldLatencies: number[] = []
    const warmUpLatencies: number[] = []
    for (let round = -WARM_UP; round <= ROUNDS; round++) {
      const idle = round === ROUNDS
      const answers = clients.map((client, index) => ask(client, cursors[index], 30))
      await service.waiting(CLIENTS)
      atWaitStart.push(await processConnections())
      // The connections the waits' first queries used go back to the pools and close after their
      // idle timeout (5 s); what the waiting clients hold is read after it, just before the commit.
      if (idle) {
        await new Promise((resolve) => setTimeout(resolve, POOL_IDLE_MS))
        heldIdle = await processConnections()
      }
      const heard = new Promise<number>((resolve) => (bareHeard = () => resolve(performance.now())))
      await owner.query('begin')
      await owner.query(
        `insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
         values ($1, 'deal.created', 'deal', gen_random_uuid(), '{"object": {"id": "bench"}}', '{"type": "system", "id": null, "via": "system"}')`,
        [tenant.id],
      )
      const committing = performance.now()
      await owner.query('commit')
      const results = (await Promise.all(answers)).map(parsed)
      bareLatencies.push((await heard) - committing)
      for (const result of results) {
        if (result.body.data.length !== 1) throw new Error(`a client got ${result.body.data.length} events`)
        ;(idle ? coldLatencies : round < 0 ? warmUpLatencies : latencies).push(result.at - committing)
      }
      cursors = results.map((result) => result.body.next_cursor)
    }
    sampling = false
    await sampler
    for (const client of clients) client.close()
    service.stop()

    latencies.sort((a, b) => a - b)
    bareLatencies.sort((a, b) => a - b)
    coldLatencies.sort((a, b) => a - b)
    warmUpLatencies.sort((a, b) => a - b)
    const peak = Math.max(...samples)
    const p99 = quantile(latencies, 0.99)
    return [
      '## Events feed long polling (bench/events-feed.ts)',
      '',
      `${CLIENTS.toLocaleString('en-US')} clients long-poll GET /api/events?wait=30 on one API process (one token, so a woken workspace's identical requests share one query); an event is committed ${WARM_UP} time(s) to warm the API up (a service that has served traffic is warm; those answers are in their own line), then ${ROUNDS} times, and every client asks again with its new cursor after each, then once more after the clients have waited past the pools' idle timeout. Latency: from just before COMMIT was sent to the last byte of a client's answer read, the clients raw keep-alive sockets in one Node process (no node:http), the API in another. Database: ${database.label}.`,
      '',
      '| measure | value | target |',
      '|---|---:|---|',
      `| connections of the API process while ${CLIENTS.toLocaleString('en-US')} clients wait, after the pools' 5 s idle timeout | ${heldIdle} | ≤ 2 ${heldIdle <= 2 ? '✅' : '❌'} |`,
      `| connections of the API process as soon as every client waits (max over rounds: the listener, plus the pool's and the rate-limit settling's idle connections until their timeout) | ${Math.max(...atWaitStart)} | — |`,
      `| connections of the API process, peak of all samples (every 20 ms, the waits' first queries and the wakes included) | ${peak} | — |`,
      `| event to client with the pool as traffic keeps it, p50 / p99 / max (${latencies.length.toLocaleString('en-US')} answers) | ${ms(quantile(latencies, 0.5))} / ${ms(p99)} / ${ms(latencies.at(-1) ?? NaN)} ms | p99 ≤ 100 ms ${p99 <= 100 ? '✅' : '❌'} |`,
      `| warm-up, event to client on the API's first wake(s), not yet optimised by V8, p50 / p99 / max (${warmUpLatencies.length.toLocaleString('en-US')} answers) | ${ms(quantile(warmUpLatencies, 0.5))} / ${ms(quantile(warmUpLatencies, 0.99))} / ${ms(warmUpLatencies.at(-1) ?? NaN)} ms | — |`,
      `| event to client after the pools' idle timeout (the wake's query on the connection the pool keeps), p50 / max (${coldLatencies.length.toLocaleString('en-US')} answers) | ${ms(quantile(coldLatencies, 0.5))} / ${ms(coldLatencies.at(-1) ?? NaN)} ms | — |`,
      `| baseline: a bare LISTEN client's notification, p50 / max (${bareLatencies.length} commits) | ${ms(quantile(bareLatencies, 0.5))} / ${ms(bareLatencies.at(-1) ?? NaN)} ms | — |`,
      '',
    ].join('\n')
  } finally {
    await owner.end().catch(() => {})
    await bare.end().catch(() => {})
    await database.stop()
  }
}

type FeedClient = ReturnType<typeof feedClient>
type Answer = { at: number; status: number; body: Buffer }

/**
 * One keep-alive connection speaking just enough HTTP/1.1 for the feed's answers (a head, then a
 * Content-Length body): a thousand node:http requests in one process cost the clients more than
 * the API spends answering them, and each answer's time would include its turn behind the
 * others' parsing. The time taken is when the answer's last byte is read; parsing comes after.
 */
function feedClient(port: number) {
  const socket = net.connect({ host: '127.0.0.1', port, noDelay: true })
  let buffered: Buffer = Buffer.alloc(0)
  let waiting: { resolve: (answer: Answer) => void; reject: (error: Error) => void } | null = null
  socket.on('data', (chunk: Buffer) => {
    buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk])
    const headEnd = buffered.indexOf('\r\n\r\n')
    if (headEnd < 0) return
    const head = buffered.toString('latin1', 0, headEnd)
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1])
    if (buffered.length < headEnd + 4 + length) return
    const at = performance.now()
    const body = buffered.subarray(headEnd + 4, headEnd + 4 + length)
    buffered = buffered.subarray(headEnd + 4 + length)
    const answered = waiting
    waiting = null
    answered?.resolve({ at, status: Number(head.slice(9, 12)), body })
  })
  socket.on('error', (error) => waiting?.reject(error))
  socket.on('close', () => waiting?.reject(new Error('the API closed a feed connection')))
  return {
    get: (request: string) =>
      new Promise<Answer>((resolve, reject) => {
        waiting = { resolve, reject }
        socket.write(request)
      }),
    close: () => socket.destroy(),
  }
}

/** Child: the API with enough waits for every client, reporting how many wait whenever that changes. */
async function serve(databaseUrl: string): Promise<void> {
  const service = await startBenchApi(databaseUrl, { FEED_WAITS_PER_PROCESS: String(CLIENTS + 10) })
  process.stdout.write(JSON.stringify({ url: service.url }) + '\n')
  let reported = -1
  setInterval(() => {
    const waiting = service.feedListener!.waiting()
    if (waiting !== reported) process.stdout.write(JSON.stringify({ waiting: (reported = waiting) }) + '\n')
  }, 5)
  process.on('SIGTERM', () => void service.stop().then(() => process.exit(0)))
}

/** The API in a process of its own, so the clients' work does not share its event loop. */
async function startServer(databaseUrl: string) {
  const child = spawn(process.execPath, [SELF, '--serve', databaseUrl], { stdio: ['ignore', 'pipe', 'inherit'] })
  let waiting = 0
  let onWaiting = () => {}
  const url = await new Promise<string>((resolve, reject) => {
    let buffer = ''
    child.stdout!.on('data', (chunk: Buffer) => {
      buffer += chunk.toString()
      let newline: number
      while ((newline = buffer.indexOf('\n')) >= 0) {
        const message = JSON.parse(buffer.slice(0, newline))
        buffer = buffer.slice(newline + 1)
        if (message.url) resolve(message.url)
        else {
          waiting = message.waiting
          onWaiting()
        }
      }
    })
    child.once('exit', (code) => reject(new Error(`the API exited with ${code}`)))
  })
  return {
    url,
    waiting: (count: number) =>
      new Promise<void>((resolve) => {
        onWaiting = () => waiting >= count && resolve()
        onWaiting()
      }),
    stop: () => child.kill('SIGTERM'),
  }
}

const [mode, argument] = process.argv.slice(2)
if (mode === '--serve') await serve(argument)
else process.stdout.write((await main()) + '\n')
