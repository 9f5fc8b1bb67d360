// The errors the API answers with, as the domain sees them: each class carries a code of docs/api.md
// section 2 and what the answer needs (field problems as JSON pointers, a Retry-After, whether to
// send an invalid_token challenge), never an HTTP status or a problem-details shape. Domain code
// throws them; src/http/problem.ts alone turns them into answers.

/** One offending field: a JSON pointer into the body (or a parameter's name), a code, a message. */
export type FieldProblem = { pointer: string; code: string; message: string }

type ErrorOptions = { errors?: FieldProblem[]; cause?: unknown }

export class CrmError extends Error {
  /** The API code (docs/api.md section 2), e.g. `validation_failed` or `duplicate`. */
  readonly code: string
  readonly errors?: FieldProblem[]
  constructor(code: string, detail: string, options: ErrorOptions = {}) {
    super(detail, { cause: options.cause })
    this.name = new.target.name
    this.code = code
    this.errors = options.errors
  }
}

/** 410 cursor_expired: an events feed cursor issued longer ago than events are kept (EVENTS_RETENTION_DAYS). */
export class CursorExpiredError extends CrmError {
  constructor(retentionDays: number) {
    super(
      'cursor_expired',
      `This cursor is older than the ${retentionDays} days events are kept: events after it may be gone; start again without after`,
    )
  }
}

/** The body is not JSON. */
export class InvalidJsonError extends CrmError {
  constructor(detail: string) {
    super('invalid_json', detail)
  }
}

/** A query parameter (filter, sort, limit, cursor...) is malformed or names an unknown field. */
export class InvalidParameterError extends CrmError {
  constructor(detail: string, errors?: FieldProblem[]) {
    super('invalid_parameter', detail, { errors })
  }
}

const TOKEN_CODES = new Set(['token_missing', 'token_invalid', 'token_expired', 'token_revoked', 'user_suspended', 'api_access_disabled'])

/** No or bad credentials (token_*, user_suspended...), or a refused sign-in (invalid_credentials...). */
export class AuthenticationError extends CrmError {
  /** The credentials themselves were refused: the answer carries an `invalid_token` challenge. */
  readonly invalidToken: boolean
  constructor(code: string, detail: string, options: ErrorOptions & { invalidToken?: boolean } = {}) {
    super(code, detail, options)
    this.invalidToken = options.invalidToken ?? TOKEN_CODES.has(code)
  }
}

/** A webhook feature outside the Pro plan or trial. */
export class PlanRequiredError extends CrmError {
  constructor(detail = 'Webhooks need the Pro plan or an active trial') {
    super('plan_required', detail)
  }
}

/** Visible but not allowed (`forbidden`), or outside the token's scopes (`insufficient_scope`). */
export class ForbiddenError extends CrmError {
  constructor(detail = 'You are not allowed to do this', code = 'forbidden') {
    super(code, detail)
  }
}

/**
 * The token's scopes do not cover the route (`insufficient_scope`): `scope` names what the route
 * accepts (space-separated), or is empty when the database refused without naming it.
 */
export class InsufficientScopeError extends ForbiddenError {
  readonly scope: string
  constructor(
    scope: string,
    detail = scope ? `This token's scopes do not include ${scope.split(' ').join(' or ')}` : "This token's scopes do not allow this",
  ) {
    super(detail, 'insufficient_scope')
    this.scope = scope
  }
}

/** No such thing, or not visible to the caller (`not_found`, `workspace_not_found`). */
export class NotFoundError extends CrmError {
  constructor(detail = 'No such record', code = 'not_found') {
    super(code, detail)
  }
}

/** A unique value is taken. */
export class DuplicateError extends CrmError {
  constructor(detail: string, errors?: FieldProblem[]) {
    super('duplicate', detail, { errors })
  }
}

/** The request conflicts with the current state (`idempotency_conflict`, `role_in_use`...). */
export class ConflictError extends CrmError {}

/** If-Match does not match the current ETag. */
export class PreconditionFailedError extends CrmError {
  constructor(detail = 'If-Match does not match the current ETag') {
    super('precondition_failed', detail)
  }
}

export class PayloadTooLargeError extends CrmError {
  constructor(limitBytes: number) {
    super('payload_too_large', `The body is larger than ${limitBytes} bytes`)
  }
}

/** The client stopped sending its body, or sent it too slowly (docs/api.md section 2). */
export class RequestTimeoutError extends CrmError {
  constructor(detail: string) {
    super('request_timeout', detail)
  }
}

export class UnsupportedMediaTypeError extends CrmError {
  constructor(detail: string) {
    super('unsupported_media_type', detail)
  }
}

/** The body fails validation (`validation_failed`, `url_not_allowed`, `seat_limit_reached`). */
export class ValidationError extends CrmError {
  constructor(detail: string, errors?: FieldProblem[], code = 'validation_failed') {
    super(code, detail, { errors })
  }
}

/** A caller's request quota: its size, what is left, and the seconds until it refills. */
export type RateLimitQuota = { limit: number; remaining: number; resetSeconds: number }

/** Over the request rate (`rate_limited`) or too many failed sign-ins (`too_many_attempts`). */
export class RateLimitedError extends CrmError {
  readonly retryAfterSeconds: number
  /** The exhausted quota, when the refusal is about one (the RateLimit-* headers). */
  readonly quota?: RateLimitQuota
  constructor(retryAfterSeconds: number, code = 'rate_limited', detail = 'Too many requests', quota?: RateLimitQuota) {
    super(code, detail)
    this.retryAfterSeconds = retryAfterSeconds
    this.quota = quota
  }
}

/** What an attempt limit counts: passwords per email, or two-factor codes per user. */
export type AttemptPurpose = 'sign_in' | 'two_factor'

/** The attempt limit of one email or user is spent (`too_many_attempts`) until its window ends. */
export class AttemptLimitError extends RateLimitedError {
  readonly purpose: AttemptPurpose
  constructor(purpose: AttemptPurpose, retryAfterSeconds: number, detail: string) {
    super(retryAfterSeconds, 'too_many_attempts', detail)
    this.purpose = purpose
  }
}

/** The database cannot be reached or gave up (timeout, restart, no connection left). */
export class UnavailableError extends CrmError {
  readonly retryAfterSeconds = 5
  constructor(cause?: unknown, detail = 'The database cannot be reached right now; retry shortly') {
    super('unavailable', detail, { cause })
  }
}

/**
 * A refusal of the OAuth token or revocation endpoint, answered as RFC 6749 section 5.2 JSON
 * (`invalid_request`, `invalid_client`, `invalid_grant`, `unauthorized_client`,
 * `unsupported_grant_type`, `invalid_scope`), not as problem details.
 */
export class OAuthError extends CrmError {
  /** The client proved who it is before this refusal (a refusal of the grant, not of the client). */
  readonly clientAuthenticated: boolean
  constructor(code: string, detail: string, options: ErrorOptions & { clientAuthenticated?: boolean } = {}) {
    super(code, detail, options)
    this.clientAuthenticated = options.clientAuthenticated ?? false
  }
}

/**
 * The client closed the connection before its body was complete, or while its answer streamed: no
 * one is left to answer (not a CrmError: it has no answer).
 */
export class ClientWentAwayError extends Error {
  constructor(cause: unknown) {
    super('The client closed the connection before sending the whole body', { cause })
    this.name = 'ClientWentAwayError'
  }
}
