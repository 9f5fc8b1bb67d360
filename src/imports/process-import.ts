// The process_import job: stage the file's records, then land them batch by batch. The worker
// connects as its login role (crm_worker), which reaches an import only through the worker-only
// functions named below; each batch transaction opens with crm.begin_import_batch (the importing
// user's proven context, via = import) and then switches to crm_api, so row-level security and
// the import policies judge every write exactly as for an API request by that user.
//
// Crash safety: staging is one transaction (all records or none); each batch commits its rows,
// its events, its errors, its counts and the new last_row_done together. A worker killed at any
// point leaves whole batches; the retried job (graphile-worker hands it to the next worker) skips
// the staging when done and resumes after last_row_done.
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import type { Submittable } from 'pg'
import { from as copyFrom } from 'pg-copy-streams'
import Type, { type Static } from 'typebox'
import { sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { type Queryable, readMaybeOne, readOne } from './batch-statements.ts'
import { CsvFileError, readCsvRecords } from './csv-file.ts'
import { type ImportPlan, repeatKeyOf } from './import-plan.ts'
import { landBatch } from './land-batch.ts'
import { IMPORT_TYPES } from './suggest-mapping.ts'

export type ImportJob = { workspace_id: string; import_id: string }

/** A pg client (the worker's or a test's): statements, plus COPY streams for staging. */
export type ImportClient = Queryable & { query<T extends Submittable>(submittable: T): T }

export type ProcessOptions = {
  batchSize?: number
  /** Tests: called inside each batch transaction before it commits (throw to simulate a crash). */
  beforeCommit?: (batch: number) => void | Promise<void>
  /** Tests: called after each batch committed. */
  afterCommit?: (batch: number) => void | Promise<void>
  log?: (message: string) => void
}

export const DEFAULT_BATCH_SIZE = 5000
const STAGE_CHUNK_RECORDS = 5000
// A chunk is also sent once its text reaches this length: escaped for COPY a record grows up to
// three times (a quote becomes three characters), so 5,000 long records could otherwise make one
// string of most of a 50 MiB file, three times over.
export const STAGE_CHUNK_CHARACTERS = 4 * 1024 * 1024
const FILE_SLICE_BYTES = 1024 * 1024

/** A permanent refusal (a broken or removed file): the job fails without retrying. */
export class ImportRefused extends Error {
  readonly code = 'import_file_invalid'
}

const ImportRowFields = Type.Object({
  user_id: Type.String(),
  status: Type.String(),
  staged: Type.Boolean(),
  delimiter: Type.Union([Type.Literal(','), Type.Literal(';'), Type.Literal('\t')]),
  file_size: Type.Number(),
  has_file: Type.Boolean(),
})
const ImportRow = rowType(ImportRowFields)
type ImportRow = Static<typeof ImportRowFields>

async function readImport(client: Queryable, job: ImportJob) {
  // file_size is a bigint; as float8 it reads as a number, exact far beyond any upload.
  return readMaybeOne(
    client,
    sql.type(ImportRow)`
    select user_id, status, staged, delimiter, file_size, has_file from crm.import_to_process(${job.workspace_id}, ${job.import_id})`,
  )
}

const FileSlice = rowType(Type.Object({ slice: Type.String() }))

/**
 * The stored file, read in slices so that neither the database nor the worker holds it whole.
 * Sent as base64: pg decodes a bytea's hex text in JavaScript, which took longer than the read.
 */
async function* fileSlices(client: Queryable, job: ImportJob, size: number): AsyncGenerator<Buffer> {
  for (let offset = 0; offset < size; offset += FILE_SLICE_BYTES) {
    const { slice } = await readOne(
      client,
      sql.type(FileSlice)`
      select crm.import_file_slice(${job.workspace_id}, ${job.import_id}, ${offset + 1}::int, ${FILE_SLICE_BYTES}::int) as slice`,
    )
    yield Buffer.from(slice, 'base64')
  }
}

const ARRAY_SPECIAL = /["\\]/

/**
 * The cells of a record as one COPY ... (format csv) field holding a PostgreSQL text[] literal:
 * {"a","b"} with every element quoted, \ and " escaped for the array, then every quote doubled for
 * CSV. Built in one pass (the map, join and replaces it replaced cost about 2 µs a record).
 */
export function cellsField(values: string[]): string {
  let field = '"{'
  for (let index = 0; index < values.length; index++) {
    const value = values[index]
    field +=
      (index === 0 ? '""' : ',""') + (ARRAY_SPECIAL.test(value) ? value.replaceAll('\\', '\\\\').replaceAll('"', '\\""') : value) + '""'
  }
  return field + '}"'
}

/** The file's records as COPY lines of crm.import_rows, in chunks of STAGE_CHUNK_RECORDS lines or STAGE_CHUNK_CHARACTERS. */
export async function* stagedLines(client: Queryable, job: ImportJob, row: ImportRow): AsyncGenerator<string> {
  const prefix = `${job.workspace_id},${job.import_id},`
  let chunk = ''
  let lines = 0
  for await (const record of readCsvRecords(fileSlices(client, job, row.file_size), row.delimiter)) {
    chunk += `${prefix}${record.row},${row.user_id},${cellsField(record.values)}\n`
    if (++lines >= STAGE_CHUNK_RECORDS || chunk.length >= STAGE_CHUNK_CHARACTERS) {
      yield chunk
      chunk = ''
      lines = 0
    }
  }
  if (chunk) yield chunk
}

// The records go in with COPY (measured: about a third of the database time of the
// json_to_recordset INSERT it replaces), into a temporary table: COPY FROM refuses a table under
// row-level security, which crm.import_rows is for every role but the owner. One INSERT then moves
// them (crm_worker may add staged rows, and read none).
async function stage(client: ImportClient, job: ImportJob, row: ImportRow): Promise<void> {
  if (!row.has_file) throw new ImportRefused('the file of this import has been removed; upload it again')
  await client.query('begin')
  try {
    await client.query('select crm.clear_import_rows($1, $2)', [job.workspace_id, job.import_id])
    await client.query(
      'create temporary table import_rows_copy (workspace_id uuid, import_id uuid, row integer, user_id uuid, cells text[]) on commit drop',
    )
    // One COPY per chunk: the file's slices are read on this same connection, between COPYs (pg
    // sends a query only once the COPY before it has completed). The worker parses the next chunk
    // while PostgreSQL takes in the previous one, so the two processes work at the same time.
    let copying: Promise<void> | null = null
    for await (const chunk of stagedLines(client, job, row)) {
      await copying
      copying = pipeline(
        Readable.from([chunk]),
        client.query(copyFrom('copy pg_temp.import_rows_copy (workspace_id, import_id, row, user_id, cells) from stdin with (format csv)')),
      )
      // Handled when awaited (next chunk, end of file); until then a failure must not count as unhandled.
      copying.catch(() => {})
    }
    await copying
    await client.query(
      'insert into crm.import_rows (workspace_id, import_id, row, user_id, cells) select workspace_id, import_id, row, user_id, cells from pg_temp.import_rows_copy',
    )
    await client.query('select crm.mark_import_staged($1, $2)', [job.workspace_id, job.import_id])
    await client.query('commit')
  } catch (error) {
    await client.query('rollback').catch(() => {})
    if (error instanceof CsvFileError) throw new ImportRefused(error.message)
    throw error
  }
}

/**
 * A permanent refusal's failure code, or null for an error worth a retry: the file, or
 * crm.begin_import_batch's CR403 (member, credential or grant withdrawn; its hint is the code) and CR404.
 */
function refusalCode(error: unknown): string | null {
  if (error instanceof ImportRefused) return error.code
  const { code, hint } = (error ?? {}) as { code?: string; hint?: string }
  if (code === 'CR403') return hint ?? 'forbidden'
  if (code === 'CR404') return hint ?? 'not_found'
  return null
}

/** What crm.begin_import_batch answers: the import's options and progress (mapping, mode and match_on are set once it is queued). */
const OpenedBatch = rowType(
  Type.Object({
    status: Type.String(),
    record_type: Type.Union(IMPORT_TYPES.map((type) => Type.Literal(type))),
    columns: Type.Array(Type.String()),
    mapping: Type.Union([Type.Record(Type.String(), Type.Union([Type.String(), Type.Null()])), Type.Null()]),
    mode: Type.Union([Type.Literal('create'), Type.Literal('upsert'), Type.Null()]),
    match_on: Type.Union([Type.Literal('email'), Type.Literal('domain'), Type.Literal('id'), Type.Null()]),
    dry_run: Type.Boolean(),
    last_row_done: Type.Integer(),
  }),
)

export async function markFailed(client: Queryable, job: ImportJob, message: string, code: string | null = null): Promise<void> {
  await client.query('select crm.complete_import($1, $2, $3, $4, $5)', [
    job.workspace_id,
    job.import_id,
    'failed',
    message.slice(0, 1000),
    code,
  ])
}

/** Runs (or resumes) one import to its end. Returns false when there was nothing to do. */
export async function processImport(client: ImportClient, job: ImportJob, options: ProcessOptions = {}): Promise<boolean> {
  const batchSize = options.batchSize ?? DEFAULT_BATCH_SIZE
  const row = await readImport(client, job)
  if (!row || !['queued', 'processing'].includes(row.status)) return false
  try {
    if (!row.staged) await stage(client, job, row)
    // Once a CHECK constraint has refused a batch, the rest of the run checks before landing (land-batch.ts).
    let checkConstraintsFirst = false
    for (let batch = 1; ; batch++) {
      await client.query('begin')
      try {
        const current = await readOne(
          client,
          sql.type(OpenedBatch)`select * from crm.begin_import_batch(${job.workspace_id}, ${job.import_id})`,
        )
        if (current.status !== 'processing') {
          await client.query('rollback')
          return false
        }
        if (current.mapping === null || current.mode === null || current.match_on === null)
          throw new ImportRefused('the import was started without its options')
        const plan: ImportPlan = {
          importId: job.import_id,
          type: current.record_type,
          columns: current.columns,
          mapping: current.mapping,
          mode: current.mode,
          matchOn: current.match_on,
          dryRun: current.dry_run,
        }
        // A run's first batch marks the file's repeated keys once (as the worker role, through crm.mark_import_repeats), committed
        // with that batch; every batch of the run then reads its rows' marks.
        if (current.last_row_done === 0) {
          const key = repeatKeyOf(plan)
          await client.query('select crm.mark_import_repeats($1, $2, $3, $4)', [
            job.workspace_id,
            job.import_id,
            key?.kind ?? null,
            key?.column ?? null,
          ])
        }
        await client.query(`select set_config('role', 'crm_api', true)`)
        const outcome = await landBatch(client, plan, current.last_row_done, batchSize, checkConstraintsFirst)
        checkConstraintsFirst ||= outcome.constraintsBroken
        if (outcome.rows === 0) {
          await client.query('rollback')
          break
        }
        await client.query('select crm.finish_import_batch($1, $2, $3, $4::jsonb, $5::jsonb)', [
          job.import_id,
          current.last_row_done,
          outcome.lastRow,
          JSON.stringify(outcome.counts),
          JSON.stringify(outcome.errors),
        ])
        await options.beforeCommit?.(batch)
        await client.query('commit')
        options.log?.(`import ${job.import_id}: rows to ${outcome.lastRow} done (${JSON.stringify(outcome.counts)})`)
      } catch (error) {
        await client.query('rollback').catch(() => {})
        throw error
      }
      await options.afterCommit?.(batch)
    }
    await client.query('select crm.complete_import($1, $2, $3, null)', [job.workspace_id, job.import_id, 'completed'])
    return true
  } catch (error) {
    const code = refusalCode(error)
    if (code !== null) {
      await markFailed(client, job, (error as Error).message, code)
      return true
    }
    throw error
  }
}
