// Single-statement reads on streaming standbys (READ_REPLICA_URLS). A statement may leave the
// primary only when it writes nothing: a cached identity's read (crm.resume_identity and the
// route's query, marked `readOnlyFor` by the authenticator). crm.authenticate counts the rate limit
// and keeps the last-used bookkeeping, so a token's first statement in a process, and every
// request that is not such a read, stays on the primary. crm.resume_identity writes that
// bookkeeping too when it is a minute old or the workspace changed: on a standby that write is
// refused (read-only transaction) and the read runs again on the primary, which writes it.
//
// What a standby may answer is decided inside the read's own statement, by a one-time filter on
// the standby's state (guardedText): it is still a standby, it has replayed the user's last write
// (the primary's WAL position after that write committed, remembered in this process), and it has
// replayed everything the primary had written at most READ_REPLICA_MAX_LAG_MS ago (its replay
// reached a primary position observed within that time, or its last replayed commit is that
// recent). A statement that fails the filter answers no row (a wrapped read always answers one)
// and runs on the primary; so does a statement the standby refuses or cannot take. A check every
// quarter of the cap keeps what the filter compares against current, picks the standbys worth
// trying, reports them on /readyz and logs each change of a standby's state.
import pg from 'pg'
import type { Logger } from '../log.ts'
import { redactUrl } from './provision.ts'
import { createStatementPool, type StatementPool, type StatementQuery } from './statement-pool.ts'

export type ReplicaState = 'starting' | 'serving' | 'lagging' | 'down' | 'promoted'
/** A standby as /readyz shows it: its state and replay lag at the last check, and the reads it has answered. */
export type ReplicaReport = { replica: string; state: ReplicaState; lag_ms: number | null; reads: number }

export type ReadRouting = {
  /** The statement pool of single-statement reads: a standby when it may answer, else the primary. */
  pool: StatementPool
  /**
   * After a request of this user that may have written, before its answer: the user's reads stay on
   * the primary until a standby has replayed past the primary's WAL position as of now.
   */
  noteWrite: (userId: string) => Promise<void>
  report: () => ReplicaReport[]
  /** Runs one check of the primary and every standby now (tests wait for a state with it). */
  check: () => Promise<void>
  end: () => Promise<void>
}

/** A WAL position (pg_lsn, `16/B374D848`) as a number, so positions compare. */
export function parseLsn(text: string): bigint {
  const [high, low] = text.split('/')
  return (BigInt(`0x${high}`) << 32n) | BigInt(`0x${low}`)
}

export function formatLsn(lsn: bigint): string {
  return `${(lsn >> 32n).toString(16).toUpperCase()}/${(lsn & 0xffffffffn).toString(16).toUpperCase()}`
}

/** Users whose last write a standby must have replayed before it answers them; past this, the oldest are forgotten. */
const MAX_REMEMBERED_WRITES = 100_000
/** Guarded texts kept per standby pool, like the named statements (src/http/single-statement.ts). */
const MAX_GUARDED_TEXTS = 256

/**
 * The read behind the standby's one-time filter. The read keeps its ORDER BY (a subquery with one
 * is not pulled up into the outer query), and when the filter is false PostgreSQL does not run it.
 */
function guardedText(text: string, valueCount: number): string {
  const [written, primary, maxLag] = [valueCount + 1, valueCount + 2, valueCount + 3].map((n) => `$${n}`)
  return `select * from (${text}) replica_read
 where (select pg_is_in_recovery()
               and pg_last_wal_replay_lsn() >= ${written}::pg_lsn
               and (pg_last_wal_replay_lsn() >= ${primary}::pg_lsn
                    or now() - pg_last_xact_replay_timestamp() <= ${maxLag}::interval))`
}

const CHECK_PRIMARY = 'select pg_current_wal_lsn()::text as lsn'
const CHECK_STANDBY = `select pg_is_in_recovery() as standby, pg_last_wal_replay_lsn()::text as replayed,
  (extract(epoch from now() - pg_last_xact_replay_timestamp()) * 1000)::float8 as since_replay_ms`

type Replica = {
  label: string
  pool: StatementPool
  state: ReplicaState
  lagMs: number | null
  /** The position the last check found replayed (0 when unknown). */
  replayed: bigint
  guarded: Map<string, string>
  reads: number
}

/**
 * A standby's error that says the standby cannot serve (a lost or refused connection, a shutdown, a
 * start-up), not that this statement failed: PostgreSQL's own errors are about the statement
 * otherwise (a refused bookkeeping write, a conflict with recovery).
 */
function isUnavailable(error: unknown): boolean {
  if (!(error instanceof pg.DatabaseError)) return true
  return error.code?.startsWith('08') === true || error.code?.startsWith('57P') === true
}

export function createReadRouting(options: {
  primary: StatementPool
  /** The runtime role's URL on the primary: the WAL position checks. */
  primaryUrl: string
  replicaUrls: string[]
  maxLagMs: number
  poolSize: number
  logger: Logger
}): ReadRouting {
  const { primary, logger, maxLagMs } = options
  const checkEveryMs = Math.max(25, Math.floor(maxLagMs / 4))
  // One connection for the position checks: they are one short query each, and shared (see observePrimary).
  const positions = new pg.Pool({ connectionString: options.primaryUrl, max: 1, connectionTimeoutMillis: 5000 })
  positions.on('error', () => {})
  const replicas: Replica[] = options.replicaUrls.map((url) => ({
    label: redactUrl(url),
    pool: createStatementPool(url, {
      maxPoolSize: options.poolSize,
      // A standby that does not answer is skipped, not waited for.
      connectionTimeoutMs: Math.min(1000, maxLagMs),
      onError: (error) => logger.warn('idle read replica connection failed', { error: error.message }),
      onWarning: (message) => logger.warn(message),
    }),
    state: 'starting',
    lagMs: null,
    replayed: 0n,
    guarded: new Map(),
    reads: 0,
  }))
  /** The newest primary position seen, and when the query that saw it started. */
  let primaryPosition: { lsn: bigint; observedAt: number } | null = null
  /** Per user: the primary's position after the user's last write, until every standby has replayed it. */
  const writes = new Map<string, bigint>()
  /** Users who wrote and whose position is not known yet: their reads stay on the primary. */
  const pending = new Set<string>()
  let observing: Promise<void> | null = null
  let next = 0

  function setState(replica: Replica, state: ReplicaState, lagMs: number | null, reason?: string): void {
    replica.lagMs = lagMs
    if (replica.state === state) return
    const was = replica.state
    replica.state = state
    const serving = replicas.filter((r) => r.state === 'serving').length
    logger.warn('read routing changed', { replica: replica.label, from: was, to: state, lag_ms: lagMs, reason, serving_replicas: serving })
  }

  /**
   * One query of the primary's WAL position, shared by whoever asks while it runs. It covers the
   * writes noted before it started: those users get the position it answers.
   */
  function observePrimary(): Promise<void> {
    observing ??= (async () => {
      const covered = [...pending]
      pending.clear()
      const observedAt = Date.now()
      try {
        const { rows } = await positions.query(CHECK_PRIMARY)
        const lsn = parseLsn(rows[0].lsn)
        if (!primaryPosition || lsn >= primaryPosition.lsn) primaryPosition = { lsn, observedAt }
        for (const user of covered) {
          writes.delete(user)
          writes.set(user, lsn)
        }
        while (writes.size > MAX_REMEMBERED_WRITES) writes.delete(writes.keys().next().value as string)
      } catch (error) {
        for (const user of covered) pending.add(user)
        throw error
      } finally {
        observing = null
      }
    })()
    return observing
  }

  async function checkReplica(replica: Replica): Promise<void> {
    let row: { standby: boolean; replayed: string | null; since_replay_ms: number | null }
    try {
      row = (await replica.pool.rows({ sql: CHECK_STANDBY, values: [] }))[0] as typeof row
    } catch (error) {
      replica.replayed = 0n
      setState(replica, 'down', null, (error as Error).message)
      return
    }
    if (!row.standby || row.replayed === null) {
      replica.replayed = 0n
      setState(replica, 'promoted', null, 'not in recovery')
      return
    }
    replica.replayed = parseLsn(row.replayed)
    const caughtUp = primaryPosition !== null && replica.replayed >= primaryPosition.lsn
    const lagMs = caughtUp ? 0 : Math.max(0, Math.round(row.since_replay_ms ?? Number.POSITIVE_INFINITY))
    setState(replica, lagMs <= maxLagMs ? 'serving' : 'lagging', Number.isFinite(lagMs) ? lagMs : null)
  }

  async function check(): Promise<void> {
    await observePrimary().catch((error: unknown) =>
      logger.warn('the primary WAL position could not be read', { error: (error as Error).message }),
    )
    await Promise.all(replicas.map(checkReplica))
    // A write every standby has replayed needs remembering no longer.
    const everywhere = replicas.reduce((least, replica) => (replica.replayed < least ? replica.replayed : least), replicas[0].replayed)
    for (const [user, lsn] of writes) if (lsn <= everywhere) writes.delete(user)
  }

  let checking = false
  const timer = setInterval(() => {
    if (checking) return
    checking = true
    check().finally(() => (checking = false))
  }, checkEveryMs)
  timer.unref()
  void check()

  /** A standby that may answer this user now, by the last check; null: the primary. */
  function choose(userId: string): { replica: Replica; written: bigint; primaryLsn: bigint } | null {
    if (pending.has(userId) || !primaryPosition || Date.now() - primaryPosition.observedAt > maxLagMs) return null
    const written = writes.get(userId) ?? 0n
    for (let tried = 0; tried < replicas.length; tried++) {
      const replica = replicas[next++ % replicas.length]
      if (replica.state === 'serving' && replica.replayed >= written) return { replica, written, primaryLsn: primaryPosition.lsn }
    }
    return null
  }

  async function readOn(choice: NonNullable<ReturnType<typeof choose>>, query: StatementQuery) {
    const { replica } = choice
    let text = replica.guarded.get(query.sql)
    if (text === undefined) {
      text = guardedText(query.sql, query.values.length)
      if (replica.guarded.size < MAX_GUARDED_TEXTS) replica.guarded.set(query.sql, text)
    }
    const values = [...query.values, formatLsn(choice.written), formatLsn(choice.primaryLsn), `${maxLagMs} milliseconds`]
    return replica.pool.rows({ sql: text, values, name: query.name })
  }

  const pool: StatementPool = {
    rows: async (query) => {
      const choice = query.readOnlyFor === undefined ? null : choose(query.readOnlyFor)
      if (choice) {
        try {
          const rows = await readOn(choice, query)
          if (rows.length > 0) {
            choice.replica.reads++
            return rows
          }
        } catch (error) {
          // The standby refused (a bookkeeping write, a conflict with recovery) or is gone: the
          // primary answers; a standby that is gone is skipped until a check finds it back.
          if (isUnavailable(error)) setState(choice.replica, 'down', null, (error as Error).message)
        }
      }
      return primary.rows(query)
    },
    end: async () => {
      clearInterval(timer)
      await Promise.all([primary.end(), positions.end(), ...replicas.map((replica) => replica.pool.end())])
    },
  }

  return {
    pool,
    noteWrite: async (userId) => {
      pending.add(userId)
      try {
        while (pending.has(userId)) await observePrimary()
      } catch (error) {
        // The user stays pending (reads on the primary) until a check reads the position.
        logger.warn('the primary WAL position could not be read', { error: (error as Error).message })
      }
    },
    report: () => replicas.map((replica) => ({ replica: replica.label, state: replica.state, lag_ms: replica.lagMs, reads: replica.reads })),
    check,
    end: () => pool.end(),
  }
}
