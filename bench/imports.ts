// Import throughput: a BENCH_IMPORT_ROWS-row contacts file (default 100,000, with a company_name
// column linking 1,000 companies) landed by the process_import job — staging, set-wise checks,
// RLS as crm_api, the outbox events — against the fastest bare load of the same file in the same
// run: a server-side COPY into an unconstrained table (or, when the database user may not read
// server files, one INSERT ... SELECT FROM json_to_recordset per 5,000 rows).
//
//   node bench/imports.ts                       prints a markdown report
//   BENCH_IMPORT_ROWS=20000 node bench/imports.ts
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import { benchWorkspace, provision } from './_database.ts'

const ROWS = Number(process.env.BENCH_IMPORT_ROWS ?? 100_000)

function contactsFile(rows: number): string {
  const lines = ['First Name,Last Name,Email,Phone,Job Title,City,Country,Company']
  for (let i = 1; i <= rows; i++) {
    lines.push(`Ann${i},"O'Neil, Jr.",ann${i}@example.com,+1 555 010 ${String(i % 10000).padStart(4, '0')},Engineer,Zürich,Switzerland,"Company ${i % 1000}, Inc."`)
  }
  return lines.join('\n') + '\n'
}

async function main(): Promise<void> {
  const database = await provision()
  const workDir = mkdtempSync(join(tmpdir(), 'crm-bench-import-'))
  try {
    const { inspectCsv } = await import('../src/imports/csv-file.ts')
    const { suggestMapping } = await import('../src/imports/suggest-mapping.ts')
    const { processImport } = await import('../src/imports/process-import.ts')
    const { tenant, admin } = await benchWorkspace(database.url)

    const text = contactsFile(ROWS)
    const bytes = Buffer.from(text)
    const file = join(workDir, 'contacts.csv')
    writeFileSync(file, bytes)
    const client = new pg.Client({ connectionString: database.url })
    await client.connect()

    // Baseline: the same rows into an unconstrained table, as fast as this database takes them.
    await client.query('create unlogged table if not exists public.bench_raw (first_name text, last_name text, email text, phone text, job_title text, city text, country text, company text)')
    await client.query('alter table public.bench_raw set logged')
    let baselineLabel = 'server-side COPY into an unconstrained table'
    let started = performance.now()
    try {
      await client.query(`copy public.bench_raw from '${file.replace(/'/g, "''")}' with (format csv, header true)`)
    } catch {
      baselineLabel = 'INSERT ... SELECT FROM json_to_recordset, 5,000 rows a statement, into an unconstrained table'
      started = performance.now()
      const { readCsvRecords } = await import('../src/imports/csv-file.ts')
      let chunk: string[][] = []
      const flush = async () => {
        await client.query(
          `insert into public.bench_raw select r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8] from (select array(select json_array_elements_text(e)) as r from json_array_elements($1::json) e) x`,
          [JSON.stringify(chunk)],
        )
        chunk = []
      }
      for await (const record of readCsvRecords(bytes, ',')) {
        chunk.push(record.values)
        if (chunk.length === 5000) await flush()
      }
      if (chunk.length) await flush()
    }
    const baselineSeconds = (performance.now() - started) / 1000
    const { rows: [{ n: baselineRows }] } = await client.query('select count(*)::int as n from public.bench_raw')

    // The service: upload inspection (what POST .../upload does), then the job.
    started = performance.now()
    const inspection = inspectCsv(bytes)
    const mapping = suggestMapping('contacts', inspection.columns, inspection.sampleRows)
    const inspectSeconds = (performance.now() - started) / 1000
    const { rows: [created] } = await client.query(
      `insert into crm.imports (workspace_id, user_id, record_type, file_name, file_bytes, file_size, delimiter, columns, row_count, sample_rows, suggested_mapping,
                                status, mapping, mode, match_on, dry_run)
       values ($1, $2, 'contacts', 'contacts.csv', $3, $4, ',', $5, $6, $7, $8, 'queued', $8, 'create', 'email', false) returning id`,
      [tenant.id, admin.id, bytes, bytes.length, inspection.columns, inspection.rowCount, JSON.stringify(inspection.sampleRows), JSON.stringify(mapping)],
    )
    const job = { workspace_id: tenant.id, import_id: created.id }
    started = performance.now()
    await processImport(client, job)
    const importSeconds = (performance.now() - started) / 1000
    const { rows: [result] } = await client.query(
      `select i.created, i.failed, i.companies_created,
              (select count(*)::int from crm.contacts c where c.workspace_id = i.workspace_id) as contacts,
              (select count(*)::int from crm.events e where e.workspace_id = i.workspace_id and e.event = 'contact.created' and e.actor ->> 'via' = 'import') as events
         from crm.imports i where i.workspace_id = $1 and i.id = $2`,
      [tenant.id, created.id],
    )
    await client.end()
    if (result.contacts !== ROWS || result.events !== ROWS || baselineRows !== ROWS) throw new Error(`expected ${ROWS} rows everywhere: ${JSON.stringify({ baselineRows, ...result })}`)

    const rate = (seconds: number) => Math.round(ROWS / seconds).toLocaleString('en-US')
    console.log(`## CSV import (bench/imports.ts)

${ROWS.toLocaleString('en-US')} contacts rows (8 columns, a quoted comma and non-ASCII text in every row, ${result.companies_created.toLocaleString('en-US')} companies linked through company_name), ${database.label}.

| what | seconds | rows/s |
|---|---:|---:|
| baseline: ${baselineLabel} | ${baselineSeconds.toFixed(2)} | ${rate(baselineSeconds)} |
| upload inspection (parse, count, sample, suggest mapping) | ${inspectSeconds.toFixed(2)} | ${rate(inspectSeconds)} |
| process_import job: stage, check, land as crm_api with RLS, ${result.events.toLocaleString('en-US')} events | ${importSeconds.toFixed(2)} | ${rate(importSeconds)} |
| **job rows/s vs baseline** | | **${((ROWS / importSeconds) / (ROWS / baselineSeconds) * 100).toFixed(1)} %** (target: ≥ 20,000 rows/s) |
`)
  } finally {
    rmSync(workDir, { recursive: true, force: true })
    await database.stop()
  }
}

await main()
