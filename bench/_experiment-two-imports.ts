// Experiment (not run by `make bench`): would landing an import on two connections at once pay on
// this host? Two imports of the bench's contacts file, each in its own workspace, run one after
// the other ("seq") and at the same time on two connections ("par"), in turns; printed: the pair's
// rows/s and the CPU the whole PostgreSQL server used per row. It bounds what two connections
// landing disjoint batches of one import could gain (staging runs twice in parallel here too).
//   ORDER=par,seq,par,seq BENCH_IMPORT_ROWS=30000 node bench/_experiment-two-imports.ts
import pg from 'pg'
import { benchWorkspace, contactsFile, postgresCpuMeter, provision, queueContactsImport } from './_database.ts'

const ROWS = Number(process.env.BENCH_IMPORT_ROWS ?? 20_000)
const database = await provision()
try {
  const { inspectCsv } = await import('../src/imports/csv-file.ts')
  const { suggestMapping } = await import('../src/imports/suggest-mapping.ts')
  const { processImport } = await import('../src/imports/process-import.ts')
  const bytes = Buffer.from(contactsFile(ROWS))
  const inspection = inspectCsv(bytes)
  const mapping = suggestMapping('contacts', inspection.columns, inspection.sampleRows)
  async function prepare() {
    const { tenant, admin } = await benchWorkspace(database.url)
    const client = new pg.Client({ connectionString: database.url })
    await client.connect()
    const createdId = await queueContactsImport(client, { workspaceId: tenant.id, userId: admin.id }, bytes, inspection, mapping)
    return { client, job: { workspace_id: tenant.id, import_id: createdId } }
  }
  const meterClient = new pg.Client({ connectionString: database.url })
  await meterClient.connect()
  const meter = await postgresCpuMeter((t) => meterClient.query(t))
  for (const order of (process.env.ORDER ?? 'seq,par,seq,par').split(',')) {
    const a = await prepare()
    const b = await prepare()
    const c0 = meter?.() ?? 0
    const t0 = performance.now()
    if (order === 'seq') {
      await processImport(a.client, a.job)
      await processImport(b.client, b.job)
    } else await Promise.all([processImport(a.client, a.job), processImport(b.client, b.job)])
    const s = (performance.now() - t0) / 1000
    const cpu = (meter?.() ?? 0) - c0
    console.log(
      `${order}: ${2 * ROWS} rows in ${s.toFixed(2)} s = ${Math.round((2 * ROWS) / s)} rows/s; postgres cpu ${((cpu * 1000) / (2 * ROWS)).toFixed(0)} µs/row`,
    )
    await a.client.end()
    await b.client.end()
  }
  await meterClient.end()
} finally {
  await database.stop()
}
