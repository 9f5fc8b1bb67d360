// The one place that turns any error into an answer: a typed error of src/errors.ts, or a database
// error classified by src/db/database-errors.ts, becomes a status, a title, headers and an RFC 9457
// problem-details body (after PostgREST's Error.hs). Anything else is a bug: 500.
import { type ConstraintFields, classifyDatabaseError, composeConstraintFields } from '../db/database-errors.ts'
import {
  AuthenticationError,
  ConflictError,
  CrmError,
  CursorExpiredError,
  DuplicateError,
  type FieldProblem,
  ForbiddenError,
  InsufficientScopeError,
  InvalidJsonError,
  InvalidParameterError,
  NotFoundError,
  PayloadTooLargeError,
  PlanRequiredError,
  PreconditionFailedError,
  RateLimitedError,
  RequestTimeoutError,
  UnavailableError,
  UnsupportedMediaTypeError,
  ValidationError,
} from '../errors.ts'
import { MEMBER_CONSTRAINT_FIELDS } from '../members/constraints.ts'
import { RECORD_CONSTRAINT_FIELDS } from '../records/constraints.ts'

export type { FieldProblem }

/** An answer decided: status, API code, title, detail, and what goes with them. */
export class ApiError extends Error {
  readonly status: number
  readonly code: string
  readonly title: string
  readonly errors?: FieldProblem[]
  readonly headers?: Record<string, string>
  constructor(
    status: number,
    code: string,
    title: string,
    detail?: string,
    options: { errors?: FieldProblem[]; headers?: Record<string, string>; cause?: unknown } = {},
  ) {
    super(detail ?? title, { cause: options.cause })
    this.name = 'ApiError'
    this.status = status
    this.code = code
    this.title = title
    this.errors = options.errors
    this.headers = options.headers
  }
}

const INVALID_TOKEN = { 'WWW-Authenticate': 'Bearer realm="crm", error="invalid_token"' }

/** Status and title of each typed error; the first class the error is an instance of wins. */
const ANSWERS: [new (...args: never[]) => CrmError, number, string | ((error: CrmError) => string)][] = [
  [InvalidJsonError, 400, 'Request body is not valid JSON'],
  [InvalidParameterError, 400, 'A query parameter is invalid'],
  [AuthenticationError, 401, 'Authentication failed'],
  [PlanRequiredError, 402, 'Plan required'],
  [ForbiddenError, 403, 'Forbidden'],
  [NotFoundError, 404, (error) => (error.code === 'workspace_not_found' ? 'Workspace not found' : 'Not found')],
  [RequestTimeoutError, 408, 'Request timeout'],
  [CursorExpiredError, 410, 'Cursor expired'],
  [DuplicateError, 409, 'Duplicate value'],
  [ConflictError, 409, 'Conflict'],
  [PreconditionFailedError, 412, 'Precondition failed'],
  [PayloadTooLargeError, 413, 'Payload too large'],
  [UnsupportedMediaTypeError, 415, 'Unsupported media type'],
  [ValidationError, 422, 'Request body is invalid'],
  [RateLimitedError, 429, 'Too many requests'],
  [UnavailableError, 503, 'Service unavailable'],
]

/** RFC 6750 section 3: the challenge of a token whose scopes fall short, naming what would do. */
function insufficientScope(scope: string): Record<string, string> {
  return {
    'WWW-Authenticate': `Bearer realm="crm", error="insufficient_scope"${scope ? `, scope="${scope}"` : ''}`,
  }
}

function headersOf(error: CrmError): Record<string, string> | undefined {
  if (error instanceof AuthenticationError) return error.invalidToken ? INVALID_TOKEN : undefined
  if (error instanceof InsufficientScopeError) return insufficientScope(error.scope)
  // A refusal the database named without the scope (a SECURITY DEFINER gate, CR403 insufficient_scope).
  if (error instanceof ForbiddenError && error.code === 'insufficient_scope') return insufficientScope('')
  // The rest of the body may still be on its way: the connection cannot carry another request.
  if (error instanceof RequestTimeoutError) return { Connection: 'close' }
  if (error instanceof RateLimitedError && error.quota) {
    const { limit, remaining, resetSeconds } = error.quota
    return {
      'Retry-After': String(error.retryAfterSeconds),
      'RateLimit-Limit': String(limit),
      'RateLimit-Remaining': String(remaining),
      'RateLimit-Reset': String(resetSeconds),
    }
  }
  if (error instanceof RateLimitedError || error instanceof UnavailableError) return { 'Retry-After': String(error.retryAfterSeconds) }
  return undefined
}

/** Every area's constraint names with the field each protects, so a refusal points at that field. */
export const CONSTRAINT_FIELDS: ConstraintFields = composeConstraintFields(RECORD_CONSTRAINT_FIELDS, MEMBER_CONSTRAINT_FIELDS)

/** The answer to any error. */
export function toApiError(error: unknown): ApiError {
  if (error instanceof ApiError) return error
  const typed = error instanceof CrmError ? error : classifyDatabaseError(error, CONSTRAINT_FIELDS)
  const answer = typed && ANSWERS.find(([type]) => typed instanceof type)
  if (!typed || !answer) return internalError(error)
  const [, status, title] = answer
  return new ApiError(status, typed.code, typeof title === 'string' ? title : title(typed), typed.message, {
    errors: typed.errors,
    headers: headersOf(typed),
    cause: typed.cause ?? typed,
  })
}

export function internalError(cause?: unknown): ApiError {
  return new ApiError(
    500,
    'internal_error',
    'Internal error',
    'Something went wrong on our side; quote the request_id when you report it',
    { cause },
  )
}

export function problemBody(error: ApiError, requestId: string): Record<string, unknown> {
  return {
    type: `/problems/${error.code}`,
    title: error.title,
    status: error.status,
    code: error.code,
    detail: error.message,
    ...(error.errors ? { errors: error.errors } : {}),
    request_id: requestId,
  }
}
