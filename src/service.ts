// Starts the whole service in one process: database (provisioned or given), migrations, the API
// and the worker; and stops it in the reverse order, finishing in-flight work first.
import type { AddressInfo } from 'node:net'
import {
  bearerCredential,
  createAuthenticator,
  createCredentialCheck,
  createKnownCredentialCheck,
  createStatementAuthenticator,
} from './auth/authenticate.ts'
import { IdentityCache } from './auth/identity-cache.ts'
import { createRequestRateLimit, createSettleRequestCounts, type RequestRateLimit } from './auth/rate-limit.ts'
import type { Config } from './config.ts'
import { migrate } from './db/migrate.ts'
import { createDatabasePool, type DatabasePool } from './db/pool.ts'
import { type ProvisionedDatabase, provisionDatabase } from './db/provision.ts'
import { createReadRouting, type ReadRouting } from './db/request/read-replicas.ts'
import { createStatementPool } from './db/request/statement-pool.ts'
import { ensureRuntimeRole, ensureWorkerRole, operatorLogins } from './db/runtime-role.ts'
import { createAddressRateLimit, createOAuthClientRateLimit } from './http/address-rate-limit.ts'
import { createApp } from './http/app.ts'
import { allRoutes } from './http/routes/index.ts'
import { createBodyReceiptSets, createUploadReceipts } from './http/upload-receipts.ts'
import { createRouteSlots, type RouteSlots } from './http/workspace-slots.ts'
import type { Logger } from './log.ts'
import { errorPage } from './ui/page-context.ts'
import { registerPages } from './ui/routes.ts'
import { createFeedListener, type FeedListener } from './webhooks/feed-listener.ts'
import { startWorker, type WorkerHandle } from './worker.ts'

export type RunningService = {
  url: string
  databaseUrl: string
  pool: DatabasePool
  worker: WorkerHandle | null
  /** The standbys' routing when READ_REPLICA_URLS is set. */
  readRouting: ReadRouting | null
  /** The events feed's listener (null without the API). */
  feedListener: FeedListener | null
  /** The export and upload slots of the API's routes and pages (null without the API). */
  routeSlots: RouteSlots | null
  stop: () => Promise<void>
}

export async function startService(options: {
  config: Config
  logger: Logger
  api?: boolean
  worker?: boolean
  database?: ProvisionedDatabase
  migrate?: boolean
  /** Sees every statement the API's pool sends (tests count round trips with it). */
  onQuery?: (text: string) => void
}): Promise<RunningService> {
  const { config, logger } = options
  const database =
    options.database ??
    (await provisionDatabase({ databaseUrl: config.databaseUrl, dataDir: config.dataDir, log: (line) => logger.info(line) }))
  if (options.migrate !== false) {
    const result = await migrate(database.url, {
      log: (line) => logger.info(line),
      contextCarrier: config.contextCarrier,
      logins: operatorLogins([config.runtimeDatabaseUrl, config.workerDatabaseUrl]),
    })
    logger.info('schema is current', { applied_now: result.applied.length })
    if (result.contextCarrier === 'keyed_proof') {
      logger.warn(
        'the request context is carried by the keyed proof: slower policies (the owner may not set backtrace_functions; a superuser grants it with GRANT SET ON PARAMETER backtrace_functions TO crm_owner, see src/db/request-context.ts)',
        { CONTEXT_CARRIER: config.contextCarrier },
      )
    }
  }
  // The owner only migrates (and sets the login roles' passwords): requests run as the runtime
  // role, the worker as its own (src/db/runtime-role.ts, sql/migrations/000001_foundation.sql).
  const runtimeUrl = config.runtimeDatabaseUrl ?? (await ensureRuntimeRole(database.url, config.appSecret))
  const workerUrl = options.worker === false ? null : (config.workerDatabaseUrl ?? (await ensureWorkerRole(database.url, config.appSecret)))
  // An API process keeps one connection of its pool open when idle: the events feed's waits hold
  // none, and the query of a wake after a quiet minute would otherwise connect first, the largest
  // step of a wake's latency (docs/performance.md, "Events feed long polling").
  const pool = await createDatabasePool(runtimeUrl, {
    maxPoolSize: config.dbPoolSize,
    minPoolSize: options.api === false ? 0 : 1,
    onQuery: options.onQuery,
  })
  // Single-statement reads run as the runtime role, which has crm_api's privileges and policies
  // and is proven confined by each statement (see createStatementAuthenticator); the admission
  // gate keeps the two pools' sum in bounds.
  const statementPool = createStatementPool(runtimeUrl, {
    maxPoolSize: config.dbPoolSize,
    onQuery: options.onQuery,
    onError: (error) => logger.warn('idle statement connection failed', { error: error.message }),
    onWarning: (message) => logger.warn(message),
  })
  // With standbys, a cached identity's reads go to one that has replayed far enough (read-replicas.ts).
  const readRouting: ReadRouting | null =
    config.readReplicas.urls.length === 0
      ? null
      : createReadRouting({
          primary: statementPool,
          primaryUrl: runtimeUrl,
          replicaUrls: config.readReplicas.urls,
          maxLagMs: config.readReplicas.maxLagMs,
          poolSize: config.dbPoolSize,
          longReadPoolSize: config.streamsPerProcess,
          logger,
        })
  const worker = workerUrl === null ? null : await startWorker({ databaseUrl: workerUrl, config, logger })
  if (config.webhook.allowHttp || config.webhook.allowedCidrs) {
    logger.warn('WEBHOOK EXCEPTIONS ARE ON: for local development only, never in production', {
      WEBHOOK_ALLOW_HTTP: config.webhook.allowHttp,
      WEBHOOK_ALLOWED_CIDRS: config.webhook.allowedCidrs,
    })
  }

  let url = ''
  let closeServer = async () => {}
  let rateLimit: RequestRateLimit | null = null
  let settlePool: DatabasePool | null = null
  let feedListener: FeedListener | null = null
  let routeSlots: RouteSlots | null = null
  if (options.api !== false) {
    const services = {
      config,
      pool,
      logger,
      worker,
      readRouting,
      baseUrl: config.publicBaseUrl ?? '',
      addressRateLimit: createAddressRateLimit(config.unauthenticatedRateLimitPerMinute),
      oauthClientRateLimit: createOAuthClientRateLimit(config.oauthClientRateLimitPerMinute, config.unauthenticatedRateLimitPerMinute),
      ...createBodyReceiptSets(config.jsonBodies),
      uploadReceipts: createUploadReceipts(config.uploads),
      routeSlots: createRouteSlots(config.streamsPerProcess),
    }
    routeSlots = services.routeSlots
    const routes = allRoutes()
    // One identity cache and one rate-limit count for the process's API routes (the UI's pages
    // authenticate in full: a person's clicks are not worth a cache).
    // Settlements have a connection of their own: a request that waits for one (its user's batch
    // is full) may hold a connection of the API's pool, and must not wait for it.
    settlePool = await createDatabasePool(runtimeUrl, { maxPoolSize: 1 })
    rateLimit = createRequestRateLimit({
      limit: config.rateLimitPerMinute,
      batch: config.rateLimitBatch,
      intervalMs: config.rateLimitSettleMs,
      settle: createSettleRequestCounts(settlePool),
      onError: (error) =>
        logger.warn('rate-limit counts could not be settled; kept for the next try', {
          error: error instanceof Error ? error.message : String(error),
        }),
    })
    const authentication = { identities: new IdentityCache(), rateLimit }
    // The events feed's one listening connection, opened by the first wait (src/webhooks/feed-listener.ts).
    feedListener = createFeedListener(runtimeUrl, logger)
    const app = createApp(services, routes, createAuthenticator(config, undefined, authentication), {
      pages: (polkaApp) => registerPages(polkaApp, services, routes),
      pageNotFound: (_req, res) => errorPage(res, 404, 'There is no page at this address.'),
      statements: {
        authenticate: createStatementAuthenticator(config, undefined, authentication),
        pool: readRouting?.pool ?? statementPool,
      },
      checkCredential: createCredentialCheck(),
      knownCredential: createKnownCredentialCheck(config, bearerCredential, authentication),
      feedListener,
    })
    await new Promise<void>((resolve, reject) => {
      app.server.once('error', reject)
      app.server.listen(config.port, config.host, () => resolve())
    })
    const address = app.server.address() as AddressInfo
    url = `http://${address.family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}`
    // A wildcard address (0.0.0.0, ::) is no place to send a browser: localhost stands in for it.
    const wildcard = address.address === '0.0.0.0' || address.address === '::'
    services.baseUrl = config.publicBaseUrl ?? (wildcard ? `http://localhost:${address.port}` : url)
    closeServer = () =>
      new Promise<void>((resolve) => {
        // Stop accepting, let in-flight requests finish, and close idle keep-alive sockets now.
        app.server.close(() => resolve())
        app.server.closeIdleConnections()
        // A connection whose request is in flight closes right after its answer, not after the
        // keep-alive timeout (src/http/app.ts), which would hold the close that long.
        app.server.keepAliveTimeout = 1
        setTimeout(() => app.server.closeAllConnections(), 10_000).unref()
      })
  }

  let stopping: Promise<void> | null = null
  const stop = () =>
    (stopping ??= (async () => {
      // Waiting feed clients get their empty answers now, so the server closes without them.
      await Promise.all([closeServer(), feedListener?.stop()])
      // The counts of the last requests reach the database before the pool closes.
      rateLimit?.stop()
      await rateLimit
        ?.flush()
        .catch((error: unknown) =>
          logger.warn('rate-limit counts lost at stop', { error: error instanceof Error ? error.message : String(error) }),
        )
      await settlePool?.end()
      await worker?.stop()
      await Promise.all([pool.end(), readRouting ? readRouting.end() : statementPool.end()])
      await database.stop()
    })())

  return { url, databaseUrl: database.url, pool, worker, readRouting, feedListener, routeSlots, stop }
}
