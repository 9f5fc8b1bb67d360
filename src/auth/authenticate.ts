// Per-request authentication: one SQL call that proves the token and sets the proven request
// context, in the same statement that switches the transaction to crm_api, so everything after it
// obeys row-level security. The first request of a token runs crm.authenticate (the token, the user,
// the workspace choice, the membership and role, the rate-limit counter); its answer is cached
// (identity-cache.ts) and the token's next requests run crm.resume_identity, which proves the token
// again and that the membership's access_version is still the cached one, or answers 'stale' and
// the request runs crm.authenticate after all. A cached identity's requests are counted against the
// rate limit in this process, settled in PostgreSQL in batches (rate-limit.ts).
import type { IncomingMessage } from 'node:http'
import Type, { type Static, type TSchema } from 'typebox'
import type { Config } from '../config.ts'
import { type DatabaseTransactionConnection, pgQueryText, sql } from '../db/pool.ts'
import type { PlainStatement, StatementAuthentication, StatementWrite } from '../db/request/statement-connection.ts'
import { RUNTIME_ROLE_SETTINGS } from '../db/runtime-role.ts'
import { rowType } from '../db/typed-rows.ts'
import { AuthenticationError, NotFoundError } from '../errors.ts'
import type { Caller } from './caller.ts'
import { type CachedIdentity, IdentityCache } from './identity-cache.ts'
import { type RateQuota, type RequestRateLimit, rateLimitedError } from './rate-limit.ts'
import { hashToken, TOKEN_PATTERN } from './tokens.ts'

/** What the authenticators of one process share: the identity cache and the rate limit that lets it count. */
export type AuthenticationState = {
  identities: IdentityCache
  rateLimit: Pick<RequestRateLimit, 'admit' | 'admitCounted' | 'release'>
}

/** Authenticates a request inside its transaction (which it switches to crm_api). */
export type Authenticator = (db: DatabaseTransactionConnection, req: IncomingMessage, requestId: string) => Promise<Caller>

/** Authentication that travels inside the route's one statement (see createStatementAuthenticator). */
export type StatementAuthenticator = (req: IncomingMessage) => StatementAuthentication<Caller> & {
  /** The token's cached identity, if the process has one (not counted, not proven: a hint for choosing the path). */
  cachedCaller: () => Omit<Caller, 'via' | 'rateLimit' | 'countedIn'> | null
}

/**
 * The condition a single-statement write puts in its WHERE clause: authentication succeeded. It is
 * an uncorrelated subquery, so PostgreSQL evaluates it once, as a gate, before it scans the target
 * table (whose policies read the context authentication set); after a failed authentication the
 * write touches nothing.
 */
export const AUTHENTICATED = sql.fragment`(select request_authentication.failure is null from request_authentication)`

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
/** A bigint column: pg answers it as text, slonik's pool as a number. */
const Version = Type.Union([Type.String(), Type.Integer()])

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
    access_version: Version,
    /** The transaction holding the request's count (xid8 as text). */
    counted_in: Type.String(),
    ...RateCount,
  }),
  Type.Object({ failure: Type.String(), ...RateCount }),
])
type AuthRow = Static<typeof AuthRowSchema>
const AUTH_ROW = rowType(AuthRowSchema)

/** crm.resume_identity's answer: null, or 'stale' (nothing was set; authenticate in full). */
const ResumeRowSchema = Type.Object({ failure: Type.Union([Type.Null(), Type.Literal('stale')]), user_id: nullable(Type.String()) })
type ResumeRow = Static<typeof ResumeRowSchema>
const RESUME_ROW = rowType(ResumeRowSchema)

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

/**
 * Whether this process has authenticated the request's credential before (its identity is in the
 * cache): a hint for choosing when to read a body, never an authority, since the request's own
 * authentication proves the token again. A missing or malformed credential is not known.
 */
export function createKnownCredentialCheck(
  config: Config,
  credentialOf: (req: IncomingMessage) => Credential | null,
  state: AuthenticationState,
): (req: IncomingMessage) => boolean {
  return (req) => {
    try {
      return state.identities.get(attemptOf(config, credentialOf, req, true).cacheKey) !== undefined
    } catch {
      return false
    }
  }
}

/**
 * Requests an earlier authentication already counted against the rate limit (an upload's, before
 * its body was received), with the quota it answered: the request's next authentication resumes
 * the cached identity without counting it again.
 */
const countedRequests = new WeakMap<IncomingMessage, RateQuota>()

/** Marks a request as counted: its next authentication counts nothing (an upload counts once). */
export function markCounted(req: IncomingMessage, quota: RateQuota): void {
  countedRequests.set(req, quota)
}

type Attempt = {
  tokenHash: Buffer
  slug: string | null
  via: Credential['via']
  limit: number
  /** The request's entry in the identity cache (IdentityCache.keyOf). */
  cacheKey: string
  /** The quota an earlier authentication of this request answered when it counted it (markCounted). */
  counted?: RateQuota
}

/**
 * The token hash the known-credential check made before a body was read, which the request's
 * authentication takes instead of hashing the token again. Only that check keeps one: a request
 * without a body (GET one) is hashed once anyway and adds no entry.
 */
const hashedTokens = new WeakMap<IncomingMessage, { token: string; hash: Buffer }>()

function tokenHashOf(req: IncomingMessage, token: string, keep: boolean): Buffer {
  const known = hashedTokens.get(req)
  if (known?.token === token) return known.hash
  const hash = hashToken(token)
  if (keep) hashedTokens.set(req, { token, hash })
  return hash
}

/** Checks what can be checked without the database; the rest is crm.authenticate's job. */
function attemptOf(
  config: Config,
  credentialOf: (req: IncomingMessage) => Credential | null,
  req: IncomingMessage,
  keepHash = false,
): Attempt {
  const credential = credentialOf(req)
  if (!credential) throw new AuthenticationError('token_missing', 'Send Authorization: Bearer <token>')
  if (!TOKEN_PATTERN.test(credential.token)) throw new AuthenticationError('token_invalid', REFUSALS.token_invalid)
  const slugHeader = req.headers['x-tenant-slug']
  const slug = typeof slugHeader === 'string' && slugHeader !== '' ? slugHeader.toLowerCase() : null
  if (slug !== null && !SLUG_PATTERN.test(slug))
    throw new NotFoundError('No such workspace, or you are not a member of it', 'workspace_not_found')
  const tokenHash = tokenHashOf(req, credential.token, keepHash)
  return {
    tokenHash,
    slug,
    via: credential.via,
    limit: config.rateLimitPerMinute,
    cacheKey: IdentityCache.keyOf(tokenHash, slug, credential.via),
    counted: countedRequests.get(req),
  }
}

/**
 * The authentication call of a statement, and its values in the order of its placeholders
 * (wrapStatement checks the two agree): crm.authenticate, or crm.resume_identity for a cached
 * identity.
 */
type AuthenticationCall = {
  /**
   * Built only when the statement's text is (wrapStatement keeps texts, and a call's values are
   * enough after that): slonik built it on every read before, a fifth of what building GET one's
   * query cost (measured in a loop).
   */
  fragment: () => ReturnType<typeof sql.fragment>
  values: unknown[]
  resumes: boolean
  /** A resumed identity's user (see PlainStatement.readOnlyFor). */
  readOnlyFor?: string
}

function authenticateCall(attempt: Attempt): AuthenticationCall {
  return {
    fragment: () => sql.fragment`crm.authenticate(${sql.binary(attempt.tokenHash)}, ${attempt.slug}, ${attempt.via}, ${attempt.limit})`,
    values: [attempt.tokenHash, attempt.slug, attempt.via, attempt.limit],
    resumes: false,
  }
}

function resumeCall(attempt: Attempt, identity: CachedIdentity): AuthenticationCall {
  const follows = attempt.slug === null
  return {
    fragment: () =>
      sql.fragment`crm.resume_identity(${sql.binary(attempt.tokenHash)}, ${identity.caller.workspaceId}, ${identity.accessVersion}, ${attempt.via}, ${follows})`,
    values: [attempt.tokenHash, identity.caller.workspaceId, identity.accessVersion, attempt.via, follows],
    resumes: true,
    readOnlyFor: identity.caller.userId,
  }
}

/** A cached identity's caller for this request. */
function cachedCaller(identity: CachedIdentity, attempt: Attempt, rateLimit: RateQuota): Caller {
  return { ...identity.caller, via: attempt.via, rateLimit, countedIn: 'process' }
}

/**
 * Turns crm.authenticate's answer into the caller, or into the refusal the API answers with; an
 * admitted caller goes into the cache, and is admitted by the process's rate limit too (the
 * database's count does not see the process's unsettled requests).
 */
async function callerOf(row: AuthRow, attempt: Attempt, state?: AuthenticationState): Promise<Caller> {
  const { limit } = attempt
  const resetSeconds = row.rate_reset_seconds ?? 60
  let rateLimit = { limit, remaining: Math.max(0, limit - (row.rate_count ?? 0)), resetSeconds }
  if (row.failure === 'rate_limited') throw rateLimitedError(limit, resetSeconds)
  if (row.failure === 'workspace_not_found')
    throw new NotFoundError('No such workspace, or you are not a member of it', 'workspace_not_found')
  if (row.failure !== null) throw new AuthenticationError(row.failure, REFUSALS[row.failure] ?? 'Authentication failed')
  const identity: CachedIdentity = {
    caller: {
      userId: row.user_id,
      workspaceId: row.workspace_id,
      workspaceSlug: row.workspace_slug,
      tokenId: row.token_id,
      tokenKind: row.token_kind,
      isAdmin: row.is_admin,
      scopes: row.scopes,
      oauthAppId: row.oauth_app_id,
    },
    accessVersion: String(row.access_version),
  }
  if (state) {
    state.identities.set(attempt.cacheKey, identity)
    rateLimit = await state.rateLimit.admitCounted(row.user_id, row.rate_count ?? 0, resetSeconds, BigInt(row.counted_in))
  }
  return { ...identity.caller, via: attempt.via, rateLimit, countedIn: 'database' }
}

/** The cached identity of this request's token, counted against the rate limit unless already counted; null when not cached. */
async function admittedIdentity(
  attempt: Attempt,
  state: AuthenticationState | undefined,
): Promise<{ identity: CachedIdentity; quota: RateQuota } | null> {
  const identity = state?.identities.get(attempt.cacheKey)
  if (!state || !identity) return null
  return { identity, quota: attempt.counted ?? (await state.rateLimit.admit(identity.caller.userId)) }
}

/**
 * The one way a request authenticates, whatever carries the call: a cached identity's token runs
 * crm.resume_identity, counted by this process; any other token, or a cached one found stale, runs
 * crm.authenticate. `run` sends one authentication call (with whatever travels in the same
 * statement) and answers its authentication row and the rest of its answer.
 */
async function authenticateThrough<Rest>(
  attempt: Attempt,
  state: AuthenticationState | undefined,
  run: (call: AuthenticationCall) => Promise<{ auth: unknown; rest: Rest }>,
  onCountedFailure?: (caller: Caller) => void,
): Promise<{ caller: Caller; rest: Rest }> {
  const admitted = await admittedIdentity(attempt, state)
  let full = attempt
  if (admitted) {
    let resumed: { auth: unknown; rest: Rest }
    try {
      resumed = await run(resumeCall(attempt, admitted.identity))
    } catch (error) {
      // The process counted this request and no rollback undoes that: its caller is known.
      onCountedFailure?.(cachedCaller(admitted.identity, attempt, admitted.quota))
      throw error
    }
    if ((resumed.auth as ResumeRow).failure === null) {
      return { caller: cachedCaller(admitted.identity, attempt, admitted.quota), rest: resumed.rest }
    }
    // Stale: the call set nothing (and a statement's query saw nothing); it runs again, in full,
    // and crm.authenticate counts it, so the process's admission is taken back (for a request
    // counted already, an upload's second authentication, the one its first took).
    state?.identities.delete(attempt.cacheKey)
    state?.rateLimit.release(admitted.identity.caller.userId)
  }
  // A settlement may have carried an admission this process has since taken back: then the
  // database's total holds that request twice until the next settlement carries one less, for this
  // request and for any full authentication of the same user meanwhile (a fresh token, another
  // slug). So where the process decides (admitCounted, against the total and its own count, which
  // holds the correction), the database's own check allows one more.
  if (state) full = { ...full, limit: full.limit + 1 }
  const answer = await run(authenticateCall(full))
  return { caller: await callerOf(answer.auth as AuthRow, attempt, state), rest: answer.rest }
}

/**
 * Authentication at the start of a request transaction. Without `state` (a one-off caller such as
 * the sign-up page's) every request runs crm.authenticate.
 */
export function createAuthenticator(
  config: Config,
  credentialOf: (req: IncomingMessage) => Credential | null = bearerCredential,
  state?: AuthenticationState,
): Authenticator {
  // The role and the limits are set inside the transaction, never as startup parameters (a pooler
  // in transaction mode drops those): a connection that lost them still runs as crm_api.
  const settings = sql.fragment`set_config('role', 'crm_api', true) as role,
    set_config('statement_timeout', ${`${config.statementTimeoutMs}ms`}, true) as statement_timeout,
    set_config('idle_in_transaction_session_timeout', ${RUNTIME_ROLE_SETTINGS.idle_in_transaction_session_timeout}, true) as idle_timeout`
  return async (db, req) => {
    // A stale cached identity authenticates in full in the same transaction. A resumed identity
    // the process counted stays counted if its call fails: a long read a standby refused runs
    // again on the primary without counting twice.
    const { caller } = await authenticateThrough(
      attemptOf(config, credentialOf, req),
      state,
      async (call) => ({
        auth: call.resumes
          ? await db.one(sql.type(RESUME_ROW)`select a.*, ${settings} from ${call.fragment()} a`)
          : await db.one(sql.type(AUTH_ROW)`select a.*, ${settings} from ${call.fragment()} a`),
        rest: null,
      }),
      (counted) => markCounted(req, counted.rateLimit),
    )
    return caller
  }
}

/**
 * crm.authenticate's row as one JSON column, sent on the first row only (a page of 200 rows would
 * otherwise carry it 200 times): one CASE per row instead of one per authentication column, and one
 * column less for every row to decode (measured on the list: PostgreSQL and Node both spent time on
 * the nine null columns of every row).
 */
const AUTH_SELECT = sql.fragment`case when r.auth_row_number is null or r.auth_row_number = 1 then row_to_json(a) end as auth_row`

/**
 * The one statement of a single-statement read: authentication and the route's query (see below).
 * A query that answers one row at most (`singleRow`: a record by id) carries the authentication
 * row on that row, without the numbering window and the sort, whose set-up in the executor was
 * measured at 12 µs of a GET one's 70 µs of server time (one connection, PostgreSQL 18).
 */
function wrappedQuery(call: AuthenticationCall, query: ReturnType<typeof sql.unsafe>, singleRow: boolean) {
  if (singleRow) {
    return sql.unsafe`
    select row_to_json(a) as auth_row, r.*
    from ${call.fragment()} a
    ${singleRowAfterAuthentication(sql.fragment`(${query})`)}`
  }
  return sql.unsafe`
    select ${AUTH_SELECT}, r.*
    from ${call.fragment()} a
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
 * The one statement of a single-statement write: authentication in a CTE, the write in another
 * (data-modifying CTEs must be at the top level), gated on AUTHENTICATED; the main query reads the
 * write's row LATERAL to authentication's row, as a single-row read does (a write answers one row
 * at most). When the write matched nothing, `visibleAfterNoMatch` answers in the column
 * auth_write_visible.
 */
function wrappedWrite(call: AuthenticationCall, query: ReturnType<typeof sql.unsafe>, write: StatementWrite) {
  const visible = write.visibleAfterNoMatch
    ? sql.fragment`case when a.failure is null and r.auth_row_found is null then ${write.visibleAfterNoMatch} end`
    : sql.fragment`null::boolean`
  return sql.unsafe`
    with request_authentication as (select * from ${call.fragment()}),
    written as (${query})
    select row_to_json(a) as auth_row, ${visible} as auth_write_visible, r.*
    from request_authentication a
    ${singleRowAfterAuthentication(sql.fragment`written`)}`
}

/**
 * What follows authentication's row `a` in a single-row statement: the route's row LATERAL to it,
 * produced only when authentication succeeded, and the proof that the role is confined.
 */
function singleRowAfterAuthentication(rows: ReturnType<typeof sql.fragment>) {
  return sql.fragment`left join lateral (
      select true as auth_row_found, q.*
      from ${rows} q
      where a.failure is null
      offset 0
    ) r on true
    where (select crm.require_confined_role())`
}

/**
 * The wrapped statement's text in pg form, by the route query's text: built by slonik once per
 * text, then reused, with the values put together directly (profiled: building the wrapper with
 * slonik and renumbering its placeholders on every request cost 15-25 µs of the API process per
 * read). The texts are finitely many (see MAX_NAMED in src/db/request/statement-pool.ts), and past
 * MAX_WRAPPED_TEXTS the rest are built each time.
 */
const wrappedTexts = {
  full: { rows: new Map<string, string>(), singleRow: new Map<string, string>() },
  resumed: { rows: new Map<string, string>(), singleRow: new Map<string, string>() },
}
const MAX_WRAPPED_TEXTS = 256

function wrapStatement(
  call: AuthenticationCall,
  query: ReturnType<typeof sql.unsafe>,
  singleRow: boolean,
  write?: StatementWrite,
): PlainStatement {
  if (write) return wrapWrite(call, query, write)
  const values = [...call.values, ...query.values]
  const byShape = call.resumes ? wrappedTexts.resumed : wrappedTexts.full
  const texts = singleRow ? byShape.singleRow : byShape.rows
  let text = texts.get(query.sql)
  if (text === undefined) {
    const built = wrappedQuery(call, query, singleRow)
    // The values go in the order slonik numbered them: authentication's, then the query's.
    if (built.values.length !== values.length || built.values.some((value, index) => value !== values[index])) {
      throw new Error("an authentication call's values do not match its fragment")
    }
    text = pgQueryText(built.sql)
    if (texts.size < MAX_WRAPPED_TEXTS) texts.set(query.sql, text)
  }
  return { sql: text, values, readOnlyFor: call.readOnlyFor }
}

/**
 * A write's statement (never a read a standby could answer), by the texts of the write and of its
 * visibility check: built by slonik once per pair of texts, then reused as reads' are (measured on
 * create with its INSERT's text, src/records/operations.ts).
 */
function wrapWrite(call: AuthenticationCall, query: ReturnType<typeof sql.unsafe>, write: StatementWrite): PlainStatement {
  const visible = write.visibleAfterNoMatch
  const values = [...call.values, ...query.values, ...(visible?.values ?? [])]
  const texts = call.resumes ? wrappedWriteTexts.resumed : wrappedWriteTexts.full
  const key = visible ? `${query.sql}\n${visible.sql}` : query.sql
  let text = texts.get(key)
  if (text === undefined) {
    const built = wrappedWrite(call, query, write)
    // The values go in the order slonik numbered them: authentication's, the write's, its visibility check's.
    if (built.values.length !== values.length || built.values.some((value, index) => value !== values[index])) {
      throw new Error("a write's values do not match its wrapped statement")
    }
    text = pgQueryText(built.sql)
    if (texts.size < MAX_WRAPPED_TEXTS) texts.set(key, text)
  }
  return { sql: text, values }
}
const wrappedWriteTexts = { full: new Map<string, string>(), resumed: new Map<string, string>() }

/** The route's rows of a wrapped statement's answer, and the authentication row of its first row (every row's, for a single row). */
function unwrapRows(rows: readonly unknown[]): { auth: unknown; rows: Record<string, unknown>[]; visible: boolean | null } {
  const first = rows[0] as Record<string, unknown>
  // The route's columns, in order, named once from the first row (profiled: filtering every row's
  // entries cost more than the rest of the unwrapping for a page of 50).
  const names = Object.keys(first).filter((name) => !name.startsWith('auth_'))
  const found: Record<string, unknown>[] = []
  for (const row of rows as Record<string, unknown>[]) {
    if (row.auth_row_found !== true) continue
    const own: Record<string, unknown> = {}
    for (const name of names) own[name] = row[name]
    found.push(own)
  }
  // json comes back as its text on the statement pool (src/db/request/statement-pool.ts).
  const auth = typeof first.auth_row === 'string' ? JSON.parse(first.auth_row) : first.auth_row
  return { auth, rows: found, visible: (first.auth_write_visible as boolean | null | undefined) ?? null }
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
  state?: AuthenticationState,
): StatementAuthenticator {
  return (req) => {
    const attempt = attemptOf(config, credentialOf, req)
    let countedBeforeFailure: Caller | null = null
    return {
      send: async (query, run, { singleRow, write }) => {
        // A stale cached identity's statement runs again, in full, as a second statement.
        const { caller, rest } = await authenticateThrough(
          attempt,
          state,
          async (call) => {
            const answer = unwrapRows(await run(wrapStatement(call, query, singleRow, write)))
            return { auth: answer.auth, rest: answer }
          },
          (caller) => {
            countedBeforeFailure = caller
          },
        )
        return { caller, rows: rest.rows, visible: rest.visible }
      },
      cachedCaller: () => state?.identities.get(attempt.cacheKey)?.caller ?? null,
      callerCountedBeforeFailure: () => countedBeforeFailure,
    }
  }
}
