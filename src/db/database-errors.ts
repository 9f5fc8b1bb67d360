// What a database error means for the caller, as a typed error of src/errors.ts: our own `CR<status>`
// raises, the SQLSTATEs a request can provoke, and the failures that mean "the database is not
// there". Constraint names become the JSON pointer of the field they protect, so an answer names
// the offending field without ever echoing SQL. The HTTP layer's problem.ts turns the result into a status.
import { ConnectionError, SlonikError, NotFoundError as SlonikNotFoundError } from 'slonik'
import {
  AuthenticationError,
  ConflictError,
  type CrmError,
  DuplicateError,
  type FieldProblem,
  ForbiddenError,
  NotFoundError,
  PlanRequiredError,
  RateLimitedError,
  UnavailableError,
  ValidationError,
} from '../errors.ts'

export type DatabaseErrorFields = { code?: string; constraint?: string; column?: string; message?: string; hint?: string; detail?: string }

/** Constraint name → field pointer, for every area's constraints (composed where errors are answered, src/http/problem.ts). */
export type ConstraintFields = ReadonlyMap<string, string>

/** Joins per-area lists into one map; a constraint named twice with different fields is a mistake. */
export function composeConstraintFields(...lists: Readonly<Record<string, string>>[]): ConstraintFields {
  const fields = new Map<string, string>()
  for (const list of lists) {
    for (const [constraint, pointer] of Object.entries(list)) {
      const known = fields.get(constraint)
      if (known !== undefined && known !== pointer) throw new Error(`constraint ${constraint} maps to both ${known} and ${pointer}`)
      fields.set(constraint, pointer)
    }
  }
  return fields
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

const CONNECTION_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH'])

/** The typed error a database failure stands for, or null when it is a bug (an internal error). */
export function classifyDatabaseError(error: unknown, constraintFields: ConstraintFields): CrmError | null {
  const fields = databaseErrorOf(error)
  const sqlstate = fields?.code
  if (fields && sqlstate) {
    // Our own SQL raises CR<status> with the API code in HINT: the function already decided the answer.
    if (sqlstate.startsWith('CR')) return raisedError(Number(sqlstate.slice(2)), fields)
    const pointer = pointerOf(fields, constraintFields)
    const name = pointer ? pointer.slice(1).replaceAll('/', '.') : 'a value'
    const problem = (code: string, message: string): FieldProblem[] | undefined => (pointer ? [{ pointer, code, message }] : undefined)
    switch (sqlstate) {
      case '23505': // unique_violation: a unique value (email, domain, slug) is taken
        return new DuplicateError(`${name} is already taken`, problem('duplicate', 'is already taken'))
      case '23503': // foreign_key_violation: a referenced record is missing (or invisible to the caller)
        return new ValidationError(
          `${name} refers to a record that does not exist`,
          problem('not_found', 'refers to a record that does not exist'),
        )
      case '23514': // check_violation: a constraint on the value
      case '23502': // not_null_violation
      case '22001': // string_data_right_truncation: too long
      case '22003': // numeric_value_out_of_range
      case '22P02': // invalid_text_representation: e.g. not a uuid or not a number
      case '22007': // invalid_datetime_format
      case '22008': // datetime_field_overflow
      case '22023': // invalid_parameter_value
      case '2200N': // invalid_xml_content (never expected; listed so it cannot become a 500)
        return new ValidationError(`${name} is invalid`, problem('invalid', 'is invalid'))
      case '42501': // insufficient_privilege, including "new row violates row-level security policy"
        return new ForbiddenError()
      case '40001': // serialization_failure after slonik's retries
      case '40P01': // deadlock_detected after retries
      case '57014': // query_canceled: statement timeout
      case '57P01': // admin_shutdown: the server is restarting
      case '57P02': // crash_shutdown
      case '57P03': // cannot_connect_now: starting up or in recovery
      case '53300': // too_many_connections
      case '08000':
      case '08003':
      case '08006':
      case '08001':
      case '08004': // connection exceptions
        return new UnavailableError(error)
    }
  }
  if (error instanceof ConnectionError) return new UnavailableError(error)
  if (error instanceof SlonikError && /timeout|terminat|connection/i.test(error.message)) return new UnavailableError(error)
  if (error instanceof SlonikNotFoundError) return new NotFoundError()
  const nodeCode = (error as { code?: string } | null)?.code
  if (nodeCode && CONNECTION_CODES.has(nodeCode)) return new UnavailableError(error)
  return null
}

function pointerOf(fields: DatabaseErrorFields, constraintFields: ConstraintFields): string | undefined {
  return (fields.constraint && constraintFields.get(fields.constraint)) || (fields.column ? `/${fields.column}` : undefined)
}

/** A `raise ... using errcode = 'CR<status>', hint = '<code>'[, detail = '/<pointer>']` of our SQL. */
function raisedError(status: number, fields: DatabaseErrorFields): CrmError | null {
  const message = fields.message ?? 'Request refused'
  const errors = fields.detail?.startsWith('/')
    ? [{ pointer: fields.detail, code: fields.hint ?? 'invalid', message: fields.message ?? '' }]
    : undefined
  const code = fields.hint
  switch (status) {
    case 401: // a function found no signed-in user (crm.start_totp_enrollment): answered without a challenge
      return new AuthenticationError(code ?? 'token_invalid', message, { errors, invalidToken: false })
    case 402:
      return new PlanRequiredError(message)
    case 403:
      return new ForbiddenError(message, code)
    case 404:
      return new NotFoundError(message, code)
    case 409:
      return new ConflictError(code ?? 'conflict', message, { errors })
    case 422:
      return new ValidationError(message, errors, code)
    case 429: // detail: the seconds until the limit's window ends (crm.claim_webhook_operation)
      return new RateLimitedError(Number(fields.detail) || 60, code ?? 'rate_limited', message)
  }
  return null
}
