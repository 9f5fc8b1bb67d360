// Per-request authentication: one SQL call (crm.authenticate) that checks the token and the user,
// chooses the workspace, counts the rate limit, and sets the proven request context; the same
// statement switches the transaction to crm_api, so everything after it obeys row-level security.
import type { IncomingMessage } from 'node:http'
import Type, { type Static, type TSchema } from 'typebox'
import type { Config } from '../config.ts'
import { type DatabaseTransactionConnection, pgQueryText, sql } from '../db/pool.ts'
import { RUNTIME_ROLE_SETTINGS } from '../db/runtime-role.ts'
import { rowType } from '../db/typed-rows.ts'
import { AuthenticationError, NotFoundError, RateLimitedError } from '../errors.ts'
import { hashToken, TOKEN_PATTERN } from './tokens.ts'

/** Who is calling, as decided by crm.authenticate in the request transaction. */
export type Caller = {
  userId: string
  workspaceId: string
  workspaceSlug: string
  tokenId: string
  tokenKind: 'token' | 'session' | 'oauth'
  /** The role's admin flag (admin routes also need the scope of their area when the token is scoped). */
  isAdmin: boolean
  /** The token's scopes, or null for a token that acts with the whole role (API.md section 4a). */
  scopes: string[] | null
  /** The OAuth app an access token (kind oauth) was issued to, else null. */
  oauthAppId: string | null
  via: 'api' | 'ui'
  rateLimit: { limit: number; remaining: number; resetSeconds: number }
}

/** Authenticates a request inside its transaction (which it switches to crm_api). */
export type Authenticator = (db: DatabaseTransactionConnection, req: IncomingMessage, requestId: string) => Promise<Caller>

/** Authentication that travels inside the route's one statement (see createStatementAuthenticator). */
export type StatementAuthenticator = (req: IncomingMessage) => {
  /** The statement in plain pg form ($1, $2, ...), ready for the statement pool. */
  wrap: (query: ReturnType<typeof sql.unsafe>) => { sql: string; values: readonly unknown[] }
  unwrap: (rows: readonly unknown[]) => { caller: Caller; rows: Record<string, unknown>[] }
}

const SLUG_PATTERN = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/

const REFUSALS: Record<string, string> = {
  token_invalid: 'The token is not valid',
  token_revoked: 'The token was revoked',
  token_expired: 'The token has expired',
  user_suspended: 'The user is suspended',
  api_access_disabled: 'API access is turned off for this user',
}

const nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()])
const RateCount = { rate_count: nullable(Type.Integer()), rate_reset_seconds: nullable(Type.Integer()) }

/** crm.authenticate's answer: the caller, or a failure (the API code) with what is known. */
const AuthRowSchema = Type.Union([
  Type.Object({
    failure: Type.Null(),
    user_id: Type.String(),
    workspace_id: Type.String(),
    workspace_slug: Type.String(),
    token_id: Type.String(),
    token_kind: Type.Union([Type.Literal('token'), Type.Literal('session'), Type.Literal('oauth')]),
    is_admin: Type.Boolean(),
    scopes: nullable(Type.Array(Type.String())),
    oauth_app_id: nullable(Type.String()),
    ...RateCount,
  }),
  Type.Object({ failure: Type.String(), ...RateCount }),
])
type AuthRow = Static<typeof AuthRowSchema>
const AUTH_ROW = rowType(AuthRowSchema)

export type Credential = { token: string; via: 'api' | 'ui' }

/** The bearer token of a request; the UI adds its session cookie as another source. */
export function bearerCredential(req: IncomingMessage): Credential | null {
  const header = req.headers.authorization
  if (!header) return null
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header)
  if (!match) throw new AuthenticationError('token_invalid', 'Send Authorization: Bearer <token>')
  return { token: match[1], via: 'api' }
}

/**
 * Refuses a request without a well-formed credential (401) from its headers alone, so an
 * anonymous client never gets its body read, parsed or validated.
 */
export function createCredentialCheck(
  credentialOf: (req: IncomingMessage) => Credential | null = bearerCredential,
): (req: IncomingMessage) => void {
  return (req) => {
    const credential = credentialOf(req)
    if (!credential) throw new AuthenticationError('token_missing', 'Send Authorization: Bearer <token>')
    if (!TOKEN_PATTERN.test(credential.token)) throw new AuthenticationError('token_invalid', REFUSALS.token_invalid)
  }
}

type Attempt = { tokenHash: Buffer; slug: string | null; via: Credential['via']; limit: number }

/** Checks what can be checked without the database; the rest is crm.authenticate's job. */
function attemptOf(config: Config, credentialOf: (req: IncomingMessage) => Credential | null, req: IncomingMessage): Attempt {
  const credential = credentialOf(req)
  if (!credential) throw new AuthenticationError('token_missing', 'Send Authorization: Bearer <token>')
  if (!TOKEN_PATTERN.test(credential.token)) throw new AuthenticationError('token_invalid', REFUSALS.token_invalid)
  const slugHeader = req.headers['x-tenant-slug']
  const slug = typeof slugHeader === 'string' && slugHeader !== '' ? slugHeader.toLowerCase() : null
  if (slug !== null && !SLUG_PATTERN.test(slug))
    throw new NotFoundError('No such workspace, or you are not a member of it', 'workspace_not_found')
  return { tokenHash: hashToken(credential.token), slug, via: credential.via, limit: config.rateLimitPerMinute }
}

function authenticateCall(attempt: Attempt) {
  return sql.fragment`crm.authenticate(${sql.binary(attempt.tokenHash)}, ${attempt.slug}, ${attempt.via}, ${attempt.limit})`
}

/** authenticateCall's values, in its order (wrapStatement checks the two agree). */
function authenticateValues(attempt: Attempt): unknown[] {
  return [attempt.tokenHash, attempt.slug, attempt.via, attempt.limit]
}

/** Turns crm.authenticate's answer into the caller, or into the refusal the API answers with. */
function callerOf(row: AuthRow, attempt: Attempt): Caller {
  const { limit } = attempt
  const resetSeconds = row.rate_reset_seconds ?? 60
  const rateLimit = { limit, remaining: Math.max(0, limit - (row.rate_count ?? 0)), resetSeconds }
  if (row.failure === 'rate_limited') {
    throw new RateLimitedError(resetSeconds, 'rate_limited', `More than ${limit} requests in this minute`, {
      limit,
      remaining: 0,
      resetSeconds,
    })
  }
  if (row.failure === 'workspace_not_found')
    throw new NotFoundError('No such workspace, or you are not a member of it', 'workspace_not_found')
  if (row.failure !== null) throw new AuthenticationError(row.failure, REFUSALS[row.failure] ?? 'Authentication failed')
  return {
    userId: row.user_id,
    workspaceId: row.workspace_id,
    workspaceSlug: row.workspace_slug,
    tokenId: row.token_id,
    tokenKind: row.token_kind,
    isAdmin: row.is_admin,
    scopes: row.scopes,
    oauthAppId: row.oauth_app_id,
    via: attempt.via,
    rateLimit,
  }
}

export function createAuthenticator(
  config: Config,
  credentialOf: (req: IncomingMessage) => Credential | null = bearerCredential,
): Authenticator {
  return async (db, req) => {
    const attempt = attemptOf(config, credentialOf, req)
    // The role and the limits are set inside the transaction, never as startup parameters (a
    // pooler in transaction mode drops those): a connection that lost them still runs as crm_api.
    const row = await db.one(sql.type(AUTH_ROW)`
      select a.*, set_config('role', 'crm_api', true) as role,
        set_config('statement_timeout', ${`${config.statementTimeoutMs}ms`}, true) as statement_timeout,
        set_config('idle_in_transaction_session_timeout', ${RUNTIME_ROLE_SETTINGS.idle_in_transaction_session_timeout}, true) as idle_timeout
      from ${authenticateCall(attempt)} a
    `)
    return callerOf(row, attempt)
  }
}

/**
 * crm.authenticate's row as one JSON column, sent on the first row only (a page of 200 rows would
 * otherwise carry it 200 times): one CASE per row instead of one per authentication column, and one
 * column less for every row to decode (measured on the list: PostgreSQL and Node both spent time on
 * the nine null columns of every row).
 */
const AUTH_SELECT = sql.fragment`case when r.auth_row_number is null or r.auth_row_number = 1 then row_to_json(a) end as auth_row`

/** The one statement of a single-statement read: authentication and the route's query (see below). */
function wrappedQuery(attempt: Attempt, query: ReturnType<typeof sql.unsafe>) {
  return sql.unsafe`
    select ${AUTH_SELECT}, r.*
    from ${authenticateCall(attempt)} a
    left join lateral (
      select true as auth_row_found, row_number() over () as auth_row_number, q.*
      from (${query}) q
      where a.failure is null
      offset 0
    ) r on true
    where (select crm.require_confined_role())
    order by r.auth_row_number`
}

/**
 * The wrapped statement's text in pg form, by the route query's text: built by slonik once per
 * text, then reused, with the values put together directly (profiled: building the wrapper with
 * slonik and renumbering its placeholders on every request cost 15-25 µs of the API process per
 * read). The texts are finitely many (see MAX_NAMED in src/http/single-statement.ts), and past
 * MAX_WRAPPED_TEXTS the rest are built each time.
 */
const wrappedTexts = new Map<string, string>()
const MAX_WRAPPED_TEXTS = 256

function wrapStatement(attempt: Attempt, query: ReturnType<typeof sql.unsafe>): { sql: string; values: readonly unknown[] } {
  const values = [...authenticateValues(attempt), ...query.values]
  let text = wrappedTexts.get(query.sql)
  if (text === undefined) {
    const built = wrappedQuery(attempt, query)
    // The values go in the order slonik numbered them: authentication's, then the query's.
    if (built.values.length !== values.length || built.values.some((value, index) => value !== values[index])) {
      throw new Error('authenticateValues does not match authenticateCall')
    }
    text = pgQueryText(built.sql)
    if (wrappedTexts.size < MAX_WRAPPED_TEXTS) wrappedTexts.set(query.sql, text)
  }
  return { sql: text, values }
}

/**
 * A read that is one statement: crm.authenticate and the route's query travel together, with no
 * BEGIN or COMMIT, so a read costs one round trip like a bare query does. It runs as the
 * connection's login role, the runtime role with crm_api's privileges (row-level security is
 * decided when a statement is planned, so the role cannot be switched inside the statement that
 * reads); the statement proves that role confined first (crm.require_confined_role, a one-time
 * filter evaluated before anything else) and refuses to run otherwise. The route's query is
 * a LATERAL subquery that references crm.authenticate's row, so PostgreSQL must run
 * crm.authenticate first (it sets the proven context) and the query after it; when
 * authentication fails the query does not run at all. Were the order ever different, the policy
 * helpers would find no context and the query would see nothing: it fails closed.
 */
export function createStatementAuthenticator(
  config: Config,
  credentialOf: (req: IncomingMessage) => Credential | null = bearerCredential,
): StatementAuthenticator {
  return (req) => {
    const attempt = attemptOf(config, credentialOf, req)
    return {
      wrap: (query) => wrapStatement(attempt, query),
      unwrap: (rows) => {
        const first = rows[0] as Record<string, unknown>
        const caller = callerOf(first.auth_row as AuthRow, attempt)
        // The route's columns, in order, named once from the first row (profiled: filtering every
        // row's entries cost more than the rest of the unwrapping for a page of 50).
        const names = Object.keys(first).filter((name) => !name.startsWith('auth_'))
        const found: Record<string, unknown>[] = []
        for (const row of rows as Record<string, unknown>[]) {
          if (row.auth_row_found !== true) continue
          const own: Record<string, unknown> = {}
          for (const name of names) own[name] = row[name]
          found.push(own)
        }
        return { caller, rows: found }
      },
    }
  }
}
