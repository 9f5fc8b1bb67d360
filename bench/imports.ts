// Import throughput: a BENCH_IMPORT_ROWS-row contacts file (default 100,000, with a company_name
// column linking 1,000 companies) landed by the process_import job — staging, set-wise checks,
// RLS as crm_api, the outbox events — against the fastest bare load of the same file in the same
// run: a raw COPY ... FROM STDIN of the file's bytes into an unconstrained table (no index, no
// constraint, no trigger). It works against any PostgreSQL, since the client sends the file.
//
//   node bench/imports.ts                       prints a markdown report
//   BENCH_IMPORT_ROWS=20000 node bench/imports.ts
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import pg from 'pg'
import { from as copyFrom } from 'pg-copy-streams'
import { benchWorkspace, contactsFile, processCpuMs, provision, queueContactsImport } from './_database.ts'

const ROWS = Number(process.env.BENCH_IMPORT_ROWS ?? 100_000)

async function main(): Promise<void> {
  const database = await provision()
  try {
    const { inspectCsv } = await import('../src/imports/csv-file.ts')
    const { suggestMapping } = await import('../src/imports/suggest-mapping.ts')
    const { processImport } = await import('../src/imports/process-import.ts')
    const { tenant, admin } = await benchWorkspace(database.url)

    const text = contactsFile(ROWS)
    const bytes = Buffer.from(text)
    const client = new pg.Client({ connectionString: database.url })
    await client.connect()

    // Baseline: the same file into an unconstrained table, as fast as this database takes it.
    await client.query(
      'create table if not exists public.bench_raw (first_name text, last_name text, email text, phone text, job_title text, city text, country text, company text)',
    )
    const baselineLabel = 'raw COPY ... FROM STDIN of the same file into an unconstrained table'
    let started = performance.now()
    await pipeline(Readable.from([bytes]), client.query(copyFrom('copy public.bench_raw from stdin with (format csv, header true)')))
    const baselineSeconds = (performance.now() - started) / 1000
    const {
      rows: [{ n: baselineRows }],
    } = await client.query('select count(*)::int as n from public.bench_raw')

    // The service: upload inspection (what POST .../upload does), then the job.
    started = performance.now()
    const inspection = inspectCsv(bytes)
    const mapping = suggestMapping('contacts', inspection.columns, inspection.sampleRows)
    const inspectSeconds = (performance.now() - started) / 1000
    const createdId = await queueContactsImport(client, { workspaceId: tenant.id, userId: admin.id }, bytes, inspection, mapping)
    const job = { workspace_id: tenant.id, import_id: createdId }
    // The job's database work all happens on this connection's backend: its CPU time per row is
    // steadier than wall time on a shared machine (compare old and new code with it).
    const {
      rows: [{ pid: backendPid }],
    } = await client.query('select pg_backend_pid() as pid')
    const backendBefore = processCpuMs(backendPid)
    started = performance.now()
    await processImport(client, job)
    const importSeconds = (performance.now() - started) / 1000
    const backendAfter = processCpuMs(backendPid)
    const backendPerRow = backendBefore === null || backendAfter === null ? null : ((backendAfter - backendBefore) * 1000) / ROWS
    const {
      rows: [result],
    } = await client.query(
      `select i.created, i.failed, i.companies_created,
              (select count(*)::int from crm.contacts c where c.workspace_id = i.workspace_id) as contacts,
              (select count(*)::int from crm.events e where e.workspace_id = i.workspace_id and e.event = 'contact.created' and e.actor ->> 'via' = 'import') as events
         from crm.imports i where i.workspace_id = $1 and i.id = $2`,
      [tenant.id, createdId],
    )
    await client.end()
    if (result.contacts !== ROWS || result.events !== ROWS || baselineRows !== ROWS)
      throw new Error(`expected ${ROWS} rows everywhere: ${JSON.stringify({ baselineRows, ...result })}`)

    const rate = (seconds: number) => Math.round(ROWS / seconds).toLocaleString('en-US')
    console.log(`## CSV import (bench/imports.ts)

${ROWS.toLocaleString('en-US')} contacts rows (8 columns, a quoted comma and non-ASCII text in every row, ${result.companies_created.toLocaleString('en-US')} companies linked through company_name), ${database.label}.

| what | seconds | rows/s |
|---|---:|---:|
| baseline: ${baselineLabel} | ${baselineSeconds.toFixed(2)} | ${rate(baselineSeconds)} |
| upload inspection (parse, count, sample, suggest mapping) | ${inspectSeconds.toFixed(2)} | ${rate(inspectSeconds)} |
| process_import job: stage, check, land as crm_api with RLS, ${result.events.toLocaleString('en-US')} events | ${importSeconds.toFixed(2)} | ${rate(importSeconds)} |
| **job rows/s vs the raw COPY** | | **${((ROWS / importSeconds / (ROWS / baselineSeconds)) * 100).toFixed(1)} %** (target: ≥ 20,000 rows/s) |
${backendPerRow === null ? '' : `\nThe job's PostgreSQL backend used ${backendPerRow.toFixed(0)} µs of CPU per row (user + system, from /proc).\n`}`)
  } finally {
    await database.stop()
  }
}

await main()
