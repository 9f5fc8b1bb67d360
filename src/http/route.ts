// A route is declared once, with its typebox schemas: the same definition validates requests,
// runs the handler in the caller's transaction and feeds /api/openapi.json.
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { TSchema } from 'typebox'
import { Compile } from 'typebox/compile'
import type { Caller } from '../auth/caller.ts'
import { type RouteScope, scopeAttribute, scopesAllow } from '../auth/scopes.ts'
import type { Config } from '../config.ts'
import type { DatabasePool, DatabaseTransactionConnection } from '../db/pool.ts'
import type { ReadRouting } from '../db/request/read-replicas.ts'
import { type FieldProblem, ForbiddenError, InsufficientScopeError, ValidationError } from '../errors.ts'
import type { Logger } from '../log.ts'
import type { AddressRateLimit, OAuthClientRateLimit } from './address-rate-limit.ts'
import type { ReceivedFile } from './body.ts'
import type { BodyReceipts, UploadReceipts } from './upload-receipts.ts'
import { fieldMessage } from './validation-messages.ts'
import type { RouteSlots, WorkspaceWork } from './workspace-slots.ts'

export type HttpMethod = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'

export type Services = {
  config: Config
  /**
   * The runtime role's connections (src/db/runtime-role.ts): request transactions, which switch to
   * crm_api, and the work done before a caller is known (sign-in, two-factor completion, sign-up,
   * accepting an invitation), which calls the narrow functions granted to crm_runtime alone
   * (granted in sql/definitions/).
   */
  pool: DatabasePool
  logger: Logger
  /**
   * The base of every link the service sends (an invitation's accept_url): PUBLIC_BASE_URL, else
   * the listening address (localhost for a wildcard). Never the request's Host, which the client
   * chooses.
   */
  baseUrl: string
  /** The per-address limit of the unauthenticated routes; throws 429 rate_limited past it. */
  addressRateLimit: AddressRateLimit
  /** The OAuth token and revocation endpoints' limit of clients that send a secret (429 past it). */
  oauthClientRateLimit: OAuthClientRateLimit
  /**
   * JSON and form bodies without a caller being received (sign-in, sign-up, their pages' forms, the
   * OAuth token endpoint; JSON_BODIES_PER_ADDRESS, JSON_BODIES_TOTAL): 429 or 503 past a bound.
   */
  bodyReceipts: BodyReceipts
  /**
   * The forms of signed-in pages, with the same bounds: read before their session is checked (their
   * CSRF token is in them), so a made-up session cookie's forms can hold only these.
   */
  sessionFormReceipts: BodyReceipts
  /**
   * JSON bodies of proven callers (authenticated routes), with the same bounds but receipts of
   * their own: bodies without a caller cannot fill them, and an unproven token's body takes none.
   */
  callerBodyReceipts: BodyReceipts
  /**
   * Uploads being received (UPLOADS_PER_ADDRESS, UPLOADS_TOTAL, UPLOAD_TEMP_BYTES), the API's and
   * the import wizard's alike: one set, so the wizard's page is no way around the bounds.
   */
  uploadReceipts: UploadReceipts
  /** The slots of exports and uploads, per workspace and per process: taken by the router and by the pages alike. */
  routeSlots: RouteSlots
  /** The streaming standbys that serve reads (READ_REPLICA_URLS), else null. */
  readRouting?: ReadRouting | null
  /** Filled by the worker runner when it runs in this process; routes use it to add jobs. */
  [key: string]: unknown
}

export type RouteContext<Body = any> = {
  req: IncomingMessage
  res: ServerResponse
  requestId: string
  params: Record<string, string>
  query: Record<string, string | string[]>
  body: Body
  /** The received body of a 'file' route. */
  bodyFile?: ReceivedFile
  services: Services
  /** The request transaction, running as crm_api with the caller's context (auth routes only). */
  db: DatabaseTransactionConnection
  caller: Caller
}

/**
 * A response body that is already JSON text (rendered by PostgreSQL): sent as it is, not parsed
 * and stringified again.
 */
export class JsonText {
  readonly text: string
  constructor(text: string) {
    this.text = text
  }
}

/**
 * What a long-polling route found nothing for: the request may wait up to `ms` for a notification
 * of its workspace, then runs again (src/http/app.ts). `pending`: something may become readable
 * without a notification, so it runs again sooner.
 */
export type LongPollWait = { ms: number; workspaceId: string; pending: boolean }

export type RouteResult = {
  status?: number
  body?: unknown
  headers?: Record<string, string | undefined>
  /** A long-polling route's empty answer, which may wait for more (longPoll routes only). */
  wait?: LongPollWait
} | void

export type AuthMode =
  /** bearer token or session cookie; the handler runs as crm_api in the caller's transaction */
  | 'required'
  /** no caller; the handler gets the pool (token endpoints, health) */
  | 'none'

export type CredentialRule =
  /**
   * The user's whole authority only: an unscoped personal token or a UI session. A scoped token or
   * an OAuth app's access token is refused (403) before the handler runs; on a route without a
   * caller (auth 'none') that takes an optional bearer, the database function applies the rule.
   */
  | 'unscoped'
  /**
   * Any token the route's scope admits, but a scoped token or an app's token acts on its own
   * credential only (revokes itself or its own authorization); the handler narrows.
   */
  | 'self'
  /**
   * The route's scope decides: it yields no credential of the caller's and widens none (listing
   * the user's tokens; an OAuth app's registration, its client secret and the workspace's
   * connections to it, for workspace:admin: an app still needs a user's consent for a token).
   */
  | 'scope'
  /** No bearer is read: the credential comes from a password, a code or a refresh token. */
  | 'anonymous'

export type RouteDefinition = {
  method: HttpMethod
  path: string
  summary: string
  tag: string
  auth: AuthMode
  /**
   * The token scope the route needs (docs/api.md section 4a), required when auth is 'required': a scoped
   * token without it is refused with 403 insufficient_scope before the handler runs. A list means
   * any one of them; 'none' is for what every token may do. Row-level security applies the same
   * scopes underneath; this check answers first and names the missing scope.
   */
  scope?: RouteScope
  /**
   * Which credentials may call a route that issues, extends, revokes or changes a credential
   * (required for those: see `assertCredentialsDeclared`). A route that yields a credential never
   * yields one wider than its caller's (test/auth/credentials-never-widen.test.ts checks every route).
   */
  credentials?: CredentialRule
  /** Counted against UNAUTHENTICATED_RATE_LIMIT_PER_MINUTE per client address (sign-in and the like). */
  limitedPerAddress?: boolean
  /** JSON body schema (validated; unknown fields refused when the schema says so). */
  body?: TSchema
  /**
   * A form-encoded body (application/x-www-form-urlencoded) the handler reads itself, for the
   * OpenAPI document only: the OAuth endpoints, whose clients post forms (RFC 6749).
   */
  formBody?: TSchema
  /** The JSON body of this route's errors when they are not problem details (OAuth: RFC 6749 section 5.2). */
  errorBody?: TSchema
  /**
   * Body handling: 'json' (default when body is set), or 'file': the whole body, up to
   * `fileLimit` bytes, is received into a temporary file before a database connection is taken;
   * the handler reads it from `bodyFile`, and the file is removed after the answer.
   */
  bodyKind?: 'json' | 'file'
  fileLimit?: number
  /** Refuses a body from the request's headers alone, before a byte of it is received (throws). */
  checkBodyHeaders?: (req: IncomingMessage) => void
  /**
   * A cheap check of the parsed JSON body before its schema's (throws): a count that would make
   * validating every item costly (a batch of 100,000 tiny items fits the body limit) is refused
   * without walking the items.
   */
  checkBodyBeforeSchema?: (body: Record<string, unknown>) => void
  /**
   * A 'file' route's check of the caller, run in the transaction that authenticates it before its
   * body is received (throws), so a caller the handler would refuse sends nothing to disk.
   */
  checkCallerBeforeBody?: (db: DatabaseTransactionConnection) => Promise<void>
  /** Counted against the workspace's concurrent uploads or exports (429 past the limit). */
  limitedPerWorkspace?: WorkspaceWork
  /** Success status and schema for the OpenAPI document. */
  status?: number
  response?: TSchema
  /** A success answer that is not JSON (a CSV file, say): media type and what it holds, for the OpenAPI document. */
  responseMedia?: Record<string, string>
  /** Extra documented query parameters, by name. */
  queryParameters?: Record<string, { description: string; schema: Record<string, unknown> }>
  /** Statuses this route may answer besides success, for the OpenAPI document. */
  errors?: number[]
  example?: { request?: unknown; response?: unknown }
  /**
   * The handler is a read that sends exactly one query: authentication travels inside that
   * statement, on a connection already running as crm_api, with no BEGIN/COMMIT (one round trip).
   * Such a handler must not read `caller` before its query.
   */
  singleStatement?: boolean
  /**
   * The handler is a write that, for this request, sends one query through
   * SingleStatementConnection.write (e.g. no Idempotency-Key or If-Match, which need a
   * transaction): authentication, the write and its events travel as one statement, one round
   * trip, when the process has the token's identity cached (see mayWriteInOneStatement in app.ts);
   * otherwise the handler runs in a transaction.
   */
  writesInOneStatement?: (req: IncomingMessage) => boolean
  /**
   * The handler writes the response itself (streams); the framework must not. It holds its
   * connection while the client reads, so it takes one of the process's stream slots
   * (STREAMS_PER_PROCESS, 503 past them).
   */
  streams?: boolean
  /**
   * A read of many rows in a transaction of its own (an export): it writes nothing, so it holds
   * none of its user's reads to the primary afterwards, and a streaming standby may serve it
   * (src/db/request/read-replicas.ts). It must send nothing to the client before its query answers.
   */
  longRead?: boolean
  /**
   * Long polling (GET /api/events?wait=): when the handler answers `wait`, the request gives its
   * connection back and waits for a notification of its workspace (src/webhooks/feed-listener.ts),
   * holding one of the process's FEED_WAITS_PER_PROCESS slots (503 past them), then runs again.
   * Concurrent requests with the same credential, workspace and URL share one run.
   */
  longPoll?: boolean
  handler: (context: RouteContext) => Promise<RouteResult>
}

type Validator = ReturnType<typeof Compile>
const validators = new WeakMap<TSchema, { lengths: Validator; full: Validator }>()

/**
 * The schema without the checks that run a regular expression (pattern, format): typebox's error
 * walk runs every keyword of a string, pattern included, even when maxLength already failed, so a
 * 1 MiB string would meet a pattern. Lengths, types and shapes are checked first with this copy;
 * patterns and formats run only on strings within their limits.
 */
function withoutExpressions(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(withoutExpressions)
  if (schema === null || typeof schema !== 'object') return schema
  const copy: Record<string, unknown> = {}
  for (const [name, value] of Object.entries(schema)) {
    if ((schema as { type?: unknown }).type === 'string' && (name === 'pattern' || name === 'format')) continue
    copy[name] = withoutExpressions(value)
  }
  return copy
}

function validatorsOf(schema: TSchema): { lengths: Validator; full: Validator } {
  let found = validators.get(schema)
  if (!found) {
    found = { lengths: Compile(withoutExpressions(JSON.parse(JSON.stringify(schema))) as TSchema), full: Compile(schema) }
    validators.set(schema, found)
  }
  return found
}

/**
 * Strings PostgreSQL cannot store: a NUL character (text refuses it) and a lone UTF-16 surrogate
 * (it has no UTF-8 form: the driver would silently store U+FFFD, and jsonb refuses its escape).
 */
export function isStorableString(text: string): boolean {
  return !text.includes('\u0000') && text.isWellFormed()
}

/** A JSON pointer segment (RFC 6901: ~ and / escaped). */
function pointerSegment(name: string): string {
  return name.replaceAll('~', '~0').replaceAll('/', '~1')
}

/**
 * Every string of a JSON value, object keys included, that PostgreSQL cannot store, by pointer (at
 * most 50), in document order. A loop over an explicit stack rather than recursion, so no value
 * can overflow the call stack, however deep it nests.
 */
function unstorableStrings(value: unknown): FieldProblem[] {
  const found: FieldProblem[] = []
  type Pending = { value: unknown; pointer: string } | { problem: FieldProblem }
  const pending: Pending[] = [{ value, pointer: '' }]
  while (pending.length > 0 && found.length < 50) {
    const next = pending.pop()!
    if ('problem' in next) {
      found.push(next.problem)
      continue
    }
    const { value: item, pointer } = next
    // Children are pushed last first: the stack hands them back in document order.
    const children: Pending[] = []
    if (typeof item === 'string') {
      if (!isStorableString(item))
        found.push({ pointer: pointer || '/', code: 'unstorable_string', message: 'contains a NUL character or a lone surrogate' })
    } else if (Array.isArray(item)) {
      for (const [index, child] of item.entries()) children.push({ value: child, pointer: `${pointer}/${index}` })
    } else if (item !== null && typeof item === 'object') {
      for (const [name, child] of Object.entries(item)) {
        const at = `${pointer}/${pointerSegment(name)}`
        children.push(
          isStorableString(name)
            ? { value: child, pointer: at }
            : { problem: { pointer: at, code: 'unstorable_string', message: 'has a name with a NUL character or a lone surrogate' } },
        )
      }
    }
    for (let index = children.length - 1; index >= 0; index--) pending.push(children[index])
  }
  return found
}

/** Validates a JSON value against a schema and turns failures into one 422 with a pointer per problem. */
export function validateBody<T>(schema: TSchema, value: unknown): T {
  const unstorable = unstorableStrings(value)
  if (unstorable.length > 0) {
    throw new ValidationError(`${unstorable[0].pointer.slice(1) || 'body'} ${unstorable[0].message}`, unstorable)
  }
  const { lengths, full } = validatorsOf(schema)
  const validator = lengths.Check(value) ? full : lengths
  if (validator.Check(value)) return value as T
  const errors: FieldProblem[] = []
  for (const error of validator.Errors(value)) {
    if (error.keyword === 'boolean') continue // the additionalProperties twin of the entry below
    if (error.keyword === 'additionalProperties') {
      for (const name of (error.params as { additionalProperties: string[] }).additionalProperties) {
        errors.push({ pointer: `${error.instancePath}/${name}`, code: 'unknown_field', message: 'is not a known field' })
      }
      continue
    }
    if (error.keyword === 'required') {
      for (const name of (error.params as { requiredProperties?: string[] }).requiredProperties ?? []) {
        errors.push({ pointer: `${error.instancePath}/${name}`, code: 'required', message: 'is required' })
      }
      continue
    }
    // One sentence per field, said from its schema: a union's branches each fail on their own.
    const pointer = error.instancePath || '/'
    if (errors.some((known) => known.pointer === pointer)) continue
    errors.push({ pointer, code: error.keyword === 'anyOf' ? 'invalid' : error.keyword, message: fieldMessage(schema, error.instancePath) })
  }
  const first = errors[0]
  throw new ValidationError(first ? `${first.pointer.slice(1) || 'body'} ${first.message}` : 'The body is invalid', errors.slice(0, 50))
}

export function defineRoutes(...definitions: (RouteDefinition | RouteDefinition[])[]): RouteDefinition[] {
  return definitions.flat()
}

/** One partial update served under both PATCH and PUT (docs/api.md section 1: PUT is a partial update too). */
export function patchAndPut(definition: Omit<RouteDefinition, 'method'>): RouteDefinition[] {
  return [
    { ...definition, method: 'PATCH' },
    { ...definition, method: 'PUT' },
  ]
}

/**
 * Refuses a caller whose token's scopes do not cover the route (403 insufficient_scope), and a
 * scoped or app token on a route for unscoped credentials only (403 forbidden).
 */
export function requireRouteScope(
  definition: Pick<RouteDefinition, 'scope' | 'credentials'>,
  caller: Pick<Caller, 'scopes' | 'oauthAppId'>,
): void {
  const needed = definition.scope ?? 'none'
  if (!scopesAllow(caller.scopes, needed)) throw new InsufficientScopeError(scopeAttribute(needed))
  if (definition.credentials === 'unscoped' && !isWholeAuthority(caller))
    throw new ForbiddenError("This needs an unscoped personal token or a browser session: a scoped token or an app's token cannot do it")
}

/**
 * What every authenticated request does once its caller is known, before its handler (in a single
 * statement, as soon as that statement answered, which saw nothing the scopes do not cover: RLS
 * applied them): the rate limit's headers, then the route's scope.
 */
export function routeCallerCheck(
  definition: Pick<RouteDefinition, 'scope' | 'credentials'>,
  res: ServerResponse,
): (caller: Caller) => void {
  return (caller) => {
    res.setHeader('RateLimit-Limit', String(caller.rateLimit.limit))
    res.setHeader('RateLimit-Remaining', String(caller.rateLimit.remaining))
    res.setHeader('RateLimit-Reset', String(caller.rateLimit.resetSeconds))
    requireRouteScope(definition, caller)
  }
}

/** An unscoped personal token or a UI session: the user's whole authority, not a part of it. */
export function isWholeAuthority(caller: Pick<Caller, 'scopes' | 'oauthAppId'>): boolean {
  return caller.scopes === null && caller.oauthAppId === null
}

/** Response fields that carry a credential (a string by one of these names): a route answering with one must declare `credentials`. */
const CREDENTIAL_FIELDS = new Set(['token', 'access_token', 'refresh_token', 'client_secret', 'challenge_token'])
/** Routes that revoke or change credentials without answering with one. */
const CREDENTIAL_PATHS = [
  /^\/api\/tokens(\/|$)/,
  /^\/api\/oauth-apps(\/|$)/,
  /^\/api\/invitations\/accept$/,
  /^\/oauth\//,
  /^\/api\/signup$/,
]

function carriesCredential(schema: unknown): boolean {
  if (Array.isArray(schema)) return schema.some(carriesCredential)
  if (schema === null || typeof schema !== 'object') return false
  const properties = (schema as { properties?: Record<string, unknown> }).properties
  if (
    properties &&
    Object.entries(properties).some(([name, field]) => CREDENTIAL_FIELDS.has(name) && (field as { type?: unknown }).type === 'string')
  )
    return true
  return Object.values(schema).some(carriesCredential)
}

/** Whether a route issues, extends, revokes or changes a credential, by its answer's schema or its path. */
export function touchesCredentials(definition: Pick<RouteDefinition, 'path' | 'response'>): boolean {
  return CREDENTIAL_PATHS.some((pattern) => pattern.test(definition.path)) || carriesCredential(definition.response)
}

/** Every route that touches a credential must say which credentials may call it: checked when the app is built. */
export function assertCredentialsDeclared(definitions: RouteDefinition[]): void {
  const missing = definitions.filter((definition) => touchesCredentials(definition) && definition.credentials === undefined)
  if (missing.length > 0)
    throw new Error(
      `routes that touch credentials without a credentials rule: ${missing.map((definition) => `${definition.method} ${definition.path}`).join(', ')}`,
    )
}

/** Every authenticated route must say which scope it needs: checked when the app is built. */
export function assertScopesDeclared(definitions: RouteDefinition[]): void {
  const missing = definitions.filter((definition) => definition.auth === 'required' && definition.scope === undefined)
  if (missing.length > 0)
    throw new Error(`routes without a scope: ${missing.map((definition) => `${definition.method} ${definition.path}`).join(', ')}`)
}
