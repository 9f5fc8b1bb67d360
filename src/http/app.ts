// The HTTP layer's app: every route registered with polka, each request's id and log line, its
// body received before a connection is taken (route-body.ts), and its handler run on the request's
// database (src/db/request/): in a request transaction, in one statement with its authentication,
// or as a long read on a standby. Errors become problem+json answers in one place (errorAnswerer).
import { randomUUID } from 'node:crypto'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import polka from 'polka'
import { type Authenticator, markCounted, type StatementAuthenticator } from '../auth/authenticate.ts'
import type { Caller } from '../auth/caller.ts'
import type { DatabaseTransactionConnection } from '../db/pool.ts'
import { type DatabaseRequest, RequestDatabase } from '../db/request/request-database.ts'
import type { StatementPool } from '../db/request/statement-pool.ts'
import { ClientWentAwayError, CrmError, NotFoundError, UnavailableError } from '../errors.ts'
import type { Logger } from '../log.ts'
import type { FeedListener } from '../webhooks/feed-listener.ts'
import { bodyDeadlineMs, CSV_BODY_LIMIT } from './body.ts'
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
  routeCallerCheck,
  type Services,
} from './route.ts'
import { createRouteBodies, type ReceivedBody } from './route-body.ts'
import { indexRoutes, type Router } from './route-index.ts'
import { createStreamSlots, takeRouteSlots } from './workspace-slots.ts'

const NO_BODY: ReceivedBody = { body: undefined }

type Request = DatabaseRequest & { params: Record<string, string>; query: Record<string, string | string[]>; path: string }

export type App = { server: Server; handler: (req: IncomingMessage, res: ServerResponse) => void }

/** A browser's GET or HEAD for a page: outside /api/, asking for HTML. API clients keep problem+json. */
function wantsPage(req: IncomingMessage): boolean {
  const path = (req as Request).path ?? req.url ?? ''
  return (
    (req.method === 'GET' || req.method === 'HEAD') &&
    path !== '/api' &&
    !path.startsWith('/api/') &&
    /\btext\/html\b/.test(req.headers.accept ?? '')
  )
}

export function createApp(
  services: Services,
  definitions: RouteDefinition[],
  authenticate: Authenticator,
  extra: {
    pages?: (app: ReturnType<typeof polka>) => void
    statements?: { authenticate: StatementAuthenticator; pool: StatementPool }
    /** Refuses a missing or malformed credential from the headers, before the body is read. */
    checkCredential?: (req: IncomingMessage) => void
    /** Whether the process has proven the request's credential before (see createRouteBodies). */
    knownCredential?: (req: IncomingMessage) => boolean
    /** The events feed's notifications; without it a long-polling route answers at once. */
    feedListener?: FeedListener
    /** Answers a browser's request for a page that does not exist (outside /api/) in HTML. */
    pageNotFound?: (req: IncomingMessage, res: ServerResponse) => void
  } = {},
): App {
  const { logger, config } = services
  assertScopesDeclared(definitions)
  assertCredentialsDeclared(definitions)
  const database = new RequestDatabase<Caller>({
    pool: services.pool,
    authenticate,
    markCounted: (req, caller) => markCounted(req, caller.rateLimit),
    admission: { capacity: config.dbPoolSize, maxWaitMs: config.dbWaitMs },
    statementPool: extra.statements?.pool,
    logger,
  })
  const { routeSlots } = services
  const feedWaits = createStreamSlots(config.feedWaitsPerProcess, 'waits of the events feed')
  const sharedRuns = new Map<string, Promise<SharedRun>>()
  const bodies = createRouteBodies({
    config,
    services,
    database,
    workspaceSlots: routeSlots.workspace,
    knownCredential: extra.knownCredential,
  })
  const onError = errorAnswerer(logger)

  const app = polka({
    onError,
    onNoMatch: (req: IncomingMessage, res: ServerResponse) => {
      if (extra.pageNotFound && wantsPage(req)) return extra.pageNotFound(req, res)
      onError(new NotFoundError(`No route for ${req.method} ${(req as Request).path}`), req, res)
    },
  })
  app.use(requestLog(logger, config.trustProxy))
  for (const definition of definitions) {
    const method = definition.method.toLowerCase() as 'get' | 'post' | 'put' | 'patch' | 'delete'
    app[method](definition.path, (req: IncomingMessage, res: ServerResponse) => runRoute(definition, req as Request, res))
  }
  extra.pages?.(app)
  indexRoutes(app as unknown as Router)

  async function runRoute(definition: RouteDefinition, req: Request, res: ServerResponse): Promise<void> {
    // An anonymous client is refused before its body is read.
    if (definition.auth === 'required') extra.checkCredential?.(req)
    if (definition.limitedPerAddress) services.addressRateLimit(req)
    definition.checkBodyHeaders?.(req)
    const { body, upload } = definition.body || definition.bodyKind === 'file' ? await bodies.receive(definition, req, res) : NO_BODY
    const base = { req, res, requestId: req.requestId, params: req.params, query: req.query, body, bodyFile: upload?.file, services }
    let result: RouteResult
    try {
      result = definition.longPoll ? await runLongPoll(definition, req, res, base) : await runHandler(definition, req, res, base)
    } finally {
      // Removed before the answer goes out, so a client that has its answer finds nothing left.
      await upload?.release()
    }
    if (definition.streams) return
    const status = result?.status ?? definition.status ?? 200
    sendJson(res, status, status === 204 ? undefined : result?.body, result?.headers)
  }

  /**
   * A long-polling route: runs, and while its answer is empty and may wait, waits for its
   * workspace's next notification without a connection, then runs again. The process's listener
   * is listening before the first run, and the epoch read before each run catches a notification
   * that arrives between the run and the wait.
   */
  async function runLongPoll(
    definition: RouteDefinition,
    req: Request,
    res: ServerResponse,
    base: Omit<RouteContext, 'db' | 'caller'>,
  ): Promise<RouteResult> {
    const listener = extra.feedListener
    if (!listener) return runShared(definition, req, res, base)
    const ready = () =>
      listener.ready().catch((error: unknown) => {
        throw new UnavailableError(error)
      })
    await ready()
    const started = performance.now()
    let epoch = listener.epoch()
    let result = await runShared(definition, req, res, base)
    if (!result?.wait) return result
    const release = feedWaits.take()
    const gone = new AbortController()
    const onClose = () => gone.abort()
    res.on('close', onClose)
    try {
      // Something committed but not yet readable is asked for again after 50 ms, then less often.
      let pendingPause = 50
      while (result?.wait) {
        const { ms, workspaceId, pending } = result.wait
        const left = started + ms - performance.now()
        if (left <= 0) break
        const outcome = await listener.wait(workspaceId, epoch, pending ? Math.min(left, pendingPause) : left, gone.signal)
        if (gone.signal.aborted) throw new ClientWentAwayError('the client closed the connection during a wait')
        if (outcome === 'closed' || (outcome === 'timeout' && !pending)) break
        if (pending) pendingPause = Math.min(pendingPause * 2, 1000)
        await ready()
        epoch = listener.epoch()
        result = await runShared(definition, req, res, base)
      }
    } finally {
      res.off('close', onClose)
      release()
    }
    return result
  }

  /**
   * Runs a long-polling route once; requests that come with the same bearer token, workspace and
   * URL while it runs share its answer instead of a connection each (a thousand clients of one
   * integration woken by one commit ask the database once). Each request still gets the
   * rate-limit headers the run answered.
   */
  async function runShared(
    definition: RouteDefinition,
    req: Request,
    res: ServerResponse,
    base: Omit<RouteContext, 'db' | 'caller'>,
  ): Promise<RouteResult> {
    const authorization = req.headers.authorization
    if (!authorization) return runHandler(definition, req, res, base)
    const key = `${authorization}\n${req.headers['x-tenant-slug'] ?? ''}\n${req.url}`
    let run = sharedRuns.get(key)
    if (!run) {
      run = runHandler(definition, req, res, base)
        .then((result) => ({ result, rateHeaders: rateLimitHeaders(res), callerId: req.callerId }))
        .finally(() => sharedRuns.delete(key))
      sharedRuns.set(key, run)
      return (await run).result
    }
    const shared = await run
    for (const [name, value] of Object.entries(shared.rateHeaders)) res.setHeader(name, value)
    req.callerId = shared.callerId
    return shared.result
  }

  async function runHandler(
    definition: RouteDefinition,
    req: Request,
    res: ServerResponse,
    base: Omit<RouteContext, 'db' | 'caller'>,
  ): Promise<RouteResult> {
    const callerCheck = routeCallerCheck(definition, res)
    const handle = async (db: DatabaseTransactionConnection, caller: Caller) => {
      // A file route took its workspace slot before its body was received (route-body.ts).
      const releases = takeRouteSlots(routeSlots, definition, caller.workspaceId, definition.bodyKind === 'file')
      try {
        return await definition.handler({ ...base, db, caller } as RouteContext)
      } finally {
        for (const release of releases) release()
      }
    }
    const inTransaction = async () => {
      if (definition.streams && definition.auth === 'required') return database.streamTransaction(req, callerCheck, handle)
      const result = await database.transaction(req, callerCheck, handle)
      // Committed: before the answer, the user's reads are held to this write's WAL position, so
      // a standby that has not replayed it does not answer them (src/db/request/read-replicas.ts).
      if (definition.method !== 'GET' && !definition.longRead && req.callerId) await services.readRouting?.noteWrite(req.callerId)
      return result
    }
    const standby = definition.longRead ? services.readRouting?.standbyForLongRead() : null
    if (standby) {
      return database.admitted(req, () =>
        database
          .longRead(standby, req, () => res.headersSent, callerCheck, handle)
          .catch((error: unknown) => {
            // The standby failed it before anything was sent: the primary runs it, and the client
            // sees nothing of it. An answer of the route itself (a 403, a 422) stands.
            if (res.headersSent || error instanceof CrmError) throw error
            const reason = error instanceof Error ? error.message : String(error)
            logger.info('a long read was left to the primary', { request_id: req.requestId, replica: standby.label, reason })
            return inTransaction()
          }),
      )
    }
    if (definition.auth === 'none') return definition.handler(base as unknown as RouteContext)
    return database.admitted(req, () => {
      const statements = database.sendsSingleStatements ? extra.statements : undefined
      const writes = config.writesInOneStatement && definition.writesInOneStatement?.(req) === true
      const authentication = statements && (definition.singleStatement || writes) ? statements.authenticate(req) : null
      if (!authentication || !(definition.singleStatement || mayWriteInOneStatement(definition, authentication))) return inTransaction()
      const handled = database.inOneStatement(
        req,
        authentication,
        callerCheck,
        (db) => definition.handler(db.contextFor(base)),
        inTransaction,
      )
      if (definition.singleStatement) return handled
      // Committed: the user's reads are held to this write's WAL position, as after a transaction.
      return handled.then(async (result) => {
        if (req.callerId) await services.readRouting?.noteWrite(req.callerId)
        return result
      })
    })
  }

  const handler = (req: IncomingMessage, res: ServerResponse) => app.handler(req as never, res, undefined as never)
  return { server: createHttpServer(handler, config.bodyIdleTimeoutMs), handler }
}

type SharedRun = { result: RouteResult; rateHeaders: Record<string, string>; callerId: string | undefined }

/** The RateLimit-* headers a run set on its response, for the requests that shared it. */
function rateLimitHeaders(res: ServerResponse): Record<string, string> {
  const headers: Record<string, string> = {}
  for (const name of res.getHeaderNames()) if (name.startsWith('ratelimit-')) headers[name] = String(res.getHeader(name))
  return headers
}

const SANE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

/** The middleware that gives each request its id and its log line. */
export function requestLog(
  logger: Logger,
  trustProxy: Parameters<typeof identifyClient>[1],
): (req: IncomingMessage, res: ServerResponse, next: () => void) => void {
  return (req, res, next) => {
    const request = req as Request
    const started = performance.now()
    const given = req.headers['x-request-id']
    request.requestId = typeof given === 'string' && SANE_REQUEST_ID.test(given) ? given : randomUUID()
    res.setHeader('X-Request-Id', request.requestId)
    identifyClient(req, trustProxy)
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
  }
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

/** Answers any error of a request: a client gone is logged and its socket closed; a 5xx is logged with its cause. */
export function errorAnswerer(logger: Logger): (error: unknown, req: IncomingMessage, res: ServerResponse) => void {
  return (error, req, res) => {
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
}

/** The Node server of the app, with its timeouts left to the body deadlines and to the clients. */
function createHttpServer(handler: (req: IncomingMessage, res: ServerResponse) => void, bodyIdleTimeoutMs: number): Server {
  const server = createServer(handler)
  // Node's own limit on receiving a whole request (300 s by default) would cut a slow but steady
  // 50 MiB upload short with a bare 408; body.ts's deadlines decide, and this stays behind them.
  server.requestTimeout = bodyDeadlineMs(CSV_BODY_LIMIT, bodyIdleTimeoutMs) + 60_000
  // An idle keep-alive connection is closed by the client or its proxy, not here first: Node's 5 s
  // would race with the next request a client sends on it at that moment (the client reads a
  // reset, a proxy answers 502). Proxies keep idle upstream connections up to 60 s; clients whose
  // timers run late on a loaded machine reused them past 5 s (fetch failed with ECONNRESET).
  server.keepAliveTimeout = 65_000
  server.on('clientError', answerClientError)
  return server
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
