// Batch routes (docs/api.md section 5a) against single requests in the same run: records per second
// of single creates, batch creates of 100 and batch upserts of 100 (match_on email, half of each
// batch updating contacts that exist, half creating new ones), through the real API.
//
//   node bench/batch.ts                          prints a markdown section (DATABASE_URL, or an embedded PostgreSQL)
//   BENCH_SECONDS=2 node bench/batch.ts          a quicker run
//
// The service runs in this process: the load is a few fetch loops, far lighter than the service.
//
// Beside the service, in the same run: the same upsert batches as one plain SQL statement each from a
// bare loop of node-postgres clients, as the table's owner on a copy of crm.contacts with its indexes
// and constraints but no RLS and no triggers (so no events), then on a copy without the two GIN
// search indexes. They say what this host can do at all, and what the search indexes alone cost.
import pg from 'pg'
import { benchWorkspace, postgresCpuMeter, provision, startBenchApi } from './_database.ts'

const CONCURRENCY = 8
const BATCH = 100

type Scenario = { name: string; path: string; records: number; request: (n: number) => { path: string; body: unknown } }

type Result = { recordsPerSecond: number; failed: number; requests: number; apiCpuUs: number; postgresCpuUs: number }

/** Runs `send` from CONCURRENCY loops for `seconds`; CPU per record of this process and of PostgreSQL. */
async function measure(
  records: number,
  seconds: number,
  postgresCpuMs: (() => number) | null,
  send: (n: number) => Promise<boolean>,
): Promise<Result> {
  const deadline = performance.now() + seconds * 1000
  const started = performance.now()
  const cpuBefore = process.cpuUsage()
  const postgresBefore = postgresCpuMs?.() ?? Number.NaN
  let requests = 0
  let failed = 0
  let counter = 0
  const worker = async () => {
    while (performance.now() < deadline) {
      if (!(await send(counter++))) failed++
      requests++
    }
  }
  await Promise.all(Array.from({ length: CONCURRENCY }, worker))
  const cpu = process.cpuUsage(cpuBefore)
  const total = requests * records
  return {
    recordsPerSecond: total / ((performance.now() - started) / 1000),
    failed,
    requests,
    apiCpuUs: (cpu.user + cpu.system) / total,
    postgresCpuUs: (((postgresCpuMs?.() ?? Number.NaN) - postgresBefore) * 1000) / total,
  }
}

/**
 * Copies of crm.contacts (same columns, constraints and indexes, its rows included, no RLS, no
 * triggers) in a schema of their own: `bare` with every index, `bare_no_search` without the GIN
 * search indexes.
 */
async function bareTables(client: pg.Client): Promise<string[]> {
  await client.query('drop schema if exists bench_bare cascade; create schema bench_bare')
  const tables = ['bench_bare.bare', 'bench_bare.bare_no_search']
  for (const table of tables) {
    await client.query(`create table ${table} (like crm.contacts including all); insert into ${table} select * from crm.contacts`)
  }
  const { rows } = await client.query<{ name: string }>(
    `select indexname as name from pg_indexes where schemaname = 'bench_bare' and tablename = 'bare_no_search'
      and (indexdef like '%gin_trgm_ops%' or indexdef like '%to_tsvector%')`,
  )
  for (const { name } of rows) await client.query(`drop index bench_bare.${name}`)
  await client.query('analyze bench_bare.bare; analyze bench_bare.bare_no_search')
  return tables
}

const micros = (value: number) => (Number.isFinite(value) ? `${Math.round(value)} µs` : '—')

export async function benchBatch(seconds = Number(process.env.BENCH_SECONDS ?? 10)): Promise<string> {
  const database = await provision()
  try {
    const { slug, admin } = await benchWorkspace(database.url)
    const service = await startBenchApi(database.url)
    const client = new pg.Client({ connectionString: database.url })
    await client.connect()
    const postgresCpuMs = await postgresCpuMeter((text) => client.query(text))
    const headers = { authorization: `Bearer ${admin.token}`, 'x-tenant-slug': slug, 'content-type': 'application/json' }
    const run = Date.now().toString(36)
    const contacts = (n: number, offset = 0) =>
      Array.from({ length: BATCH }, (_, index) => ({ first_name: 'Bench', email: `c${n}-${index + offset}@${run}.test` }))
    // Upsert batch n updates 50 contacts of a batch the batch-create row made and creates 50 new ones.
    let created = 1
    const upsertInputs = (n: number) =>
      Array.from({ length: BATCH }, (_, index) => ({
        email: index < 50 ? `c${n % created}-${index + 1}@${run}.test` : `u${n}-${index}@${run}.test`,
        job_title: `n${n}`,
      }))
    const scenarios: Scenario[] = [
      {
        name: 'single creates (POST /api/contacts)',
        path: 'single',
        records: 1,
        request: (n) => ({ path: '/api/contacts', body: contacts(n)[0] }),
      },
      {
        name: `batch create of ${BATCH}`,
        path: 'create',
        records: BATCH,
        request: (n) => ({ path: '/api/contacts/batch/create', body: { inputs: contacts(n, 1) } }),
      },
      {
        name: `batch upsert of ${BATCH} (match_on email, half updates)`,
        path: 'upsert',
        records: BATCH,
        request: (n) => ({ path: '/api/contacts/batch/upsert', body: { match_on: 'email', inputs: upsertInputs(n) } }),
      },
    ]
    const results = []
    for (const scenario of scenarios) {
      process.stderr.write(`${scenario.name}: ${seconds} s, ${CONCURRENCY} concurrent requests\n`)
      const result = await measure(scenario.records, seconds, postgresCpuMs, async (n) => {
        const { path, body } = scenario.request(n)
        const response = await fetch(`${service.url}${path}`, { method: 'POST', headers, body: JSON.stringify(body) })
        const answer = (await response.json()) as { counts?: { failed: number } }
        return response.ok && (answer.counts?.failed ?? 0) === 0
      })
      results.push({ name: scenario.name, ...result })
      if (scenario.path === 'create') created = result.requests
    }
    await service.stop()
    const {
      rows: [{ workspace_id }],
    } = await client.query<{ workspace_id: string }>('select id as workspace_id from crm.workspaces where slug = $1', [slug])
    const bare = []
    const pool = new pg.Pool({ connectionString: database.url, max: CONCURRENCY })
    for (const [copy, table] of (await bareTables(client)).entries()) {
      const name = `bare SQL upsert of ${BATCH}, ${table.endsWith('no_search') ? 'without the GIN search indexes' : 'same indexes'} (no API, RLS or events)`
      process.stderr.write(`${name}: ${seconds} s, ${CONCURRENCY} concurrent clients\n`)
      const result = await measure(BATCH, seconds, postgresCpuMs, async (n) => {
        // New contacts get e-mails of their own per copy; the updated half are those the creates made.
        const inputs = upsertInputs(n).map((input) => ({ ...input, email: input.email.replace(/^u/, `b${copy}-`) }))
        const { rowCount } = await pool.query(
          `insert into ${table} (workspace_id, first_name, email, job_title, owner_id, created_by, updated_by)
           select $1, 'Bench', email, job_title, $2, $2, $2 from unnest($3::text[], $4::text[]) as input (email, job_title)
           on conflict (workspace_id, email) do update
             set job_title = excluded.job_title, updated_at = now(), updated_by = excluded.updated_by
           returning *`,
          [workspace_id, admin.id, inputs.map((input) => input.email), inputs.map((input) => input.job_title)],
        )
        return rowCount === BATCH
      })
      bare.push({ name, ...result })
    }
    await pool.end()
    await client.query('drop schema bench_bare cascade')
    await client.end()
    const single = results[0].recordsPerSecond
    const targets = ['—', '≥ 10× single creates', '≥ 20,000 records/s']
    const met = [true, results[1].recordsPerSecond >= 10 * single, results[2].recordsPerSecond >= 20_000]
    return [
      `## Batch routes (${new Date().toISOString().slice(0, 10)})`,
      '',
      `${database.label}, Node ${process.version}; ${CONCURRENCY} concurrent requests for ${seconds} s per row, the service in the same process, one admin token. Upserts run on contacts that exist for half of each batch.`,
      '',
      '| scenario | records/s | × single creates | target | failed requests | CPU per record: API / PostgreSQL |',
      '|---|---:|---:|---|---:|---:|',
      ...[...results, ...bare].map(
        (result, index) =>
          `| ${result.name} | ${Math.round(result.recordsPerSecond).toLocaleString('en-US')} | ${(result.recordsPerSecond / single).toFixed(1)} | ${targets[index] ?? '—'} ${index === 0 || index > 2 ? '' : met[index] ? '✅' : '❌'} | ${result.failed} | ${micros(result.apiCpuUs)} / ${micros(result.postgresCpuUs)} |`,
      ),
      '',
    ].join('\n')
  } finally {
    await database.stop()
  }
}

if (import.meta.main) process.stdout.write((await benchBatch()) + '\n')
