// A CSV file whose one record is huge (a line of 50 MiB of commas, of quoted empty values, a single
// 50 MiB value) is refused while it is parsed, at the upload and in the import job, with the heap
// of the process (server and job run in this one) growing by a bounded amount: before the bounds,
// the line of commas became an array of 50 million empty strings (2.3 GB for 40 MiB).
import type pg from 'pg'
import t from 'tap'
import { MAX_RECORD_LENGTH, MAX_RECORD_VALUES } from '../../src/imports/csv-file.ts'
import { processImport, STAGE_CHUNK_CHARACTERS, stagedLines } from '../../src/imports/process-import.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { heapGrowthDuring, MiB } from '../helpers/heap.ts'
import { startTestServer } from '../helpers/server.ts'
import { upload } from './helpers.ts'

const HEAP_GROWTH_LIMIT = 100 * MiB
const FIFTY_MIB = 50 * MiB

/** `a,b` and one data record: what follows the header, up to 50 MiB of body in all. */
function fileOf(record: Buffer | string): Buffer {
  return Buffer.concat([Buffer.from('a,b\n'), Buffer.from(record)])
}

const HOSTILE_FILES: { name: string; bytes: () => Buffer; code: string }[] = [
  { name: 'a line of 50 MiB of commas', bytes: () => fileOf(Buffer.alloc(FIFTY_MIB - 4, ',')), code: 'too_many_columns' },
  {
    name: 'a line of quoted empty values ("",) repeated',
    bytes: () => fileOf('"",'.repeat(Math.floor((FIFTY_MIB - 4) / 3))),
    code: 'too_many_columns',
  },
  { name: 'a single 50 MiB value', bytes: () => fileOf(Buffer.alloc(FIFTY_MIB - 4, 'x')), code: 'record_too_long' },
]

t.test('a huge record is refused at the upload, while the heap stays bounded', async (t) => {
  const server = await startTestServer(t)
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' } })
  const { token } = tenant.members['admin@a.test']
  for (const file of HOSTILE_FILES) {
    const bytes = file.bytes()
    t.ok(bytes.length <= FIFTY_MIB, `${file.name}: within the upload limit`)
    const started = performance.now()
    const { result: response, growthBytes } = await heapGrowthDuring(() =>
      server.request('POST', '/api/contacts/import/upload', { token, raw: bytes, headers: { 'content-type': 'text/csv' } }),
    )
    t.comment(
      `${file.name}: ${response.status} in ${Math.round(performance.now() - started)} ms, heap +${(growthBytes / MiB).toFixed(1)} MiB`,
    )
    t.equal(response.status, 422, `${file.name}: ${response.text.slice(0, 300)}`)
    t.equal(response.body.errors?.[0]?.code, file.code, file.name)
    t.match(response.body.errors?.[0]?.message, /^Row 1 /, `${file.name}: the row is named`)
    t.ok(growthBytes < HEAP_GROWTH_LIMIT, `${file.name}: the heap grew by ${(growthBytes / MiB).toFixed(1)} MiB`)
  }
})

t.test('rows wider than the cap are refused naming the row; the header and narrower rows are not', async (t) => {
  const server = await startTestServer(t)
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' } })
  const { token } = tenant.members['admin@a.test']
  const row = (values: number) => Array.from({ length: values }, (_, index) => `v${index}`).join(',')

  const wide = await upload(server, token, 'contacts', `first_name,email\nAnn,ann@example.com\n${row(600)}\n`)
  t.equal(wide.status, 422)
  t.equal(wide.body.errors[0].code, 'too_many_columns')
  t.match(wide.body.errors[0].message, new RegExp(`^Row 2 has more than ${MAX_RECORD_VALUES} values`))

  const atCap = await upload(server, token, 'contacts', `first_name,email\nAnn,ann@example.com\n${row(MAX_RECORD_VALUES)}\n`)
  t.equal(atCap.status, 201, 'a row of exactly the cap uploads; the job reports it as too wide for its header')
  t.equal(atCap.body.data.row_count, 2)

  const fullRow = await upload(server, token, 'contacts', `first_name,email\n${'x'.repeat(MAX_RECORD_LENGTH - 1)},y\n`)
  t.equal(fullRow.status, 201, 'a row of exactly the length uploads')
  const longRow = await upload(server, token, 'contacts', `first_name,email\nAnn,ann@example.com\n${'x'.repeat(MAX_RECORD_LENGTH)},y\n`)
  t.equal(longRow.status, 422)
  t.equal(longRow.body.errors[0].code, 'record_too_long')
  t.match(longRow.body.errors[0].message, /^Row 2 is longer than/)

  const wideHeader = await upload(server, token, 'contacts', `${row(600)}\n`)
  t.equal(wideHeader.status, 422)
  t.equal(wideHeader.body.errors[0].code, 'too_many_columns')
  t.match(wideHeader.body.errors[0].message, /^The header row has more than/)
})

type Tenant = Awaited<ReturnType<typeof createTenant>>

/** A file stored and queued as an upload before the bounds would have been: never inspected by them. */
async function storedImport(db: pg.Client, tenant: Tenant, bytes: Buffer) {
  const {
    rows: [stored],
  } = await db.query(
    `insert into crm.imports (workspace_id, user_id, record_type, file_name, file_bytes, file_size, delimiter, columns, row_count, sample_rows,
                              suggested_mapping, status, mapping, mode, match_on, dry_run)
     values ($1, $2, 'contacts', 'old.csv', $3, $4, ',', '{a,b}', 1, '[]', '{}', 'queued', '{"a": "first_name", "b": "email"}', 'create', 'email', false)
     returning id`,
    [tenant.id, tenant.members['admin@a.test'].id, bytes, bytes.length],
  )
  return { workspace_id: tenant.id, import_id: stored.id as string }
}

t.test('the import job fails a stored file with a huge record cleanly, its heap bounded', async (t) => {
  const server = await startTestServer(t, { worker: false })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' } })
  const db = await ownerClient(t, server.databaseUrl)
  for (const file of [
    ...HOSTILE_FILES,
    { name: 'a row of 600 values', bytes: () => fileOf(`${'v,'.repeat(599)}v\n`), code: 'too_many_columns' },
  ]) {
    const job = await storedImport(db, tenant, file.bytes())
    const { result: handled, growthBytes } = await heapGrowthDuring(() => processImport(db, job))
    t.comment(`job, ${file.name}: heap +${(growthBytes / MiB).toFixed(1)} MiB`)
    t.equal(handled, true, `${file.name}: the job ran to an end`)
    const {
      rows: [state],
    } = await db.query(
      `select i.status, i.failure_code, i.failure, i.staged,
              (select count(*)::int from crm.import_rows r where r.workspace_id = i.workspace_id and r.import_id = i.id) as staged_rows
         from crm.imports i where i.workspace_id = $1 and i.id = $2`,
      [tenant.id, job.import_id],
    )
    t.same(
      { status: state.status, failure_code: state.failure_code, staged: state.staged, staged_rows: state.staged_rows },
      { status: 'failed', failure_code: 'import_file_invalid', staged: false, staged_rows: 0 },
      file.name,
    )
    t.match(state.failure, /^Row 1 (has more than|is longer than)/, `${file.name}: the failure names the row`)
    t.ok(growthBytes < HEAP_GROWTH_LIMIT, `${file.name}: the job's heap grew by ${(growthBytes / MiB).toFixed(1)} MiB`)
  }
})

t.test('the job stages long rows within the bounds in COPY chunks of bounded length', async (t) => {
  const server = await startTestServer(t, { worker: false })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' } })
  const db = await ownerClient(t, server.databaseUrl)
  // 24 rows of one quoted value of nearly MAX_RECORD_LENGTH quotes: a quote is three characters in
  // a COPY line, so the 24 rows once made one chunk of 72 MiB.
  const bytes = fileOf(`"${'""'.repeat(MAX_RECORD_LENGTH - 10)}"\n`.repeat(24))
  const job = await storedImport(db, tenant, bytes)
  const row = {
    user_id: tenant.members['admin@a.test'].id,
    status: 'queued',
    staged: false,
    delimiter: ',' as const,
    file_size: bytes.length,
    has_file: true,
  }
  const lengths: number[] = []
  for await (const chunk of stagedLines(db, job, row)) lengths.push(chunk.length)
  const longestLine = 3 * MAX_RECORD_LENGTH + 200
  t.ok(lengths.length > 1, `${lengths.length} chunks`)
  t.ok(Math.max(...lengths) < STAGE_CHUNK_CHARACTERS + longestLine, `the longest chunk has ${(Math.max(...lengths) / MiB).toFixed(1)} MiB`)
})
