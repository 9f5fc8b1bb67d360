// Every error the API answers is an ApiError carrying a code from API.md section 2; this file
// and database-errors.ts are the only places that decide a status code.
export type FieldProblem = { pointer: string; code: string; message: string }

export class ApiError extends Error {
  readonly status: number
  readonly code: string
  readonly title: string
  readonly errors?: FieldProblem[]
  readonly headers?: Record<string, string>
  readonly extra?: Record<string, unknown>
  constructor(status: number, code: string, title: string, detail?: string, options: { errors?: FieldProblem[]; headers?: Record<string, string>; extra?: Record<string, unknown>; cause?: unknown } = {}) {
    super(detail ?? title, { cause: options.cause })
    this.name = 'ApiError'
    this.status = status
    this.code = code
    this.title = title
    this.errors = options.errors
    this.headers = options.headers
    this.extra = options.extra
  }
}

const INVALID_TOKEN = { 'WWW-Authenticate': 'Bearer realm="crm", error="invalid_token"' }

export const problems = {
  invalidJson: (detail: string) => new ApiError(400, 'invalid_json', 'Request body is not valid JSON', detail),
  invalidParameter: (detail: string, errors?: FieldProblem[]) => new ApiError(400, 'invalid_parameter', 'A query parameter is invalid', detail, { errors }),
  unauthenticated: (code: string, detail: string) =>
    new ApiError(401, code, 'Authentication failed', detail, { headers: code.startsWith('token_') || code === 'user_suspended' || code === 'api_access_disabled' ? INVALID_TOKEN : undefined }),
  planRequired: (detail = 'Webhooks need the Pro plan or an active trial') => new ApiError(402, 'plan_required', 'Plan required', detail),
  forbidden: (detail = 'You are not allowed to do this') => new ApiError(403, 'forbidden', 'Forbidden', detail),
  notFound: (detail = 'No such record') => new ApiError(404, 'not_found', 'Not found', detail),
  workspaceNotFound: (detail = 'No such workspace, or you are not a member of it') => new ApiError(404, 'workspace_not_found', 'Workspace not found', detail),
  duplicate: (detail: string, errors?: FieldProblem[]) => new ApiError(409, 'duplicate', 'Duplicate value', detail, { errors }),
  conflict: (code: string, detail: string) => new ApiError(409, code, 'Conflict', detail),
  preconditionFailed: (detail = 'If-Match does not match the current ETag') => new ApiError(412, 'precondition_failed', 'Precondition failed', detail),
  payloadTooLarge: (limit: number) => new ApiError(413, 'payload_too_large', 'Payload too large', `The body is larger than ${limit} bytes`),
  unsupportedMediaType: (detail: string) => new ApiError(415, 'unsupported_media_type', 'Unsupported media type', detail),
  validation: (detail: string, errors?: FieldProblem[], code = 'validation_failed') => new ApiError(422, code, 'Request body is invalid', detail, { errors }),
  rateLimited: (retryAfterSeconds: number, code = 'rate_limited', detail = 'Too many requests') =>
    new ApiError(429, code, 'Too many requests', detail, { headers: { 'Retry-After': String(retryAfterSeconds) } }),
  internal: (cause?: unknown) => new ApiError(500, 'internal_error', 'Internal error', 'Something went wrong on our side; quote the request_id when you report it', { cause }),
  unavailable: (cause?: unknown, detail = 'The database cannot be reached right now; retry shortly') =>
    new ApiError(503, 'unavailable', 'Service unavailable', detail, { headers: { 'Retry-After': '5' }, cause }),
}

export function problemBody(error: ApiError, requestId: string): Record<string, unknown> {
  return {
    type: `/problems/${error.code}`,
    title: error.title,
    status: error.status,
    code: error.code,
    detail: error.message,
    ...(error.errors ? { errors: error.errors } : {}),
    ...error.extra,
    request_id: requestId,
  }
}
