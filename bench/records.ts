// Records throughput: the real API (bearer auth, one transaction per request, RLS as crm_api)
// against a baseline in the same run — bare node:http + pg running the same SQL as the owner,
// without auth or RLS — for GET one deal, list 50 deals with a filter, and create a deal.
// Then, with BENCH_DEALS deals loaded (default 1,000,000), the list query's plan and latency, and
// GET of a history page of a deal with 1,000 changes (docs/api.md section 5b) as an admin and a member,
// and the UI's deals list page (50 deals as HTML) for a member's browser session.
//
//   node bench/records.ts            prints a markdown report (DATABASE_URL, or an embedded PostgreSQL)
//   BENCH_DEALS=100000 BENCH_SECONDS=5 node bench/records.ts     a quicker run
//
// Each server runs in its own child process so neither shares an event loop with autocannon.
import { type ChildProcess, spawn } from 'node:child_process'
import { createServer } from 'node:http'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { API_NODE_FLAGS, apiNodeFlagsLabel, benchWorkspace, provision, startBenchApi } from './_database.ts'

// autocannon ships no types; this is the part of its API used here. Loaded only by the parent:
// the server child processes must not carry the load generator.
type AutocannonResult = {
  requests: { average: number }
  latency: { p50: number; p99: number }
  errors: number
  timeouts: number
  non2xx: number
}
/** A run: awaited for its result, and an emitter of each response and each failed request. */
type AutocannonInstance = Promise<AutocannonResult> & { on(event: string, listener: (...args: any[]) => void): unknown }
const autocannon = (options: Record<string, unknown>) =>
  (createRequire(import.meta.url)('autocannon') as (options: Record<string, unknown>) => AutocannonInstance)(options)

const SELF = fileURLToPath(import.meta.url)
const ROOT = fileURLToPath(new URL('..', import.meta.url))
const CONNECTIONS = 50
const ROUNDS = 5
/** Changes given to the deal whose history page is measured. */
const HISTORY_CHANGES = 1000

/** target: the share of the baseline's throughput the request path aims for (README, Performance). */
type Scenario = { name: string; method: 'GET' | 'POST'; path: (ids: string[]) => string; body?: string; target: number }

const SCENARIOS: Scenario[] = [
  { name: 'GET one deal', method: 'GET', path: (ids) => `/api/deals/${ids[Math.floor(Math.random() * ids.length)]}`, target: 0.85 },
  { name: 'list 50 deals, filter[stage]=won', method: 'GET', path: () => '/api/deals?filter[stage]=won&limit=50', target: 0.95 },
  {
    name: 'create a deal',
    method: 'POST',
    path: () => '/api/deals',
    body: JSON.stringify({ name: 'Bench deal', amount: '1250.00' }),
    target: 0.85,
  },
]

// ---------------------------------------------------------------------------------------------
// Child process: the real service
async function serveApi(databaseUrl: string): Promise<void> {
  const service = await startBenchApi(databaseUrl)
  process.stdout.write(JSON.stringify({ url: service.url }) + '\n')
  process.on('SIGTERM', () => void service.stop().then(() => process.exit(0)))
}

// Child process: the baseline — the same statements the API runs, as the owner, no auth, no RLS.
async function serveBaseline(databaseUrl: string, workspaceId: string, ownerId: string, poolSize: number): Promise<void> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: poolSize })
  // An idle connection the server ends (at the run's end) is the pool's to drop, not a crash.
  pool.on('error', () => {})
  const server = createServer(async (req, res) => {
    try {
      const url = new URL(req.url ?? '/', 'http://x')
      let status = 200
      let body: unknown
      if (req.method === 'GET' && url.pathname === '/api/deals') {
        const { rows } = await pool.query(
          `select crm.deal_json(t) as record from crm.deals t
            where t.workspace_id = $1 and t.stage = $2
            order by t.created_at asc nulls last, t.id asc nulls last limit $3`,
          [workspaceId, url.searchParams.get('filter[stage]'), Number(url.searchParams.get('limit')) + 1],
        )
        body = { data: rows.slice(0, 50).map((row) => row.record), next_cursor: rows.length > 50 ? 'x' : null }
      } else if (req.method === 'GET' && url.pathname.endsWith('/history')) {
        // The same page as plain SQL on the outbox: the events as stored, no diff per field, no actor's name.
        const { rows } = await pool.query(
          `select e.id, e.occurred_at, e.event, e.actor, e.data from crm.events e
            where e.workspace_id = $1 and e.record_type = 'deal' and e.record_id = $2
            order by e.id desc limit 51`,
          [workspaceId, url.pathname.split('/')[3]],
        )
        body = { data: rows.slice(0, 50), next_cursor: rows.length > 50 ? 'x' : null }
      } else if (req.method === 'GET' && url.pathname.startsWith('/api/deals/')) {
        const { rows } = await pool.query('select crm.deal_json(t) as record from crm.deals t where t.workspace_id = $1 and t.id = $2', [
          workspaceId,
          url.pathname.slice(11),
        ])
        body = { data: rows[0]?.record ?? null }
        if (!rows[0]) status = 404
      } else if (req.method === 'POST' && url.pathname === '/api/deals') {
        const chunks: Buffer[] = []
        for await (const chunk of req) chunks.push(chunk as Buffer)
        const input = JSON.parse(Buffer.concat(chunks).toString('utf8'))
        const { rows } = await pool.query(
          'insert into crm.deals as t (workspace_id, owner_id, name, amount) values ($1, $2, $3, $4) returning crm.deal_json(t) as record',
          [workspaceId, ownerId, input.name, input.amount],
        )
        status = 201
        body = { data: rows[0].record }
      } else {
        status = 404
      }
      const text = JSON.stringify(body)
      res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(text) })
      res.end(text)
    } catch (error) {
      res.writeHead(500)
      res.end(String(error))
    }
  })
  server.listen(0, '127.0.0.1', () => {
    const address = server.address() as { port: number }
    process.stdout.write(JSON.stringify({ url: `http://127.0.0.1:${address.port}` }) + '\n')
  })
  process.on('SIGTERM', () => server.close(() => void pool.end().then(() => process.exit(0))))
}

/** SIGTERM, then SIGKILL if the child has not exited within 10 s. */
function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve()
  return new Promise((resolve) => {
    const kill = setTimeout(() => child.kill('SIGKILL'), 10_000)
    child.once('exit', () => {
      clearTimeout(kill)
      resolve()
    })
    child.kill('SIGTERM')
  })
}

function startChild(args: string[], nodeFlags: string[] = []): Promise<{ url: string; child: ChildProcess }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...nodeFlags, SELF, ...args], { stdio: ['ignore', 'pipe', 'inherit'], cwd: ROOT })
    let buffer = ''
    child.stdout!.on('data', (chunk: Buffer) => {
      buffer += chunk.toString()
      const line = buffer.split('\n')[0]
      if (buffer.includes('\n')) {
        try {
          resolve({ url: (JSON.parse(line) as { url: string }).url, child })
        } catch (error) {
          reject(error)
        }
      }
    })
    child.on('exit', (code) => reject(new Error(`${args[0]} exited with ${code}`)))
  })
}

// ---------------------------------------------------------------------------------------------
// The parent: database, data, load, report

type Result = { rps: number; p50: number; p99: number; errors: number; non2xx: number; kinds: Map<string, number> }

async function load(url: string, scenario: Scenario, ids: string[], seconds: number, headers: Record<string, string>): Promise<Result> {
  // What each failed request was: its status, or the client's error (a timeout, a reset).
  const kinds = new Map<string, number>()
  const note = (kind: string) => kinds.set(kind, (kinds.get(kind) ?? 0) + 1)
  const instance = autocannon({
    url,
    connections: CONNECTIONS,
    duration: seconds,
    headers: { ...headers, ...(scenario.body ? { 'content-type': 'application/json' } : {}) },
    requests: [
      { method: scenario.method, setupRequest: (request: any) => ({ ...request, path: scenario.path(ids), body: scenario.body }) },
    ],
  })
  instance.on('response', (_client: unknown, statusCode: number) => {
    if (statusCode < 200 || statusCode > 299) note(`HTTP ${statusCode}`)
  })
  instance.on('reqError', (error: NodeJS.ErrnoException) => note(error.code ?? error.message))
  const result = await instance
  return {
    rps: result.requests.average,
    p50: result.latency.p50,
    p99: result.latency.p99,
    errors: result.errors + result.timeouts,
    non2xx: result.non2xx,
    kinds,
  }
}

export async function seedDeals(
  client: pg.Client,
  workspaceId: string,
  ownerId: string,
  count: number,
  log: (line: string) => void,
): Promise<void> {
  // Bulk load as the owner without the outbox trigger: a million deal.created events would only
  // measure the loader. The API requests below keep every trigger.
  const chunk = 100_000
  for (let start = 0; start < count; start += chunk) {
    const size = Math.min(chunk, count - start)
    await client.query('begin')
    await client.query('alter table crm.deals disable trigger tg_deals__events_insert')
    await client.query(
      `insert into crm.deals (workspace_id, owner_id, created_by, updated_by, name, amount, stage, close_date, created_at, updated_at, stage_changed_at)
       select $1, $2, $2, $2, 'Deal ' || g, (g % 100000)::numeric / 4,
              (array['lead', 'qualified', 'proposal', 'negotiation', 'won', 'lost'])[1 + g % 6],
              date '2026-01-01' + (g % 365), ts, ts, ts
         from generate_series($3::int, $4::int) as g,
              lateral (select now() - interval '1 second' * ($4::int - g)) as x (ts)`,
      [workspaceId, ownerId, start + 1, start + size],
    )
    await client.query('alter table crm.deals enable trigger tg_deals__events_insert')
    await client.query('commit')
    log(`  loaded ${start + size} deals`)
  }
  // Vacuumed, not only analysed: otherwise autovacuum processes the million new rows during the
  // first scenario, in whichever side's slices it lands (seen as a p99 of 0.9 s in one API slice).
  await client.query('vacuum (analyze) crm.deals')
  // The load's dirty pages written now rather than by the checkpointer during a scenario (needs a
  // superuser or pg_checkpoint, which a DATABASE_URL's role may lack: then it is skipped).
  await client.query('checkpoint').catch(() => {})
}

/**
 * A migrated database's new workspace with `count` deals (seedDeals), an owner's client connected to
 * it, and 1,000 of the deals' ids at random, among which the requests for one deal pick.
 */
export async function workspaceWithDeals(url: string, count: number, log: (line: string) => void) {
  const { tenant, slug, admin } = await benchWorkspace(url)
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  log(`loading ${count} deals into workspace ${slug}`)
  const loadStarted = Date.now()
  await seedDeals(client, tenant.id, admin.id, count, log)
  const loadSeconds = Math.round((Date.now() - loadStarted) / 1000)
  const { rows } = await client.query('select id from crm.deals where workspace_id = $1 order by random() limit 1000', [tenant.id])
  return { tenant, slug, admin, client, ids: rows.map((row) => row.id as string), loadSeconds }
}

/** Rounds of one side: mean throughput, median p50, worst p99, all errors. */
function combine(rounds: Result[]): Result {
  const sorted = rounds.map((round) => round.p50).sort((a, b) => a - b)
  return {
    rps: rounds.reduce((sum, round) => sum + round.rps, 0) / rounds.length,
    p50: sorted[Math.floor(sorted.length / 2)],
    p99: Math.max(...rounds.map((round) => round.p99)),
    errors: rounds.reduce((sum, round) => sum + round.errors, 0),
    non2xx: rounds.reduce((sum, round) => sum + round.non2xx, 0),
    kinds: new Map(
      rounds
        .flatMap((round) => [...round.kinds])
        .reduce((all, [kind, n]) => all.set(kind, (all.get(kind) ?? 0) + n), new Map<string, number>()),
    ),
  }
}

/** The failed requests of a side by kind, e.g. `1 × HTTP 503`; empty when none failed. */
function failureKinds(result: Result): string {
  return [...result.kinds].map(([kind, n]) => `${n} × ${kind}`).join(', ')
}

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]
}

/** Gives a deal `changes` updates as the admin (crm.act_as, so the outbox names an actor), each its own event. */
async function giveHistory(client: pg.Client, email: string, slug: string, dealId: string, changes: number): Promise<void> {
  await client.query('begin')
  await client.query('select crm.act_as($1, $2), set_config($3, $4, true)', [email, slug, 'bench.history_deal', dealId])
  await client.query(`
    do $$
    begin
      for i in 1..${changes} loop
        update crm.deals set amount = amount + 1, custom_fields = jsonb_build_object('step', i)
         where id = current_setting('bench.history_deal')::uuid;
      end loop;
    end
    $$`)
  await client.query('commit')
}

/** Latencies (ms) of `count` GETs of `path` one after another, after 20 unmeasured ones. */
async function sequentialGets(url: string, path: string, headers: Record<string, string>, count: number): Promise<number[]> {
  const timings: number[] = []
  for (let i = -20; i < count; i++) {
    const started = performance.now()
    const response = await fetch(url + path, { headers })
    if (response.status !== 200 || response.redirected) throw new Error(`GET ${path} answered ${response.status}: ${await response.text()}`)
    await response.arrayBuffer()
    if (i >= 0) timings.push(performance.now() - started)
  }
  return timings
}

export async function benchRecords(options: { deals?: number; seconds?: number; log?: (line: string) => void } = {}): Promise<string> {
  const log = options.log ?? ((line: string) => process.stderr.write(line + '\n'))
  const dealCount = options.deals ?? Number(process.env.BENCH_DEALS ?? 1_000_000)
  const seconds = options.seconds ?? Number(process.env.BENCH_SECONDS ?? 10)
  const database = await provision()
  const children: ChildProcess[] = []
  try {
    const { tenant, slug, admin, client, ids, loadSeconds } = await workspaceWithDeals(database.url, dealCount, log)
    const historyDeal = ids[0]
    await giveHistory(client, admin.email, slug, historyDeal, HISTORY_CHANGES)
    // Statistics of the events as autovacuum would leave them after 1,000 new rows: the planner
    // memoizes the history's per-record check from them.
    await client.query('analyze crm.events')

    // The list query exactly as the API builds it, run as the admin through crm.act_as (RLS on).
    const { sql, createDatabasePool } = await import('../src/db/pool.ts')
    const { DEAL } = await import('../src/records/fields.ts')
    const { parseListRequest } = await import('../src/records/list-parameters.ts')
    const { listQuery } = await import('../src/records/list-query.ts')
    const { historyPageQuery } = await import('../src/records/history.ts')
    const { parseQueryString } = await import('../src/records/query-string.ts')
    const request = parseListRequest(DEAL, parseQueryString('/api/deals?filter[stage]=won&limit=50'))
    const pool = await createDatabasePool(database.url, { maxPoolSize: 2 })
    const { plan, timings, historyPlan, historyTimings } = await pool.transaction(async (db) => {
      await db.query(sql.unsafe`select crm.act_as(${admin.email}, ${slug})`)
      const plan = (await db.anyFirst(sql.unsafe`explain (analyze, buffers, costs off) ${listQuery(DEAL, request)}`)) as string[]
      const timings: number[] = []
      for (let i = 0; i < 200; i++) {
        const started = performance.now()
        await db.any(sql.unsafe`${listQuery(DEAL, request)}`)
        timings.push(performance.now() - started)
      }
      // The history page's statement as the API runs it for the admin, planned and timed in SQL.
      const historyPage = historyPageQuery(DEAL, historyDeal, null, 50)
      const historyPlan = (await db.anyFirst(sql.unsafe`explain (analyze, buffers, costs off) ${historyPage}`)) as string[]
      const historyTimings: number[] = []
      for (let i = 0; i < 200; i++) {
        const started = performance.now()
        await db.one(historyPage)
        historyTimings.push(performance.now() - started)
      }
      return { plan, timings, historyPlan, historyTimings }
    })
    await pool.end()
    const usesIndex = plan.some((line) => /Index (Only )?Scan/.test(line)) && !plan.some((line) => /Seq Scan on deals/.test(line))

    // The API's process with the service's V8 flags; the baseline's with Node's defaults.
    const api = await startChild(['--serve-api', database.url], API_NODE_FLAGS)
    children.push(api.child)
    const baseline = await startChild(['--serve-baseline', database.url, tenant.id, admin.id, '20'])
    children.push(baseline.child)
    // BENCH_TOKEN_SCOPES=deals:read,deals:write: the API is called with a token limited to these
    // scopes (the proven context then carries them), instead of the admin's unscoped token.
    const scopes = process.env.BENCH_TOKEN_SCOPES?.split(',')
    const { addMember, mintToken, withOwner } = await import('../test/helpers/fixtures.ts')
    const token = scopes ? await withOwner(database.url, (owner) => mintToken(owner, admin.id, { scopes })) : admin.token
    const auth = { authorization: `Bearer ${token}`, 'x-tenant-slug': slug }
    const member = await withOwner(database.url, (owner) => addMember(owner, tenant.id, `member@${slug}.test`, 'member'))
    const historyPath = `/api/deals/${historyDeal}/history`
    const historyAsAdmin = await sequentialGets(api.url, historyPath, auth, 200)
    const historyAsMember = await sequentialGets(
      api.url,
      historyPath,
      { authorization: `Bearer ${member.token}`, 'x-tenant-slug': slug },
      200,
    )
    const historyP50 = Math.max(percentile(historyAsAdmin, 50), percentile(historyAsMember, 50))
    const historyBare = await sequentialGets(baseline.url, historyPath, {}, 200)
    // The statement reads one page of events and makes the diffs of those rows only.
    const historyEvents = Number(/Index Scan Backward using \w+ on events e[^\n]*rows=(\d+)/.exec(historyPlan.join('\n'))?.[1] ?? NaN)
    // Who may read is asked once per record when the planner memoizes the view's check, else per event.
    const memoized = /Cache Key: \w+\.record_type, \w+\.workspace_id, \w+\.record_id\n[^\n]*\n\s*Hits: (\d+)\s+Misses: (\d+)/.exec(
      historyPlan.join('\n'),
    )
    const historyChecks = memoized ? `${memoized[2]} (Memoize, ${memoized[1]} hits)` : 'one per event (no Memoize in the plan)'
    // The deals list page of the UI (docs/api.md section 12): 50 deals rendered as HTML for a member's browser session.
    const session = await withOwner(database.url, (owner) => mintToken(owner, member.id, { kind: 'session' }))
    const dealsPage = await sequentialGets(
      api.url,
      '/deals',
      { cookie: `crm_session=${session}; crm_workspace=${slug}`, accept: 'text/html' },
      200,
    )

    const rows: string[] = []
    const failures: string[] = []
    for (const scenario of SCENARIOS) {
      log(`${scenario.name}: baseline and API in turns (${ROUNDS} × ${seconds / ROUNDS} s each, ${CONNECTIONS} connections)`)
      // Taking turns in short slices puts both under the same background load, so the ratio
      // holds even on a machine that is doing other work.
      const bareRounds: Result[] = []
      const realRounds: Result[] = []
      for (let round = 0; round < ROUNDS; round++) {
        bareRounds.push(await load(baseline.url, scenario, ids, seconds / ROUNDS, {}))
        realRounds.push(await load(api.url, scenario, ids, seconds / ROUNDS, auth))
      }
      const bare = combine(bareRounds)
      const real = combine(realRounds)
      for (const [side, result] of [['API', real] as const, ['baseline', bare] as const]) {
        if (result.kinds.size > 0) failures.push(`${scenario.name}, ${side}: ${failureKinds(result)}`)
      }
      const ratio = real.rps / bare.rps
      const goal = `${Math.round(scenario.target * 100)}%`
      const target = ratio >= scenario.target ? ` ✅ ≥ ${goal}` : ` ❌ < ${goal}`
      rows.push(
        `| ${scenario.name} | ${Math.round(real.rps)} | ${real.p50} | ${real.p99} | ${Math.round(bare.rps)} | ${bare.p50} | ${bare.p99} | ${Math.round(ratio * 100)}%${target} | ${real.errors + real.non2xx} / ${bare.errors + bare.non2xx} |`,
      )
    }
    const { rows: version } = await client.query('show server_version')
    await client.end()

    return [
      `## Records API on PostgreSQL ${String(version[0].server_version).split(/[ .]/)[0]} (${new Date().toISOString().slice(0, 10)})`,
      '',
      `PostgreSQL ${version[0].server_version} (${database.label}), Node ${process.version}, ${dealCount.toLocaleString('en')} deals in one workspace (loaded in ${loadSeconds} s), autocannon ${CONNECTIONS} connections, ${seconds} s per side per row in ${ROUNDS} alternating slices (p50: median of the slices; p99: the worst slice), pool of 20 connections on both sides.`,
      `API = the real service (${apiNodeFlagsLabel()}; bearer token, crm.authenticate, rate-limit counter, RLS as crm_api; slonik, single-statement reads on plain pg); baseline = bare node:http + pg running the same SQL as the table owner (no auth, no RLS).`,
      '',
      '| scenario | API req/s | API p50 ms | API p99 ms | baseline req/s | baseline p50 ms | baseline p99 ms | API / baseline | errors (API / baseline) |',
      '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
      ...rows,
      '',
      ...(failures.length > 0 ? [`Failed requests by kind: ${failures.join('; ')}.`, ''] : []),
      `List query (\`filter[stage]=won&limit=50\`, default sort) as the admin through \`crm.act_as\`, 200 runs one after another: p50 ${percentile(timings, 50).toFixed(2)} ms, p99 ${percentile(timings, 99).toFixed(2)} ms (target p50 < 10 ms: ${percentile(timings, 50) < 10 ? '✅' : '❌'}); index used: ${usesIndex ? '✅' : '❌'}.`,
      '',
      `History page (\`GET /api/deals/{id}/history\`, 50 of a deal's ${HISTORY_CHANGES.toLocaleString('en')} changes) over HTTP, 200 requests one after another, admin / member (view all): p50 ${percentile(historyAsAdmin, 50).toFixed(2)} / ${percentile(historyAsMember, 50).toFixed(2)} ms, p99 ${percentile(historyAsAdmin, 99).toFixed(2)} / ${percentile(historyAsMember, 99).toFixed(2)} ms (target p50 < 10 ms: ${historyP50 < 10 ? '✅' : '❌'}); baseline, the same page of events as plain SQL on node-postgres behind bare node:http (no diffs): p50 ${percentile(historyBare, 50).toFixed(2)} ms, p99 ${percentile(historyBare, 99).toFixed(2)} ms. The page's statement alone as the admin in SQL: p50 ${percentile(historyTimings, 50).toFixed(2)} ms; events read by its page scan: ${historyEvents} (one page and the row that says whether another follows); calls of crm.may_read_record_history: ${historyChecks}.`,
      '',
      `Deals list page of the UI (\`GET /deals\`: 50 deals as HTML with their companies and owners, a member's session cookie) over HTTP, 200 requests one after another: p50 ${percentile(dealsPage, 50).toFixed(2)} ms, p99 ${percentile(dealsPage, 99).toFixed(2)} ms (target p99 < 50 ms: ${percentile(dealsPage, 99) < 50 ? '✅' : '❌'}).`,
      '',
      '```',
      ...plan,
      '```',
      '',
      'The history page, `explain (analyze, buffers)` as the admin:',
      '',
      '```',
      ...historyPlan,
      '```',
      '',
    ].join('\n')
  } finally {
    // The servers go first, so none of their connections sees the database stop under it.
    await Promise.all(children.map(stopChild))
    await database.stop()
  }
}

const [mode, ...args] = process.argv.slice(2)
if (process.argv[1] === SELF) {
  if (mode === '--serve-api') await serveApi(args[0])
  else if (mode === '--serve-baseline') await serveBaseline(args[0], args[1], args[2], Number(args[3]))
  else process.stdout.write((await benchRecords()) + '\n')
}
