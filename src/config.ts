// Configuration comes from the environment only, is validated once at start-up, and every bad
// value yields one line naming its variable (ConfigError.problems), so an operator fixes them all
// in one go.
import { randomBytes } from 'node:crypto'
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { type CidrRange, parseCidrList } from './cidr.ts'

/** How long a request body may pause between its bytes (BODY_IDLE_TIMEOUT_MS), unless configured (src/http/body.ts). */
export const DEFAULT_BODY_IDLE_TIMEOUT_MS = 10_000

/** Bodies received at once: from one client address (429 past it) and by the process (503 past it). */
export type ReceiptBounds = { perAddress: number; total: number }

export type UploadReceiptLimits = ReceiptBounds & {
  /** UPLOAD_TEMP_BYTES: bytes of every temporary upload file of the process together (503 past it). */
  tempBytes: number
}

export type LogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent'

export type Config = {
  databaseUrl: string | null
  /** The role requests run as; null: the service creates its own (src/db/runtime-role.ts). */
  runtimeDatabaseUrl: string | null
  /** The role the worker runs as; null: the service creates its own (src/db/runtime-role.ts). */
  workerDatabaseUrl: string | null
  /**
   * READ_REPLICA_URLS: streaming standbys that serve single-statement reads and exports (src/db/request/read-replicas.ts);
   * empty: every read on the primary. READ_REPLICA_MAX_LAG_MS: the replay lag past which a standby
   * is skipped, which bounds how long a revocation or a role change can go unseen there.
   */
  readReplicas: { urls: string[]; maxLagMs: number }
  host: string
  port: number
  appSecret: string
  logLevel: LogLevel
  production: boolean
  dataDir: string
  publicBaseUrl: string | null
  tokenTtlDays: number
  /** OAUTH_CODE_TTL_SECONDS: an authorization code's lifetime, 60 s; tests shorten it (the database caps it at 60). */
  oauthCodeTtlSeconds: number
  rateLimitPerMinute: number
  /**
   * RATE_LIMIT_BATCH: requests a process admits per user before it settles them in PostgreSQL
   * (src/auth/rate-limit.ts); the overshoot across N processes grows with it (docs/decisions.md).
   */
  rateLimitBatch: number
  /** RATE_LIMIT_SETTLE_MS: how often a process settles the request counts it holds. */
  rateLimitSettleMs: number
  /** Per client address on the unauthenticated routes, counted in each API process. */
  unauthenticatedRateLimitPerMinute: number
  /** Per confidential client on the OAuth token and revocation endpoints, counted in each API process. */
  oauthClientRateLimitPerMinute: number
  /** Proxies whose X-Forwarded-For and X-Forwarded-Proto are believed; empty: none. */
  trustProxy: CidrRange[]
  webhook: {
    timeoutMs: number
    /**
     * WEBHOOK_RETRY_SCHEDULE (tests only): the delays before attempts 2, 3, ... that replace the
     * database's schedule (crm.webhook_retry_delays()); null when unset.
     */
    retryScheduleMs: number[] | null
    allowHttp: boolean
    allowedCidrs: string
    logRetentionDays: number
    concurrencyPerSubscription: number
    /** Attempts per second to one destination host, across every workspace, in each worker process. */
    hostRatePerSecond: number
  }
  smtpUrl: string | null
  workerConcurrency: number
  dbPoolSize: number
  /** How long a request may wait for a free database connection before it gets 503. */
  dbWaitMs: number
  /** A request body that sends no byte for this long gets 408 (and the rate deadline starts after it). */
  bodyIdleTimeoutMs: number
  /** The longest a statement of a request transaction may run (an export's stream has its own limit). */
  statementTimeoutMs: number
  /** The longest an export may stream, slow readers included (its cursor is one statement). */
  exportTimeoutMs: number
  /** AUDIT_RETENTION_DAYS: audit entries older than this are removed by housekeeping (crm.retire_audit_log), 400 by default. */
  auditRetentionDays: number
  /** A stream (export, errors.csv) whose client takes no chunk of it for this long is cut and rolled back. */
  streamStallMs: number
  /** Bounds on the file bodies this process receives at once (src/http/upload-receipts.ts). */
  uploads: UploadReceiptLimits
  /**
   * JSON_BODIES_PER_ADDRESS, JSON_BODIES_TOTAL: JSON and form bodies this process receives at once from one
   * client address (429 past it) and in all (503 past it), so slow senders cannot hold the sockets
   * and, at up to 1 MiB a body, the memory (src/http/upload-receipts.ts). Each of three sets has
   * these bounds: proven callers' bodies, bodies without a caller, and signed-in pages' forms.
   */
  jsonBodies: ReceiptBounds
  /**
   * Streams (exports, errors.csv) that may run at once in this process, each holding a connection
   * for as long as its client reads: at most half the pool, so slow readers never take the rest.
   */
  streamsPerProcess: number
  /**
   * EVENTS_RETENTION_DAYS: how long the events feed keeps events (docs/api.md section 8a); a cursor
   * older than that is 410 cursor_expired. The events themselves stay (the record history reads them).
   */
  eventsRetentionDays: number
  /**
   * FEED_WAITS_PER_PROCESS: long polls of the events feed waiting at once in this process (503
   * past it). A wait holds no database connection, only a socket and a timer, so the bound is far
   * above STREAMS_PER_PROCESS.
   */
  feedWaitsPerProcess: number
  /**
   * CONTEXT_CARRIER: auto (the request context in a parameter only the owner's code can set, when
   * the owner may set it) or keyed_proof (always the slower keyed proof; src/db/request-context.ts).
   */
  contextCarrier: ContextCarrierMode
  /**
   * WRITES_IN_ONE_STATEMENT (default true): a record's create, update or delete by a token the
   * process knows travels with its authentication as one statement (one round trip); false sends
   * every write in a transaction (BEGIN, authentication, the write, COMMIT), as the first request
   * of a token and writes with Idempotency-Key or If-Match always go.
   */
  writesInOneStatement: boolean
}

export type ContextCarrierMode = 'auto' | 'keyed_proof'

export class ConfigError extends Error {
  readonly problems: string[]
  constructor(problems: string[]) {
    super(problems.join('\n'))
    this.name = 'ConfigError'
    this.problems = problems
  }
}

const DURATION_UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }

export function parseDuration(text: string): number | null {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/.exec(text.trim())
  if (!match) return null
  return Math.round(Number(match[1]) * DURATION_UNITS[match[2]])
}

type Env = Record<string, string | undefined>

export function loadConfig(env: Env = process.env, options: { dataDir?: string } = {}): Config {
  const problems: string[] = []
  const production = env.NODE_ENV === 'production'
  const dataDir = options.dataDir ?? env.CRM_DATA_DIR ?? join(process.cwd(), '.data')

  const integer = (name: string, fallback: number, min: number, max: number): number => {
    const raw = env[name]
    if (raw === undefined || raw === '') return fallback
    if (!/^\d+$/.test(raw) || Number(raw) < min || Number(raw) > max) {
      problems.push(`${name}: expected a whole number from ${min} to ${max}, got ${JSON.stringify(raw)}`)
      return fallback
    }
    return Number(raw)
  }
  const boolean = (name: string, fallback: boolean): boolean => {
    const raw = env[name]
    if (raw === undefined || raw === '') return fallback
    if (/^(true|1|yes|on)$/i.test(raw)) return true
    if (/^(false|0|no|off)$/i.test(raw)) return false
    problems.push(`${name}: expected true or false, got ${JSON.stringify(raw)}`)
    return fallback
  }

  const connectionUri = (name: string, raw = env[name] || null, position?: number): string | null => {
    if (raw === null) return null
    try {
      const url = new URL(raw)
      if (url.protocol !== 'postgres:' && url.protocol !== 'postgresql:') throw new Error('scheme')
      return raw
    } catch {
      problems.push(`${name}: expected a postgres:// or postgresql:// connection URI${position === undefined ? '' : ` (URI ${position})`}`)
      return null
    }
  }
  const databaseUrl = connectionUri('DATABASE_URL')
  const runtimeDatabaseUrl = connectionUri('RUNTIME_DATABASE_URL')
  const workerDatabaseUrl = connectionUri('WORKER_DATABASE_URL')
  const readReplicaUrls = (env.READ_REPLICA_URLS || '')
    .split(/[\s,]+/)
    .filter((url) => url !== '')
    .map((url, index) => connectionUri(`READ_REPLICA_URLS`, url, index + 1))
    .filter((url): url is string => url !== null)

  const port = integer('PORT', 3000, 0, 65535)
  const host = env.HOST || '127.0.0.1'
  if (!/^[A-Za-z0-9.:\-[\]]+$/.test(host)) problems.push(`HOST: expected a host name or address, got ${JSON.stringify(host)}`)

  const logLevel = (env.LOG_LEVEL || 'info') as LogLevel
  if (!['debug', 'info', 'warn', 'error', 'silent'].includes(logLevel)) {
    problems.push(`LOG_LEVEL: expected one of debug, info, warn, error, silent, got ${JSON.stringify(env.LOG_LEVEL)}`)
  }

  let appSecret = env.APP_SECRET || ''
  if (appSecret !== '' && appSecret.length < 32) {
    problems.push('APP_SECRET: must be at least 32 characters (for example: openssl rand -base64 48)')
  } else if (appSecret === '') {
    if (production) problems.push('APP_SECRET: required when NODE_ENV=production (at least 32 characters)')
    else appSecret = localAppSecret(dataDir)
  }

  // The schedule and with it the number of attempts live in the database; this only shortens them.
  const retryText = env.WEBHOOK_RETRY_SCHEDULE || null
  const retryScheduleMs = retryText === null ? null : retryText.split(',').map(parseDuration)
  if (retryScheduleMs?.some((ms) => ms === null)) {
    problems.push('WEBHOOK_RETRY_SCHEDULE: expected comma-separated delays such as 50ms,1s,2m,1h')
  }

  const allowedCidrs = env.WEBHOOK_ALLOWED_CIDRS || ''
  try {
    parseCidrList(allowedCidrs)
  } catch (error) {
    problems.push(`WEBHOOK_ALLOWED_CIDRS: ${(error as Error).message}`)
  }

  let trustProxy: CidrRange[] = []
  try {
    trustProxy = parseCidrList(env.TRUST_PROXY || '')
  } catch (error) {
    problems.push(`TRUST_PROXY: ${(error as Error).message}`)
  }

  let publicBaseUrl = env.PUBLIC_BASE_URL || null
  if (publicBaseUrl !== null) {
    try {
      publicBaseUrl = new URL(publicBaseUrl).toString().replace(/\/$/, '')
    } catch {
      problems.push('PUBLIC_BASE_URL: expected an absolute URL such as https://crm.example.com')
    }
  } else if (production) {
    problems.push(
      'PUBLIC_BASE_URL: required when NODE_ENV=production (the address users reach, such as https://crm.example.com; links in invitations are built from it)',
    )
  }

  const smtpUrl = env.SMTP_URL || null
  if (smtpUrl !== null && !/^smtps?:\/\//.test(smtpUrl)) problems.push('SMTP_URL: expected smtp:// or smtps://')

  const rateLimitPerMinute = integer('RATE_LIMIT_PER_MINUTE', 600, 1, 1_000_000)
  const dbPoolSize = integer('DB_POOL_SIZE', 20, 1, 1000)
  const contextCarrier = env.CONTEXT_CARRIER || 'auto'
  if (contextCarrier !== 'auto' && contextCarrier !== 'keyed_proof') problems.push('CONTEXT_CARRIER: expected auto or keyed_proof')
  const config: Config = {
    databaseUrl,
    runtimeDatabaseUrl,
    workerDatabaseUrl,
    readReplicas: { urls: readReplicaUrls, maxLagMs: integer('READ_REPLICA_MAX_LAG_MS', 5000, 100, 3_600_000) },
    host,
    port,
    appSecret,
    logLevel,
    production,
    dataDir,
    publicBaseUrl,
    tokenTtlDays: integer('TOKEN_TTL_DAYS', 14, 1, 3650),
    oauthCodeTtlSeconds: integer('OAUTH_CODE_TTL_SECONDS', 60, 1, 60),
    rateLimitPerMinute,
    rateLimitBatch: integer('RATE_LIMIT_BATCH', defaultRateLimitBatch(rateLimitPerMinute), 1, rateLimitPerMinute),
    rateLimitSettleMs: integer('RATE_LIMIT_SETTLE_MS', 250, 10, 10_000),
    unauthenticatedRateLimitPerMinute: integer('UNAUTHENTICATED_RATE_LIMIT_PER_MINUTE', 60, 1, 1_000_000),
    oauthClientRateLimitPerMinute: integer('OAUTH_CLIENT_RATE_LIMIT_PER_MINUTE', 3000, 1, 1_000_000),
    trustProxy,
    webhook: {
      timeoutMs: integer('WEBHOOK_TIMEOUT_MS', 10_000, 100, 60_000),
      retryScheduleMs: retryScheduleMs?.map((ms) => ms ?? 0) ?? null,
      allowHttp: boolean('WEBHOOK_ALLOW_HTTP', false),
      allowedCidrs,
      logRetentionDays: integer('WEBHOOK_LOG_RETENTION_DAYS', 30, 1, 3650),
      concurrencyPerSubscription: integer('WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION', 10, 1, 1000),
      hostRatePerSecond: integer('WEBHOOK_HOST_RATE_PER_SECOND', 50, 1, 100_000),
    },
    smtpUrl,
    workerConcurrency: integer('WORKER_CONCURRENCY', 20, 1, 1000),
    dbPoolSize,
    dbWaitMs: integer('DB_WAIT_MS', 5000, 1, 600_000),
    bodyIdleTimeoutMs: integer('BODY_IDLE_TIMEOUT_MS', DEFAULT_BODY_IDLE_TIMEOUT_MS, 100, 600_000),
    statementTimeoutMs: integer('STATEMENT_TIMEOUT_MS', 30_000, 100, 3_600_000),
    exportTimeoutMs: integer('EXPORT_TIMEOUT_MS', 30 * 60_000, 1000, 24 * 3_600_000),
    auditRetentionDays: integer('AUDIT_RETENTION_DAYS', 400, 1, 36_500),
    streamStallMs: integer('STREAM_STALL_MS', 60_000, 100, 3_600_000),
    uploads: {
      perAddress: integer('UPLOADS_PER_ADDRESS', 8, 1, 100_000),
      total: integer('UPLOADS_TOTAL', 64, 1, 100_000),
      tempBytes: integer('UPLOAD_TEMP_BYTES', 2 * 1024 ** 3, 1024, 2 ** 50),
    },
    jsonBodies: {
      perAddress: integer('JSON_BODIES_PER_ADDRESS', 64, 1, 100_000),
      total: integer('JSON_BODIES_TOTAL', 256, 1, 100_000),
    },
    streamsPerProcess: integer('STREAMS_PER_PROCESS', defaultStreamsPerProcess(dbPoolSize), 1, maxStreamsPerProcess(dbPoolSize)),
    contextCarrier: contextCarrier as ContextCarrierMode,
    writesInOneStatement: boolean('WRITES_IN_ONE_STATEMENT', true),
    eventsRetentionDays: integer('EVENTS_RETENTION_DAYS', 30, 1, 3650),
    feedWaitsPerProcess: integer('FEED_WAITS_PER_PROCESS', 2000, 1, 1_000_000),
  }
  if (problems.length > 0) throw new ConfigError(problems)
  return config
}

/** A quarter of the pool (5 of 20), at least 1. */
export function defaultStreamsPerProcess(dbPoolSize: number): number {
  return Math.max(1, Math.floor(dbPoolSize / 4))
}

/** Half the pool, at least 1: the other half always serves the requests that finish at once. */
function maxStreamsPerProcess(dbPoolSize: number): number {
  return Math.max(1, Math.floor(dbPoolSize / 2))
}

/** A process settles a user's requests at least every 1 % of the limit (600 a minute: every 6). */
export function defaultRateLimitBatch(limit: number): number {
  return Math.max(1, Math.ceil(limit / 100))
}

/** Local runs keep a generated secret under the data directory so sessions survive restarts. */
function localAppSecret(dataDir: string): string {
  const file = join(dataDir, 'app-secret')
  if (existsSync(file)) return readFileSync(file, 'utf8').trim()
  mkdirSync(dirname(file), { recursive: true })
  const secret = randomBytes(48).toString('base64url')
  writeFileSync(file, secret + '\n', { mode: 0o600 })
  return secret
}
