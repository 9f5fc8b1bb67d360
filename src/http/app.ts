// The HTTP layer: request ids, one log line per request, body limits, validation, the request
// transaction, and the single place that turns errors into problem+json answers.
import { randomUUID } from 'node:crypto'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import polka from 'polka'
import { type Authenticator, markCounted, type StatementAuthenticator } from '../auth/authenticate.ts'
import type { Caller } from '../auth/caller.ts'
import { databaseErrorOf } from '../db/database-errors.ts'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { type LongReadStandby, StandbyRefusedError } from '../db/read-replicas.ts'
import type { StatementPool } from '../db/statement-pool.ts'
import { ClientWentAwayError, CrmError, NotFoundError, RateLimitedError, UnavailableError } from '../errors.ts'
import { createAdmissionGate } from './admission.ts'
import { bodyDeadlineMs, CSV_BODY_LIMIT, JSON_BODY_LIMIT, type ReceivedFile, readJsonObject, receiveBodyFile } from './body.ts'
import { identifyClient } from './client-address.ts'
import { answerClientError } from './client-error.ts'
import { type ApiError, problemBody, toApiError } from './problem.ts'
import {
  assertCredentialsDeclared,
  assertScopesDeclared,
  JsonText,
  type RouteContext,
  type RouteDefinition,
  type RouteResult,
  requireRouteScope,
  type Services,
  validateBody,
} from './route.ts'
import { indexRoutes, type Router } from './route-index.ts'
import { SingleStatementConnection } from './single-statement.ts'
import { createBodyReceipts, createUploadReceipts } from './upload-receipts.ts'
import { createStreamSlots, createWorkspaceSlots } from './workspace-slots.ts'

const SANE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/
/** SQLSTATE of a write in a read-only transaction. */
const READ_ONLY_SQL_TRANSACTION = '25006'

/** A read-only transaction's authentication found no current cached identity to resume (app.ts, streamOnPrimary). */
class IdentityMovedError extends Error {
  constructor(cause: unknown) {
    super("The request's identity moved after its short authenticating transaction", { cause })
    this.name = 'IdentityMovedError'
  }
}

type Request = IncomingMessage & {
  params: Record<string, string>
  query: Record<string, string | string[]>
  path: string
  requestId: string
  callerId?: string
  /** The request was counted by crm.authenticate in its transaction (see Caller.countedIn). */
  countedInDatabase?: boolean
  /** A short transaction of its own authenticated and counted the request already (authenticateFirst). */
  authenticatedFirst?: boolean
}

export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string | undefined> = {},
  contentType = 'application/json; charset=utf-8',
): void {
  if (res.headersSent) return
  const text = body === undefined ? '' : body instanceof JsonText ? body.text : JSON.stringify(body)
  res.statusCode = status
  for (const [name, value] of Object.entries(headers)) if (value !== undefined) res.setHeader(name, value)
  if (status !== 204 && status !== 304) {
    res.setHeader('Content-Type', contentType)
    res.setHeader('Content-Length', Buffer.byteLength(text))
    res.end(text)
  } else {
    res.end()
  }
}

export function sendProblem(res: ServerResponse, error: ApiError, requestId: string): void {
  if (res.headersSent) {
    // A stream already started: the only honest signal left is to cut the connection.
    res.destroy(error)
    return
  }
  for (const name of res.getHeaderNames()) if (!name.startsWith('ratelimit-') && name !== 'x-request-id') res.removeHeader(name)
  sendJson(res, error.status, problemBody(error, requestId), error.headers ?? {}, 'application/problem+json')
}

export type App = { server: Server; handler: (req: IncomingMessage, res: ServerResponse) => void }

export function createApp(
  services: Services,
  definitions: RouteDefinition[],
  authenticate: Authenticator,
  extra: {
    pages?: (app: ReturnType<typeof polka>) => void
    statements?: { authenticate: StatementAuthenticator; pool: StatementPool }
    /** Refuses a missing or malformed credential from the headers, before the body is read. */
    checkCredential?: (req: IncomingMessage) => void
    /**
     * Whether the process has proven the request's credential before (its identity is cached): a
     * hint, which the request's own authentication proves again. Without it, every credential is
     * unknown, and its body is read only after a short authenticating transaction.
     */
    knownCredential?: (req: IncomingMessage) => boolean
  } = {},
): App {
  const { logger, pool, config } = services
  assertScopesDeclared(definitions)
  assertCredentialsDeclared(definitions)
  const admission = createAdmissionGate(config.dbPoolSize, config.dbWaitMs)
  const workspaceSlots = createWorkspaceSlots()
  const uploadReceipts = createUploadReceipts(config.uploads)
  // The bodies of proven callers have receipts of their own: anonymous bodies (sign-in, forms,
  // services.bodyReceipts) cannot fill them, and an unproven token's body takes none.
  const callerBodyReceipts = createBodyReceipts(config.jsonBodies, 'request bodies')
  const streamSlots = createStreamSlots(config.streamsPerProcess)
  let singleStatementsRefused = false

  const onError = (error: unknown, req: IncomingMessage, res: ServerResponse) => {
    const request = req as Request
    if (error instanceof ClientWentAwayError) {
      logger.info('client went away', { request_id: request.requestId, method: req.method, path: request.path, reason: error.message })
      res.destroy()
      return
    }
    const apiError = toApiError(error)
    if (apiError.status >= 500) {
      const cause = apiError.cause ?? error
      logger.error('request failed', {
        request_id: request.requestId,
        method: req.method,
        path: request.path,
        error: cause instanceof Error ? `${cause.name}: ${cause.message}` : String(cause),
        stack: cause instanceof Error && apiError.status === 500 ? cause.stack : undefined,
      })
    }
    sendProblem(res, apiError, request.requestId)
  }

  const app = polka({
    onError: (error: unknown, req: IncomingMessage, res: ServerResponse) => onError(error, req, res),
    onNoMatch: (req: IncomingMessage, res: ServerResponse) =>
      onError(new NotFoundError(`No route for ${req.method} ${(req as Request).path}`), req, res),
  })

  app.use((req: IncomingMessage, res: ServerResponse, next: () => void) => {
    const request = req as Request
    const started = performance.now()
    const given = req.headers['x-request-id']
    request.requestId = typeof given === 'string' && SANE_REQUEST_ID.test(given) ? given : randomUUID()
    res.setHeader('X-Request-Id', request.requestId)
    identifyClient(req, config.trustProxy)
    res.on('finish', () => {
      logger.info('request', {
        method: req.method,
        path: request.path,
        status: res.statusCode,
        ms: Math.round((performance.now() - started) * 10) / 10,
        request_id: request.requestId,
        user_id: request.callerId,
      })
    })
    next()
  })

  for (const definition of definitions) {
    const method = definition.method.toLowerCase() as 'get' | 'post' | 'put' | 'patch' | 'delete'
    app[method](definition.path, (req: IncomingMessage, res: ServerResponse) => runRoute(definition, req as Request, res))
  }
  extra.pages?.(app)
  indexRoutes(app as unknown as Router)

  async function runRoute(definition: RouteDefinition, req: Request, res: ServerResponse): Promise<void> {
    // An anonymous client is refused before its body is read; the body is read whole, under its
    // limit and deadlines (body.ts), before a connection is taken, so a slow client never holds one.
    if (definition.auth === 'required') extra.checkCredential?.(req)
    if (definition.limitedPerAddress) services.addressRateLimit(req)
    definition.checkBodyHeaders?.(req)
    let body: unknown
    if (definition.body && definition.bodyKind !== 'file') {
      // A token the process has not proven before is authenticated first, in a short transaction of
      // its own, so a body with a made-up token is refused (401) without a byte of it read, and
      // takes no receipt that real callers need. A known token's body is read at once: its request
      // stays one transaction (or one statement).
      const byCaller = definition.auth === 'required'
      if (byCaller && !extra.knownCredential?.(req)) await authenticateFirst(definition, req, res)
      // Held while the body arrives: slow senders are bounded per address and in all.
      const releaseReceipt = (byCaller ? callerBodyReceipts : services.bodyReceipts).take(req)
      try {
        body = validateBody(definition.body, await readJsonObject(req, config.bodyIdleTimeoutMs))
      } finally {
        releaseReceipt()
      }
    }
    const upload = definition.bodyKind === 'file' ? await receiveUpload(definition, req, res) : undefined
    const base = { req, res, requestId: req.requestId, params: req.params, query: req.query, body, bodyFile: upload?.file, services }
    let result: RouteResult
    try {
      result = await runHandler(definition, req, res, base)
    } finally {
      // Removed before the answer goes out, so a client that has its answer finds nothing left.
      await upload?.file.remove()
      upload?.release()
    }
    if (definition.streams) return
    const status = result?.status ?? definition.status ?? 200
    sendJson(res, status, status === 204 ? undefined : result?.body, result?.headers)
  }

  /**
   * A file body is received only for a caller already proven who holds the workspace's slot. First
   * a receipt (per address and per process, upload-receipts.ts), so one address cannot make the
   * database authenticate more uploads at once than its bound; then a short transaction of its own
   * authenticates, checks the route's grant and takes the slot; only then is the body written to a
   * temporary file, under the process's cap on such files, with no connection held while it
   * arrives. An unknown, expired or revoked token gets its 401 with nothing received. The
   * handler's transaction authenticates again, so a token revoked during a long upload is refused
   * then, without counting the request a second time (markCounted). The slot and the receipt are
   * held until the answer.
   */
  async function receiveUpload(
    definition: RouteDefinition,
    req: Request,
    res: ServerResponse,
  ): Promise<{ file: ReceivedFile; release: () => void }> {
    const receipt = uploadReceipts.take(req)
    let releaseSlot: (() => void) | undefined
    const release = () => {
      receipt.release()
      releaseSlot?.()
    }
    try {
      if (definition.auth === 'required') {
        await authenticateFirst(definition, req, res, async (db, caller) => {
          await definition.checkCallerBeforeBody?.(db)
          if (definition.limitedPerWorkspace) releaseSlot = workspaceSlots.take(definition.limitedPerWorkspace, caller.workspaceId)
        })
      }
      receipt.checkDeclaredLength()
      const file = await receiveBodyFile(req, definition.fileLimit ?? JSON_BODY_LIMIT, config.bodyIdleTimeoutMs, receipt)
      return { file, release }
    } catch (error) {
      release()
      throw error
    }
  }

  /**
   * Authenticates and counts the request in a short transaction of its own, before its body is read
   * or its long read begins: crm.authenticate's bookkeeping (the token's last use, the user's last
   * workspace) and the count are committed with it, and the identity is cached. The request's own
   * transaction then resumes that identity without counting it again (markCounted); `check` runs in
   * the short transaction, as crm_api with the caller's context.
   */
  async function authenticateFirst(
    definition: RouteDefinition,
    req: Request,
    res: ServerResponse,
    check?: (db: DatabaseTransactionConnection, caller: Caller) => Promise<void>,
  ): Promise<void> {
    await admitted(req, () => authenticateAhead(definition, req, res, check))
  }

  /** authenticateFirst for a request already admitted to the pool. */
  async function authenticateAhead(
    definition: RouteDefinition,
    req: Request,
    res: ServerResponse,
    check?: (db: DatabaseTransactionConnection, caller: Caller) => Promise<void>,
  ): Promise<void> {
    await authenticatedTransaction(definition, req, res, async (db, caller) => {
      await check?.(db, caller)
      markCounted(req, caller.rateLimit)
    })
    // Committed, and with it the request's count: a rollback of the handler's transaction leaves it.
    req.countedInDatabase = false
    req.authenticatedFirst = true
  }

  /** What every authenticated request does once its caller is known: bookkeeping, headers, the route's scope. */
  function authenticated(definition: RouteDefinition, req: Request, res: ServerResponse, caller: Caller): void {
    req.callerId = caller.userId
    req.countedInDatabase = caller.countedIn === 'database'
    res.setHeader('RateLimit-Limit', String(caller.rateLimit.limit))
    res.setHeader('RateLimit-Remaining', String(caller.rateLimit.remaining))
    res.setHeader('RateLimit-Reset', String(caller.rateLimit.resetSeconds))
    // Before the handler in a transaction; in a single-statement read, as soon as its one
    // statement answers (which saw nothing the scopes do not cover: RLS applied them).
    requireRouteScope(definition, caller)
  }

  /**
   * A request transaction: authentication first, then `work` as crm_api with the caller's context.
   * A stream's transaction is read-only (`readOnly`): it has no transaction id, so however long its
   * client takes to read, it holds no row lock that a revocation, a suspension or the token's other
   * requests could wait for. Its request was authenticated first (authenticateAhead), so it only
   * resumes the cached identity, which writes nothing there (sql/000034); when that identity is no
   * longer cached or current, IdentityMovedError.
   */
  function authenticatedTransaction<T>(
    definition: RouteDefinition,
    req: Request,
    res: ServerResponse,
    work: (db: DatabaseTransactionConnection, caller: Caller) => Promise<T>,
    readOnly = false,
  ): Promise<T> {
    return pool.transaction(async (db) => {
      if (readOnly) await db.query(sql.unsafe`set transaction read only`)
      const caller = await authenticate(db, req, req.requestId).catch((error: unknown) => {
        // A full authentication cannot write its count in a read-only transaction.
        if (readOnly && databaseErrorOf(error)?.code === READ_ONLY_SQL_TRANSACTION) throw new IdentityMovedError(error)
        throw error
      })
      authenticated(definition, req, res, caller)
      return work(db, caller)
    })
  }

  /** Runs database work behind the admission gate. */
  function admitted<T>(req: Request, run: () => Promise<T>): Promise<T> {
    return admission.run(run).catch(async (error: unknown) => {
      // The rollback took crm.authenticate's count with it: count the request again, outside
      // (unless the refusal is the rate limit itself, or the process counted it).
      if (req.callerId && req.countedInDatabase && !(error instanceof RateLimitedError && error.quota)) {
        await pool.query(sql.unsafe`select crm.count_request(${req.callerId})`).catch(() => {})
      }
      throw error
    })
  }

  /**
   * A long read (an export) in a transaction on a streaming standby. Only a cached identity's
   * authentication may run there (crm.resume_identity writes nothing), and only for a user whose
   * last write the standby had replayed before the transaction began: any failure of
   * authentication there, a refused bookkeeping write included, is a refusal of the standby, and
   * the caller runs the read on the primary. A failure after the answer began cuts the response
   * (sendProblem), which the client sees as a failed transfer; it is logged with the standby.
   */
  async function longReadOn<T>(
    standby: LongReadStandby,
    definition: RouteDefinition,
    req: Request,
    res: ServerResponse,
    handle: (db: DatabaseTransactionConnection, caller: Caller) => Promise<T>,
  ): Promise<T> {
    try {
      return await standby.transaction(async (db) => {
        const caller = await authenticate(db, req, req.requestId).catch((error: unknown) => {
          throw new StandbyRefusedError(`authentication on the standby: ${(error as Error).message}`, { cause: error })
        })
        // Counted by the process: if the primary runs it instead, it is not counted again.
        if (caller.countedIn === 'process') markCounted(req, caller.rateLimit)
        if (caller.countedIn !== 'process' || !standby.admits(caller.userId)) {
          throw new StandbyRefusedError("the standby is not known to have replayed the user's last write within the cap")
        }
        authenticated(definition, req, res, caller)
        const answered = await handle(db, caller)
        // Counted as the answer ends, before the commit's round trip.
        standby.served()
        return answered
      })
    } catch (error) {
      // The route's own refusal (a 403, a 422) is the standby's answer.
      if (error instanceof CrmError) standby.served()
      else if (!(error instanceof ClientWentAwayError)) standby.failed()
      if (res.headersSent && !(error instanceof ClientWentAwayError)) {
        logger.warn('a long read on a standby failed after its answer began: the response is cut', {
          request_id: req.requestId,
          replica: standby.label,
          error: error instanceof Error ? error.message : String(error),
        })
      }
      throw error
    }
  }

  async function runHandler(
    definition: RouteDefinition,
    req: Request,
    res: ServerResponse,
    base: Omit<RouteContext, 'db' | 'caller'>,
  ): Promise<RouteResult> {
    const statements = singleStatementsRefused ? undefined : extra.statements
    const handle = async (db: DatabaseTransactionConnection, caller: Caller) => {
      // The workspace's own slot first (429: its quota), then the process's stream slot (503).
      // A file route took its workspace slot before its body was received (receiveUpload).
      const releases: (() => void)[] = []
      try {
        if (definition.limitedPerWorkspace && definition.bodyKind !== 'file') {
          releases.push(workspaceSlots.take(definition.limitedPerWorkspace, caller.workspaceId))
        }
        if (definition.streams) releases.push(streamSlots.take())
        return await definition.handler({ ...base, db, caller } as RouteContext)
      } finally {
        for (const release of releases) release()
      }
    }
    // A stream on the primary writes its request's bookkeeping and count in a short transaction
    // first, so that its long read's transaction can be read-only (authenticatedTransaction). The
    // identity may move in between (a revocation, a role change, a standby that found it stale and
    // dropped it): then once more, and the second short transaction meets the change.
    const streamOnPrimary = async (): Promise<RouteResult> => {
      for (let attempt = 0; ; attempt++) {
        if (!req.authenticatedFirst || attempt > 0) await authenticateAhead(definition, req, res)
        try {
          return await authenticatedTransaction(definition, req, res, handle, true)
        } catch (error) {
          if (!(error instanceof IdentityMovedError)) throw error
          if (attempt > 0) throw new UnavailableError(error, 'Your access changed as the request began; retry it')
        }
      }
    }
    const inTransaction = async () => {
      if (definition.streams && definition.auth === 'required') return streamOnPrimary()
      const result = await authenticatedTransaction(definition, req, res, handle)
      // Committed: before the answer, the user's reads are held to this write's WAL position, so
      // a standby that has not replayed it does not answer them (src/db/read-replicas.ts).
      if (definition.method !== 'GET' && !definition.longRead && req.callerId) await services.readRouting?.noteWrite(req.callerId)
      return result
    }
    const standby = definition.longRead ? services.readRouting?.standbyForLongRead() : null
    if (standby) {
      return admitted(req, () =>
        longReadOn(standby, definition, req, res, handle).catch((error: unknown) => {
          // The standby failed it before anything was sent: the primary runs it, and the client
          // sees nothing of it. An answer of the route itself (a 403, a 422) stands.
          if (res.headersSent || error instanceof CrmError) throw error
          logger.info('a long read was left to the primary', {
            request_id: req.requestId,
            replica: standby.label,
            reason: error instanceof Error ? error.message : String(error),
          })
          return inTransaction()
        }),
      )
    }
    if (definition.auth === 'none') return definition.handler(base as unknown as RouteContext)
    return admitted(req, () => {
      const writes = config.writesInOneStatement && definition.writesInOneStatement?.(req) === true
      const authentication = statements && (definition.singleStatement || writes) ? statements.authenticate(req) : null
      if (statements && authentication && (definition.singleStatement || mayWriteInOneStatement(definition, authentication))) {
        const db = new SingleStatementConnection(statements.pool, authentication, (caller) => {
          try {
            authenticated(definition, req, res, caller)
          } finally {
            // The statement committed (or, before a failure, the process counted it): nothing to count again.
            req.countedInDatabase = false
          }
        })
        const handled = definition.handler(db.contextFor(base)).catch(async (error: unknown) => {
          // The read's connection is not confined by row-level security (a pooler that
          // dropped its role, a wrong RUNTIME_DATABASE_URL): the statement refused to run
          // and changed nothing. Reads go through request transactions from now on,
          // which switch to crm_api themselves.
          if (refusedAsUnconfined(error)) {
            singleStatementsRefused = true
            logger.error(
              'single-statement reads refused to run: their connection is not confined by row-level security; reads use transactions instead',
              { error: (error as Error).message },
            )
            return inTransaction()
          }
          await db.authenticateAfterFailure()
          throw error
        })
        if (definition.singleStatement) return handled
        // Committed: the user's reads are held to this write's WAL position, as after a transaction.
        return handled.then(async (result) => {
          if (req.callerId) await services.readRouting?.noteWrite(req.callerId)
          return result
        })
      }
      return inTransaction()
    })
  }

  const handler = (req: IncomingMessage, res: ServerResponse) => app.handler(req as never, res, undefined as never)
  const server = createServer(handler)
  // Node's own limit on receiving a whole request (300 s by default) would cut a slow but steady
  // 50 MiB upload short with a bare 408; body.ts's deadlines decide, and this stays behind them.
  server.requestTimeout = bodyDeadlineMs(CSV_BODY_LIMIT, config.bodyIdleTimeoutMs) + 60_000
  // An idle keep-alive connection is closed by the client or its proxy, not here first: Node's 5 s
  // would race with the next request a client sends on it at that moment (the client reads a
  // reset, a proxy answers 502). Proxies keep idle upstream connections up to 60 s; clients whose
  // timers run late on a loaded machine reused them past 5 s (fetch failed with ECONNRESET).
  server.keepAliveTimeout = 65_000
  server.on('clientError', answerClientError)
  return { server, handler }
}

/**
 * A write goes in one statement only for a token whose identity the process has cached and whose
 * scopes allow the route: the route's scope is checked before anything is written (a transaction
 * checks it after authenticating, before its handler runs; one statement cannot stop between the
 * two). A token's scopes never change, so the cached ones decide. A request the scopes refuse takes
 * a transaction (which answers 403 insufficient_scope); the first request of a token with a body was
 * authenticated, and its scope checked, in a short transaction before its body was read.
 */
function mayWriteInOneStatement(definition: RouteDefinition, authentication: ReturnType<StatementAuthenticator>): boolean {
  const cached = authentication.cachedCaller()
  if (!cached) return false
  try {
    requireRouteScope(definition, cached)
    return true
  } catch {
    return false
  }
}

/** crm.require_confined_role's refusal (sql/000009_least_privilege.sql). */
function refusedAsUnconfined(error: unknown): boolean {
  const fields = databaseErrorOf(error)
  return fields?.code === '42501' && fields.hint === 'role_not_confined'
}
