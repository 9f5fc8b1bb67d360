// The export query: the list grammar of the records API (src/records/list-parameters.ts, its
// whitelist and value checks) given as JSON, plus the export scope. Row-level security already
// limits rows to what the caller may view; the query adds `export` on top, in SQL, the same way
// the policies write a scope, so a member without the grant gets no row even through this query.
//
// Each row comes back as one finished line of text (CSV cells quoted, and text cells guarded
// against formulas, by csvTextCellSql, or the
// record's JSON), so the API process only concatenates: the database does the formatting on its
// own core, and the stream holds one fetch of lines at a time.
import { sql } from '../db/pool.ts'
import { type FieldProblem, InvalidParameterError, ValidationError } from '../errors.ts'
import type { FieldSpec, RecordType } from '../records/fields.ts'
import { parseListRequest } from '../records/list-parameters.ts'
import { filterCondition, orderByClause, orderKeys } from '../records/list-query.ts'
import { ownerWithinGrant } from '../records/owner-scope.ts'
import { csvTextCellSql } from './csv-text-cell.ts'
import { LineRow, type LinesQuery } from './stream-lines.ts'

type Fragment = ReturnType<typeof sql.fragment>

export type ExportFormat = 'csv' | 'ndjson'
export type ExportRequest = { format?: ExportFormat; fields?: string[]; filter?: Record<string, unknown>; sort?: string }

/** The JSON filter form → the query-string form the records parser checks: {"amount": {"gte": "1000"}} → filter[amount][gte]=1000. */
export function filterParameters(filter: Record<string, unknown>): Map<string, string> {
  const parameters = new Map<string, string>()
  const scalar = (value: unknown, pointer: string): string => {
    if (typeof value === 'string') return value
    if (typeof value === 'number' || typeof value === 'boolean') return String(value)
    throw new ValidationError(`${pointer.slice(1)} must be a string, a number or a boolean`, [
      { pointer, code: 'type', message: 'must be a string, a number or a boolean' },
    ])
  }
  for (const [field, condition] of Object.entries(filter)) {
    const pointer = `/filter/${field}`
    if (condition === null) parameters.set(`filter[${field}][is_null]`, 'true')
    else if (typeof condition === 'object' && !Array.isArray(condition)) {
      for (const [op, value] of Object.entries(condition as Record<string, unknown>)) {
        const text = Array.isArray(value)
          ? value.map((item, index) => scalar(item, `${pointer}/${op}/${index}`)).join(',')
          : scalar(value, `${pointer}/${op}`)
        parameters.set(`filter[${field}][${op}]`, text)
      }
    } else if (Array.isArray(condition)) {
      parameters.set(`filter[${field}][in]`, condition.map((item, index) => scalar(item, `${pointer}/${index}`)).join(','))
    } else parameters.set(`filter[${field}]`, scalar(condition, pointer))
  }
  return parameters
}

export function exportFields(type: RecordType, names: string[] | undefined): FieldSpec[] {
  if (!names || names.length === 0) return type.fields
  const errors: FieldProblem[] = []
  const fields: FieldSpec[] = []
  names.forEach((name, index) => {
    const field = type.byName.get(name)
    if (!field) errors.push({ pointer: `/fields/${index}`, code: 'unknown_field', message: `${type.path} have no field ${name}` })
    else if (fields.includes(field))
      errors.push({ pointer: `/fields/${index}`, code: 'duplicate_field', message: `${name} is listed twice` })
    else fields.push(field)
  })
  if (errors.length > 0) throw new ValidationError(`fields: ${errors[0].message}`, errors)
  return fields
}

/** A field as the API's JSON writes it (money and times as strings), for CSV as text. */
function jsonValue(field: FieldSpec): Fragment {
  const column = sql.identifier(['t', field.name])
  if (field.kind === 'timestamp') return sql.fragment`crm.api_time(${column})`
  if (field.kind === 'numeric') return sql.fragment`${column}::text`
  return sql.fragment`${column}`
}

function textValue(field: FieldSpec): Fragment {
  const column = sql.identifier(['t', field.name])
  if (field.kind === 'timestamp') return sql.fragment`crm.api_time(${column})`
  return sql.fragment`${column}::text`
}

export function exportQuery(type: RecordType, request: ExportRequest): { query: LinesQuery; header: string | null } {
  const fields = exportFields(type, request.fields)
  const parameters = filterParameters(request.filter ?? {})
  if (request.sort !== undefined) parameters.set('sort', request.sort)
  let list
  try {
    list = parseListRequest(type, parameters)
  } catch (error) {
    // The records parser speaks query strings (400); in a JSON body the same mistakes are a 422.
    if (error instanceof InvalidParameterError) {
      const pointer = request.sort !== undefined && /^sort/.test(error.message) ? '/sort' : '/filter'
      throw new ValidationError(error.message, [{ pointer, code: 'invalid', message: error.message }])
    }
    throw error
  }
  const conditions = list.filters.map(filterCondition)
  conditions.push(sql.fragment`t.workspace_id = (select crm.current_workspace_id())`)
  conditions.push(ownerWithinGrant(type.path, 'export', sql.fragment`t.owner_id`))
  const where = sql.join(conditions, sql.fragment` and `)
  const order = orderByClause(orderKeys(list, null))
  const everyField = fields.length === type.fields.length && fields.every((field, index) => field === type.fields[index])
  let line: Fragment
  let header: string | null = null
  if (request.format === 'ndjson') {
    line = everyField
      ? sql.fragment`${type.jsonFunction}(t)::text`
      : sql.fragment`json_build_object(${sql.join(
          fields.map((field) => sql.fragment`${field.name}::text, ${jsonValue(field)}`),
          sql.fragment`, `,
        )})::text`
  } else {
    // Only text and JSON can hold a quote, comma or line break, or start a formula; ids, numbers,
    // dates and times are written as stored (a numeric -5 stays -5).
    const cell = (field: FieldSpec) =>
      field.kind === 'text' || field.kind === 'lowercase' || field.kind === 'json'
        ? csvTextCellSql(textValue(field))
        : sql.fragment`coalesce(${textValue(field)}, '')`
    line = sql.fragment`concat_ws(',', ${sql.join(fields.map(cell), sql.fragment`, `)})`
    header = fields.map((field) => field.name).join(',')
  }
  return { query: sql.type(LineRow)`select ${line} as line from ${type.table} as t where ${where} order by ${order}`, header }
}
