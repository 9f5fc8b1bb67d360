// CSV import (docs/api.md section 6): upload and inspect a file, start the job, read it, download its
// errors. The job itself is workers/process_import.ts; every permission is decided in SQL (the
// imports policies, crm.queue_import, and the import policies on the record tables).
import { createReadStream } from 'node:fs'
import Type from 'typebox'
import { writeScope } from '../../auth/scopes.ts'
import { type DatabaseTransactionConnection, sql } from '../../db/pool.ts'
import { GrantedRow, NullableString, rowType } from '../../db/typed-rows.ts'
import {
  ForbiddenError,
  InvalidParameterError,
  NotFoundError,
  PayloadTooLargeError,
  UnsupportedMediaTypeError,
  ValidationError,
} from '../../errors.ts'
import { csvTextCell, csvTextCellSql } from '../../exports/csv-text-cell.ts'
import { LineRow, streamLines } from '../../exports/stream-lines.ts'
import { CsvFileError, inspectCsvAsync } from '../../imports/csv-file.ts'
import { keyFieldOf, matchOnAllowed } from '../../imports/import-plan.ts'
import { UploadError, uploadFromRequest, uploadKindOf } from '../../imports/multipart.ts'
import { IMPORT_TYPES, type ImportType, suggestMapping, validateMapping } from '../../imports/suggest-mapping.ts'
import { decodeCursor, limitOf, PAGING_PARAMETERS, pageHeaders, pageOf } from '../../paging.ts'
import { parseQueryString } from '../../records/query-string.ts'
import { page } from '../../records/schemas.ts'
import { named } from '../../schema-names.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import { CSV_BODY_LIMIT } from '../body.ts'
import type { RouteDefinition } from '../route.ts'

const DEFAULT_MATCH_ON: Record<ImportType, 'email' | 'domain' | 'id'> = { contacts: 'email', companies: 'domain', deals: 'id' }
const ERRORS_SHOWN = 100

const StartBody = named(
  'ImportStart',
  Type.Object(
    {
      mapping: Type.Optional(
        Type.Record(Type.String(), Type.Union([Type.String(), Type.Null()]), {
          description: 'column → field, custom_fields.<key> or null (default: the suggested mapping)',
        }),
      ),
      mode: Type.Optional(Type.Union([Type.Literal('create'), Type.Literal('upsert')], { description: 'create (default) or upsert' })),
      match_on: Type.Optional(
        Type.Union([Type.Literal('email'), Type.Literal('domain'), Type.Literal('id')], {
          description: 'upsert key: contacts email or id, companies domain or id, deals id',
        }),
      ),
      dry_run: Type.Optional(Type.Boolean({ description: 'check everything and write nothing' })),
    },
    { additionalProperties: false },
  ),
)

/** An upload's refusal as the error the API answers with. */
function apiErrorOfUpload(error: unknown): unknown {
  if (!(error instanceof UploadError)) return error
  if (error.code === 'payload_too_large') return new PayloadTooLargeError(CSV_BODY_LIMIT)
  if (error.code === 'unsupported_media_type') return new UnsupportedMediaTypeError(error.message)
  return new ValidationError(error.message, [{ pointer: '/file', code: error.code, message: error.message }])
}

function importId(id: string | undefined): string {
  if (!id || !UUID_PATTERN.test(id)) throw new NotFoundError('No such import')
  return id.toLowerCase()
}

async function assertImportGrant(db: DatabaseTransactionConnection, type: ImportType): Promise<void> {
  const allowed = await db.oneFirst(sql.type(GrantedRow)`select crm.grant_scope(${type}, 'import') is not null as granted`)
  if (!allowed) throw new ForbiddenError(`Your role does not allow importing ${type}`)
}

/** An import job's fields in a list of imports (and the row listJobs' query renders). */
const IMPORT_SUMMARY_FIELDS = {
  id: Type.String(),
  status: Type.String(),
  mode: NullableString,
  match_on: NullableString,
  dry_run: Type.Boolean(),
  file_name: NullableString,
  counts: Type.Object({
    total: Type.Integer(),
    created: Type.Integer(),
    updated: Type.Integer(),
    skipped: Type.Integer(),
    failed: Type.Integer(),
    companies_created: Type.Integer(),
  }),
  failure: NullableString,
  failure_code: NullableString,
  created_at: Type.String(),
  started_at: NullableString,
  finished_at: NullableString,
}
const ImportSummary = named('ImportSummary', Type.Object(IMPORT_SUMMARY_FIELDS))
const ImportSummaryRow = rowType(ImportSummary)
/** An import job as the API answers it (and the row readJob's query renders): its summary and the first errors. */
const ImportJob = named(
  'ImportJob',
  Type.Object({
    ...IMPORT_SUMMARY_FIELDS,
    errors: Type.Array(Type.Object({ row: Type.Integer(), column: NullableString, field: NullableString, message: Type.String() })),
  }),
)
const ImportJobRow = rowType(ImportJob)
/** The answer to an upload: what the file holds and how its columns would map. */
const ImportUpload = named(
  'ImportUpload',
  Type.Object({
    id: Type.String(),
    status: Type.Literal('uploaded'),
    file_name: NullableString,
    row_count: Type.Integer(),
    columns: Type.Array(Type.String()),
    sample_rows: Type.Array(Type.Array(Type.String()), { description: 'The first 5 rows, cells in column order' }),
    suggested_mapping: Type.Record(Type.String(), NullableString, { description: 'column → field, custom_fields.<key> or null' }),
    created_at: Type.String(),
  }),
)
const CreatedImportRow = rowType(Type.Object({ id: Type.String(), created_at: Type.String() }))
const UploadColumnsRow = rowType(Type.Object({ columns: Type.Array(Type.String()) }))
const UploadToStartRow = rowType(
  Type.Object({
    columns: Type.Array(Type.String()),
    suggested_mapping: Type.Record(Type.String(), NullableString),
  }),
)

/** The summary columns of an import `i`: status, counts, times. */
const SUMMARY_COLUMNS = sql.fragment`
    i.id, i.status, i.mode, i.match_on, i.dry_run, i.file_name,
    json_build_object('total', i.row_count, 'created', i.created, 'updated', i.updated, 'skipped', i.skipped,
                      'failed', i.failed, 'companies_created', i.companies_created) as counts,
    i.failure, i.failure_code, crm.api_time(i.created_at) as created_at, crm.api_time(i.started_at) as started_at,
    crm.api_time(i.finished_at) as finished_at`
const IMPORTS_ORDER = '-id'
const IMPORT_CURSOR = [{ kind: 'uuid', nullable: false }]

/**
 * The imports of a type, newest first, a page at a time: row-level security shows a member the imports
 * they started and an admin every import of the workspace (imports_select_own_or_admin).
 */
async function listJobs(db: DatabaseTransactionConnection, type: ImportType, parameters: Map<string, string>) {
  for (const name of parameters.keys()) {
    if (name !== 'limit' && name !== 'cursor') throw new InvalidParameterError(`Unknown query parameter ${name}`)
  }
  const limit = limitOf(parameters.get('limit'))
  const cursor = parameters.get('cursor')
  const before = cursor === undefined ? null : decodeCursor(cursor, IMPORTS_ORDER, IMPORT_CURSOR).values[0]
  const rows = await db.any(sql.type(ImportSummaryRow)`
    select ${SUMMARY_COLUMNS} from crm.imports i
     where i.workspace_id = (select crm.current_workspace_id()) and i.record_type = ${type}
       ${before ? sql.fragment`and i.id < ${before}` : sql.fragment``}
     order by i.id desc limit ${limit + 1}`)
  return pageOf(rows, limit, IMPORTS_ORDER, (job) => job.id)
}

/** The job as GET answers it: counts, the first 100 errors, times. */
async function readJob(db: DatabaseTransactionConnection, type: ImportType, id: string) {
  const job = await db.maybeOne(sql.type(ImportJobRow)`
    select ${SUMMARY_COLUMNS},
           coalesce((select json_agg(json_build_object('row', e.row, 'column', e.column_name, 'field', e.field, 'message', e.message) order by e.row, e.position)
                       from (select * from crm.import_errors e
                              where e.workspace_id = i.workspace_id and e.import_id = i.id
                              order by e.row, e.position limit ${ERRORS_SHOWN}) e), '[]'::json) as errors
      from crm.imports i
     where i.workspace_id = (select crm.current_workspace_id()) and i.id = ${id} and i.record_type = ${type}`)
  if (!job) throw new NotFoundError('No such import')
  return job
}

function routesFor(type: ImportType): RouteDefinition[] {
  const base = `/api/${type}/import`
  return [
    {
      method: 'POST',
      path: `${base}/upload`,
      summary: `Upload a CSV file of ${type} (multipart part "file" or a text/csv body, up to 50 MiB): answers its columns, 5 sample rows and a suggested mapping`,
      tag: type,
      auth: 'required',
      scope: writeScope({ path: type }),
      bodyKind: 'file',
      fileLimit: CSV_BODY_LIMIT,
      limitedPerWorkspace: 'uploads',
      checkBodyHeaders: (req) => {
        try {
          uploadKindOf(req.headers)
        } catch (error) {
          throw apiErrorOfUpload(error)
        }
      },
      // Checked before the body is received, and again in the handler's own transaction.
      checkCallerBeforeBody: (db) => assertImportGrant(db, type),
      status: 201,
      response: Type.Object({ data: ImportUpload }),
      errors: [401, 403, 413, 415, 422, 429, 503],
      handler: async ({ req, db, bodyFile }) => {
        await assertImportGrant(db, type)
        let upload
        try {
          upload = await uploadFromRequest({ headers: req.headers, body: createReadStream(bodyFile!.path) }, CSV_BODY_LIMIT)
        } catch (error) {
          throw apiErrorOfUpload(error)
        }
        let inspection
        try {
          inspection = await inspectCsvAsync(upload.bytes)
        } catch (error) {
          if (!(error instanceof CsvFileError)) throw error
          throw new ValidationError(error.message, [{ pointer: '/file', code: error.code, message: error.message }])
        }
        const suggested = suggestMapping(type, inspection.columns, inspection.sampleRows)
        const fileName = upload.fileName === null ? null : upload.fileName.slice(0, 255)
        const created = await db.one(sql.type(CreatedImportRow)`
          insert into crm.imports (record_type, file_name, file_bytes, file_size, delimiter, columns, row_count, sample_rows, suggested_mapping)
          values (${type}, ${fileName}, ${sql.binary(upload.bytes)}, ${upload.bytes.length}, ${inspection.delimiter},
                  ${sql.array(inspection.columns, 'text')}, ${inspection.rowCount}, ${sql.jsonb(inspection.sampleRows)}, ${sql.jsonb(suggested)})
          returning id, crm.api_time(created_at) as created_at`)
        return {
          status: 201,
          headers: { Location: `${base}/${created.id}` },
          body: {
            data: {
              id: created.id,
              status: 'uploaded',
              file_name: fileName,
              row_count: inspection.rowCount,
              columns: inspection.columns,
              sample_rows: inspection.sampleRows,
              suggested_mapping: suggested,
              created_at: created.created_at,
            },
          },
        }
      },
    },
    {
      method: 'POST',
      path: `${base}/:id`,
      summary: `Start importing an uploaded file of ${type} (202 with the job; needs the import grant, and update for upsert)`,
      tag: type,
      auth: 'required',
      scope: writeScope({ path: type }),
      body: StartBody,
      status: 202,
      response: Type.Object({ data: ImportJob }),
      errors: [401, 403, 404, 409, 413, 415, 422],
      example: {
        request: {
          mapping: { 'First Name': 'first_name', Email: 'email', Index: null },
          mode: 'upsert',
          match_on: 'email',
          dry_run: false,
        },
      },
      handler: async ({ db, params, body, caller }) => {
        const id = importId(params.id)
        const upload = await db.maybeOne(sql.type(UploadToStartRow)`
          select columns, suggested_mapping from crm.imports
           where workspace_id = (select crm.current_workspace_id()) and id = ${id} and record_type = ${type}`)
        if (!upload) throw new NotFoundError('No such import')
        const columns = upload.columns
        const mode = body.mode ?? 'create'
        const matchOn = body.match_on ?? DEFAULT_MATCH_ON[type]
        // A column left out of the mapping is not imported (the same as null).
        const mapping: Record<string, string | null> = body.mapping ?? upload.suggested_mapping
        const mappingProblems = validateMapping(type, columns, mapping)
        if (mappingProblems.length > 0) throw new ValidationError(`mapping: ${mappingProblems[0].message}`, mappingProblems)
        if (!matchOnAllowed(type, matchOn)) {
          throw new ValidationError(`${type} cannot be matched on ${matchOn}`, [
            { pointer: '/match_on', code: 'invalid', message: `${type} match on ${DEFAULT_MATCH_ON[type]} or id` },
          ])
        }
        const keyField = keyFieldOf({ type, mode, matchOn, mapping })
        if (mode === 'upsert' && !Object.values(mapping).includes(keyField)) {
          throw new ValidationError(`an upsert on ${matchOn} needs a column mapped to ${matchOn}`, [
            { pointer: '/match_on', code: 'unmapped', message: `map a column to ${matchOn}` },
          ])
        }
        // Bound to the request's token: each batch stops the import once it is withdrawn.
        await db.query(
          sql.unsafe`select crm.queue_import(${id}, ${sql.jsonb(mapping)}, ${mode}, ${matchOn}, ${body.dry_run ?? false}, ${caller.tokenId})`,
        )
        return { status: 202, headers: { Location: `${base}/${id}` }, body: { data: await readJob(db, type, id) } }
      },
    },
    {
      method: 'GET',
      path: base,
      summary: `List the imports of ${type} the caller started (admins: every import of the workspace), newest first, paged`,
      tag: type,
      auth: 'required',
      scope: writeScope({ path: type }),
      response: page(ImportSummary),
      queryParameters: PAGING_PARAMETERS,
      errors: [400, 401],
      handler: async ({ db, req }) => {
        const parameters = parseQueryString(req.url)
        const result = await listJobs(db, type, parameters)
        return { body: result, headers: pageHeaders(base, parameters, result.next_cursor) }
      },
    },
    {
      method: 'GET',
      path: `${base}/:id`,
      summary: `Read an import job of ${type}: status, counts, the first 100 errors`,
      tag: type,
      auth: 'required',
      scope: writeScope({ path: type }),
      response: Type.Object({ data: ImportJob }),
      errors: [401, 404],
      handler: async ({ db, params }) => ({ body: { data: await readJob(db, type, importId(params.id)) } }),
    },
    {
      method: 'GET',
      path: `${base}/:id/errors.csv`,
      summary: `Every row of an import of ${type} that was not imported: the file's columns plus row and error`,
      tag: type,
      auth: 'required',
      scope: writeScope({ path: type }),
      streams: true,
      responseMedia: { 'text/csv': "The file's columns, then row (its number in the file) and error" },
      // It holds a connection while the client reads, like an export, and counts as one.
      limitedPerWorkspace: 'exports',
      errors: [401, 404, 429, 503],
      handler: async ({ db, res, params, services }) => {
        const id = importId(params.id)
        const upload = await db.maybeOne(sql.type(UploadColumnsRow)`
          select columns from crm.imports where workspace_id = (select crm.current_workspace_id()) and id = ${id} and record_type = ${type}`)
        if (!upload) throw new NotFoundError('No such import')
        const columns = upload.columns
        const header = [...columns, 'row', 'error'].map(csvTextCell).join(',')
        // Each row's own cells (padded or cut to the header), then its number and its errors. A cell
        // is written as the import read it (crm.import_cell) behind the export's guard, so the file
        // uploaded again reads each cell as the first import did: a cell that was itself guarded
        // ('=x, read as =x) is written '=x, not ''=x (docs/api.md section 6, "Round trip").
        await streamLines(
          db,
          sql.type(LineRow)`
          select concat_ws(',',
                   (select string_agg(${csvTextCellSql(sql.fragment`crm.import_cell(r.cells[n])`)}, ',' order by n) from generate_series(1, ${columns.length}::int) n),
                   e.row::text,
                   ${csvTextCellSql(sql.fragment`e.message`)}) as line
            from (select e.row, string_agg(e.message, '; ' order by e.position) as message
                    from crm.import_errors e
                   where e.workspace_id = (select crm.current_workspace_id()) and e.import_id = ${id}
                   group by e.row) e
            left join crm.import_rows r on r.workspace_id = (select crm.current_workspace_id()) and r.import_id = ${id} and r.row = e.row
           order by e.row`,
          res,
          {
            head: {
              headers: {
                'Content-Type': 'text/csv; charset=utf-8',
                'Content-Disposition': `attachment; filename="${type}-import-errors.csv"`,
              },
              prefix: header + '\r\n',
            },
            newline: '\r\n',
            deadlineMs: services.config.exportTimeoutMs,
            stallMs: services.config.streamStallMs,
          },
        )
      },
    },
  ]
}

export default IMPORT_TYPES.flatMap(routesFor)
