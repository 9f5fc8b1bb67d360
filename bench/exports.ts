// Export throughput and memory: BENCH_EXPORT_DEALS deals (default 1,000,000) exported through the
// real API (`crm serve --no-worker` in a child process) as CSV and as NDJSON; rows/s and the API
// process's peak RSS (VmHWM), against a baseline in the same run: the same SELECT streamed by a
// bare pg-query-stream client as the owner (no HTTP, no RLS, no formatting in JavaScript).
//
//   node bench/exports.ts
//   BENCH_EXPORT_DEALS=200000 node bench/exports.ts
//   BENCH_LOG_LEVEL=info node bench/exports.ts      (the API's log lines in the output)
//   BENCH_NODE_FLAGS=--max-semi-space-size=4 node bench/exports.ts   (other V8 flags for the API process
//   than the service's own, SERVICE_NODE_FLAGS, which `make bench` passes from the Makefile)
import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import QueryStream from 'pg-query-stream'
import { API_NODE_FLAGS, apiNodeFlagsLabel, BENCH_APP_SECRET, benchWorkspace, provision } from './_database.ts'

const DEALS = Number(process.env.BENCH_EXPORT_DEALS ?? 1_000_000)
const ROOT = fileURLToPath(new URL('..', import.meta.url))

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const server = createServer().listen(0, '127.0.0.1', () => {
      const port = (server.address() as { port: number }).port
      server.close(() => resolve(port))
    })
  })
}

function peakRssMiB(pid: number): number {
  const match = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return match ? Number(match[1]) / 1024 : NaN
}

function currentRssMiB(pid: number): number {
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return match ? Number(match[1]) / 1024 : NaN
}

async function main(): Promise<void> {
  const database = await provision()
  let child: ReturnType<typeof spawn> | null = null
  const client = new pg.Client({ connectionString: database.url })
  try {
    const { tenant, admin } = await benchWorkspace(database.url)

    await client.connect()
    const loadStarted = performance.now()
    // Loaded as the owner with the outbox trigger off: this bench measures reading, not writing.
    await client.query('begin')
    await client.query('alter table crm.deals disable trigger tg_deals__events_insert')
    for (let start = 0; start < DEALS; start += 100_000) {
      await client.query(
        `insert into crm.deals (workspace_id, owner_id, created_by, updated_by, name, amount, currency, stage, close_date, custom_fields)
         select $1, $2, $2, $2, 'Deal ' || g || case when g % 10 = 0 then ', Zürich "special"' else '' end, (g % 100000)::numeric / 100, 'EUR',
                (array['lead', 'qualified', 'proposal', 'negotiation', 'won', 'lost'])[1 + g % 6], date '2026-01-01' + (g % 365),
                case when g % 3 = 0 then jsonb_build_object('tier', 'gold') else '{}'::jsonb end
           from generate_series($3::int, $4::int) g`,
        [tenant.id, admin.id, start + 1, Math.min(start + 100_000, DEALS)],
      )
    }
    await client.query('alter table crm.deals enable trigger tg_deals__events_insert')
    await client.query('commit')
    await client.query('analyze crm.deals')
    const loadSeconds = (performance.now() - loadStarted) / 1000

    const port = await freePort()
    child = spawn(process.execPath, [...API_NODE_FLAGS, 'bin/crm.js', 'serve', '--no-worker'], {
      cwd: ROOT,
      env: {
        ...process.env,
        DATABASE_URL: database.url,
        PORT: String(port),
        HOST: '127.0.0.1',
        APP_SECRET: BENCH_APP_SECRET,
        LOG_LEVEL: process.env.BENCH_LOG_LEVEL ?? 'error',
        RATE_LIMIT_PER_MINUTE: '1000000',
      },
      // The API's log (errors only, unless BENCH_LOG_LEVEL says more) shows in the bench's output.
      stdio: ['ignore', 'inherit', 'inherit'],
    })
    const base = `http://127.0.0.1:${port}`
    for (let waited = 0; ; waited += 100) {
      const ready = await fetch(`${base}/healthz`).then(
        (response) => response.ok,
        () => false,
      )
      if (ready) break
      if (waited > 30_000) throw new Error('the API did not start')
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    const idleRss = currentRssMiB(child.pid!)

    const exportOnce = async (body: unknown) => {
      const started = performance.now()
      const response = await fetch(`${base}/api/deals/export`, {
        method: 'POST',
        headers: { authorization: `Bearer ${admin.token}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      })
      if (response.status !== 200) throw new Error(`export answered ${response.status}: ${await response.text()}`)
      const firstByte = performance.now() - started
      let bytes = 0
      let lines = 0
      // The API's RSS as each further tenth of the rows arrives: flat, whatever the row count.
      const rssByTenth: number[] = []
      for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
        bytes += chunk.length
        for (let i = 0; i < chunk.length; i++) if (chunk[i] === 0x0a) lines++
        if (lines >= ((rssByTenth.length + 1) * DEALS) / 10) rssByTenth.push(currentRssMiB(child!.pid!))
      }
      return { seconds: (performance.now() - started) / 1000, firstByteMs: firstByte, bytes, lines, rssByTenth }
    }
    const csv = await exportOnce({ format: 'csv' })
    const csvPeak = peakRssMiB(child.pid!)
    const ndjson = await exportOnce({ format: 'ndjson' })
    const peak = peakRssMiB(child.pid!)
    if (csv.lines !== DEALS + 1 || ndjson.lines !== DEALS)
      throw new Error(`expected ${DEALS} rows: csv ${csv.lines - 1}, ndjson ${ndjson.lines}`)

    // Baseline: the same rows and order through a bare server-side cursor, as the owner.
    const started = performance.now()
    let baselineRows = 0
    const stream = client.query(
      new QueryStream(
        'select crm.deal_json(t)::text as line from crm.deals t where t.workspace_id = $1 order by t.created_at, t.id',
        [tenant.id],
        { batchSize: 1000 },
      ),
    )
    for await (const _row of stream) baselineRows++
    const baselineSeconds = (performance.now() - started) / 1000

    const rate = (seconds: number) => Math.round(DEALS / seconds).toLocaleString('en-US')
    const mib = (value: number) => value.toFixed(0)
    console.log(`## Streaming export (bench/exports.ts)

${DEALS.toLocaleString('en-US')} deals (loaded in ${loadSeconds.toFixed(0)} s), exported through \`POST /api/deals/export\` by the real API in its own process (${apiNodeFlagsLabel()}), ${database.label}. Peak RSS is the API process's VmHWM (it was ${mib(idleRss)} MiB idle).

| what | seconds | rows/s | first byte | size | API peak RSS |
|---|---:|---:|---:|---:|---:|
| baseline: bare pg-query-stream of crm.deal_json, owner, no HTTP (${baselineRows.toLocaleString('en-US')} rows) | ${baselineSeconds.toFixed(2)} | ${rate(baselineSeconds)} | | | |
| CSV, every field | ${csv.seconds.toFixed(2)} | ${rate(csv.seconds)} | ${csv.firstByteMs.toFixed(0)} ms | ${mib(csv.bytes / 2 ** 20)} MiB | ${mib(csvPeak)} MiB |
| NDJSON, every field | ${ndjson.seconds.toFixed(2)} | ${rate(ndjson.seconds)} | ${ndjson.firstByteMs.toFixed(0)} ms | ${mib(ndjson.bytes / 2 ** 20)} MiB | ${mib(peak)} MiB |

API RSS as each tenth of the rows arrived (MiB), CSV: ${csv.rssByTenth.map(mib).join(', ')}; NDJSON: ${ndjson.rssByTenth.map(mib).join(', ')}.

Targets: ≥ 100,000 rows/s and peak RSS < 200 MiB.
`)
  } finally {
    child?.kill('SIGTERM')
    // Closed before the server stops: a connection the shutdown terminates would raise its own
    // error and hide the one that ended the run.
    await client.end().catch(() => {})
    await database.stop()
  }
}

await main()
