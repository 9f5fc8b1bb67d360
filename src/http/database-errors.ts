// The one table that turns database errors into API problems, keyed by SQLSTATE (after PostgREST's
// Error.hs). Constraint names are mapped to the JSON pointer of the field they protect, so a 409 or
// 422 names the offending field without the API ever echoing SQL.
import { ConnectionError, NotFoundError, SlonikError } from 'slonik'
import { ApiError, problems, type FieldProblem } from './problem.ts'

type DatabaseErrorFields = { code?: string; constraint?: string; column?: string; message?: string; hint?: string; detail?: string }

/** Constraint name → field pointer. Later migrations add their constraints here. */
export const CONSTRAINT_FIELDS: Record<string, string> = {}

export function registerConstraintFields(map: Record<string, string>): void {
  Object.assign(CONSTRAINT_FIELDS, map)
}

/** Finds the PostgreSQL error (with its SQLSTATE) inside slonik's wrappers. */
export function databaseErrorOf(error: unknown): DatabaseErrorFields | null {
  let current: unknown = error
  for (let depth = 0; current && depth < 5; depth++) {
    const candidate = current as DatabaseErrorFields & { cause?: unknown }
    if (typeof candidate.code === 'string' && /^[0-9A-Z]{5}$/.test(candidate.code)) return candidate
    current = candidate.cause
  }
  return null
}

function fieldProblem(fields: DatabaseErrorFields, code: string, message: string): FieldProblem[] | undefined {
  const pointer = (fields.constraint && CONSTRAINT_FIELDS[fields.constraint]) ?? (fields.column ? `/${fields.column}` : undefined)
  return pointer ? [{ pointer, code, message }] : undefined
}

const CONNECTION_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH'])

export function toApiError(error: unknown): ApiError {
  if (error instanceof ApiError) return error
  const fields = databaseErrorOf(error)
  const sqlstate = fields?.code
  if (fields && sqlstate) {
    // Our own SQL raises CRnnn with the API code in HINT: the function already decided the answer.
    if (sqlstate.startsWith('CR')) {
      const status = Number(sqlstate.slice(2))
      return new ApiError(status, fields.hint ?? 'validation_failed', titleFor(status), fields.message ?? 'Request refused', {
        errors: fields.detail?.startsWith('/') ? [{ pointer: fields.detail, code: fields.hint ?? 'invalid', message: fields.message ?? '' }] : undefined,
      })
    }
    switch (sqlstate) {
      case '23505': // unique_violation: a unique value (email, domain, slug) is taken
        return problems.duplicate(`${describe(fields)} is already taken`, fieldProblem(fields, 'duplicate', 'is already taken'))
      case '23503': // foreign_key_violation: a referenced record is missing (or invisible to the caller)
        return problems.validation(`${describe(fields)} refers to a record that does not exist`, fieldProblem(fields, 'not_found', 'refers to a record that does not exist'))
      case '23514': // check_violation: a constraint on the value
      case '23502': // not_null_violation
      case '22001': // string_data_right_truncation: too long
      case '22003': // numeric_value_out_of_range
      case '22P02': // invalid_text_representation: e.g. not a uuid or not a number
      case '22007': // invalid_datetime_format
      case '22008': // datetime_field_overflow
      case '22023': // invalid_parameter_value
      case '2200N': // invalid_xml_content (never expected; listed so it cannot become a 500)
        return problems.validation(`${describe(fields)} is invalid`, fieldProblem(fields, 'invalid', 'is invalid'))
      case '42501': // insufficient_privilege, including "new row violates row-level security policy"
        return problems.forbidden()
      case '40001': // serialization_failure after slonik's retries
      case '40P01': // deadlock_detected after retries
      case '57014': // query_canceled: statement timeout
      case '57P01': // admin_shutdown: the server is restarting
      case '57P02': // crash_shutdown
      case '57P03': // cannot_connect_now: starting up or in recovery
      case '53300': // too_many_connections
      case '08000': case '08003': case '08006': case '08001': case '08004': // connection exceptions
        return problems.unavailable(error)
    }
  }
  if (error instanceof ConnectionError) return problems.unavailable(error)
  if (error instanceof SlonikError && /timeout|terminat|connection/i.test(error.message)) return problems.unavailable(error)
  if (error instanceof NotFoundError) return problems.notFound()
  const nodeCode = (error as { code?: string } | null)?.code
  if (nodeCode && CONNECTION_CODES.has(nodeCode)) return problems.unavailable(error)
  return problems.internal(error)
}

function describe(fields: DatabaseErrorFields): string {
  const pointer = (fields.constraint && CONSTRAINT_FIELDS[fields.constraint]) ?? (fields.column ? `/${fields.column}` : null)
  return pointer ? pointer.slice(1).replaceAll('/', '.') : 'a value'
}

function titleFor(status: number): string {
  return ({ 401: 'Authentication failed', 402: 'Plan required', 403: 'Forbidden', 404: 'Not found', 409: 'Conflict', 422: 'Request body is invalid', 429: 'Too many requests' } as Record<number, string>)[status] ?? 'Request refused'
}
