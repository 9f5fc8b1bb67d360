// Profiling aid for the import (not run by `make bench`: files starting with _ are helpers). Runs
// the bench's contacts file through processImport with every statement timed (µs per file row,
// summed over batches) and prints the CPU time the PostgreSQL backend used per row (/proc).
//   node bench/_profile-imports.ts               env: BENCH_IMPORT_ROWS (100,000), BATCH (the job default), TOP (25)
//   PERF=/tmp/perf.data PERF_ARGS='-F 250 --call-graph dwarf,24000' ...   perf record on the backend
//   EXPLAIN=20 ...                               auto_explain (analyze, verbose, trigger times) of statements over 20 ms
//   FLOOR=all|events|keys|indexes ...            an experiment on this throwaway database, never a change to make:
//     the contacts table without what the rules put on each landed row: all of it (the outbox
//     trigger, the two foreign keys and the company visibility check, the search and custom-field
//     indexes), which leaves the import's own pipeline (read, parse, stage, type, check, land), or
//     one of those three parts
// A COPY's time shows up in the statement queued after it (pg sends it once the COPY completes).
import { spawn } from 'node:child_process'
import pg from 'pg'
import { benchWorkspace, contactsFile, processCpuMs, provision, queueContactsImport } from './_database.ts'

const ROWS = Number(process.env.BENCH_IMPORT_ROWS ?? 100_000)
const BATCH = process.env.BATCH ? Number(process.env.BATCH) : undefined

// The job's backend is local (an embedded PostgreSQL, or DATABASE_URL on this machine).
const cpu = (pid: number) => processCpuMs(pid) ?? 0

const database = await provision()
try {
  const { inspectCsv } = await import('../src/imports/csv-file.ts')
  const { suggestMapping } = await import('../src/imports/suggest-mapping.ts')
  const { processImport } = await import('../src/imports/process-import.ts')
  const { tenant, admin } = await benchWorkspace(database.url)
  const bytes = Buffer.from(contactsFile(ROWS))
  const client = new pg.Client({ connectionString: database.url })
  await client.connect()
  const {
    rows: [{ pid }],
  } = await client.query('select pg_backend_pid() as pid')
  const inspection = inspectCsv(bytes)
  const mapping = suggestMapping('contacts', inspection.columns, inspection.sampleRows)
  const createdId = await queueContactsImport(client, { workspaceId: tenant.id, userId: admin.id }, bytes, inspection, mapping)
  const times = new Map<string, { ms: number; n: number }>()
  let stagedAt = 0
  let stagedCpu = { node: { user: 0, system: 0 }, backend: 0 }
  let nodeCpu0 = process.cpuUsage()
  const original = client.query.bind(client) as any
  ;(client as any).query = (text: any, values?: any) => {
    if (typeof text !== 'string') return original(text, values)
    const key = text.replace(/\s+/g, ' ').trim().slice(0, 110)
    if (stagedAt === 0 && key.startsWith('select * from crm.begin_import_batch')) {
      stagedAt = performance.now()
      stagedCpu = { node: process.cpuUsage(nodeCpu0), backend: cpu(pid) - cpu0 }
    }
    const started = performance.now()
    const result = original(text, values)
    return result.then((value: any) => {
      const entry = times.get(key) ?? { ms: 0, n: 0 }
      entry.ms += performance.now() - started
      entry.n++
      times.set(key, entry)
      return value
    })
  }
  let perf: ReturnType<typeof spawn> | null = null
  if (process.env.PERF) {
    perf = spawn(
      'perf',
      ['record', '-e', 'cpu-clock', ...(process.env.PERF_ARGS ?? '-g').split(' '), '-p', String(pid), '-o', process.env.PERF],
      { stdio: 'inherit' },
    )
    await new Promise((resolve) => setTimeout(resolve, 500))
  }
  if (process.env.EXPLAIN) {
    await client.query(`load 'auto_explain'`)
    await client.query(
      `set auto_explain.log_min_duration = ${Number(process.env.EXPLAIN)}; set auto_explain.log_analyze = on; set auto_explain.log_verbose = on; set auto_explain.log_triggers = on; set auto_explain.log_nested_statements = on; set client_min_messages = log`,
    )
    client.on('notice', (notice: any) => console.log(notice.message))
  }
  const floor = process.env.FLOOR ?? ''
  if (floor === 'all' || floor === 'events') await original('alter table crm.contacts disable trigger tg_contacts__events_insert')
  if (floor === 'all' || floor === 'keys') {
    await original(`alter table crm.contacts disable trigger tg_contacts__company_visible_insert;
      alter table crm.contacts drop constraint contacts_company_fkey, drop constraint contacts_owner_fkey`)
  }
  if (floor === 'all' || floor === 'indexes')
    await original('drop index crm.contacts_search_trigram, crm.contacts_search_words, crm.contacts_custom_fields')
  const cpu0 = cpu(pid)
  nodeCpu0 = process.cpuUsage()
  const started = performance.now()
  await processImport(client as any, { workspace_id: tenant.id, import_id: createdId }, BATCH ? { batchSize: BATCH } : {})
  const wall = performance.now() - started
  const cpu1 = cpu(pid)
  if (perf) {
    perf.kill('SIGINT')
    await new Promise((resolve) => perf!.on('exit', resolve))
  }
  const {
    rows: [check],
  } = await original(
    `select (select count(*)::int from crm.contacts where workspace_id = $1) as contacts, (select count(*)::int from crm.events where workspace_id = $1) as events`,
    [tenant.id],
  )
  await client.end()
  const sorted = [...times.entries()].sort((a, b) => b[1].ms - a[1].ms)
  console.log(
    `staging (read, parse, COPY) ${(stagedAt - started).toFixed(0)} ms = ${(((stagedAt - started) * 1000) / ROWS).toFixed(1)} µs/row wall; node cpu ${((stagedCpu.node.user + stagedCpu.node.system) / ROWS).toFixed(1)} µs/row, backend cpu ${((stagedCpu.backend * 1000) / ROWS).toFixed(1)} µs/row`,
  )
  console.log(
    `rows ${ROWS} wall ${(wall / 1000).toFixed(2)} s = ${Math.round(ROWS / (wall / 1000))} rows/s; backend cpu ${cpu1 - cpu0} ms = ${(((cpu1 - cpu0) * 1000) / ROWS).toFixed(1)} µs/row; contacts ${check.contacts} events ${check.events}`,
  )
  for (const [key, { ms, n }] of sorted.slice(0, Number(process.env.TOP ?? 25))) {
    console.log(`${((ms * 1000) / ROWS).toFixed(1).padStart(7)} µs/row ${String(n).padStart(4)}x  ${key}`)
  }
} finally {
  await database.stop()
}
