// Single-statement reads on streaming standbys (READ_REPLICA_URLS). A statement may leave the
// primary only when it writes nothing: a cached identity's read (crm.resume_identity and the
// route's query, marked `readOnlyFor` by the authenticator). crm.authenticate counts the rate limit
// and keeps the last-used bookkeeping, so a token's first statement in a process, and every
// request that is not such a read, stays on the primary. crm.resume_identity writes that
// bookkeeping too when it is a minute old or the workspace changed: on a standby that write is
// refused (read-only transaction) and the read runs again on the primary, which writes it.
//
// A standby answers a read only when it is known, from an observation made before the read was
// sent, to have replayed (1) the primary's WAL position after the user's last write (remembered in
// this process) and (2) a primary position read at most READ_REPLICA_MAX_LAG_MS ago. The
// observation must come first: a statement takes its snapshot when it starts, so a replay position
// read inside the statement could already include a commit its snapshot does not (a create-then-list
// loop missed its own write now and then with the check inside the statement). Observations come from a check every quarter of the cap (at most a second), from
// every read a standby answers (it sends its replay position along) and from the primary's
// position after each write. Inside the read, a one-time filter refuses a server that is no longer
// a standby (promoted). A standby that refuses or cannot take a statement leaves it to the primary.
// The checks also report the standbys on /readyz (states and counts, never their addresses) and log
// each change of a standby's state.
//
// A server is used only once a check has found it to be a standby of this primary: in recovery,
// with the primary's system identifier (pg_control_system(), the same for every copy of one
// cluster), on a timeline no newer than the primary's. A server given by mistake or by an attacker
// who can change READ_REPLICA_URLS or DNS (another cluster, a standby of another primary, one
// following a sibling promoted away from this primary) would otherwise answer reads with its own
// rows, and its replay positions compare with nothing of ours. Such a server is `refused`: logged,
// never read. Its replay position is not even observed.
//
// Long reads (exports) run in a transaction of their own on a standby (standbyForLongRead): only
// on one whose hot_standby_feedback is on (read by the checks), so the primary's VACUUM keeps the
// rows the export's snapshot needs and replay does not cancel it for them. Replay can still cancel
// it for a lock (DDL, a VACUUM that truncates the table) or a pinned page, once the standby's
// max_standby_streaming_delay has passed. Its transaction first checks again that the server is
// still a standby of this cluster (a failover may have moved the address since the last check).
// The caller decides what happens when the standby fails
// it (src/http/app.ts): the primary again before the answer began, a cut response after.
import pg from 'pg'
import type { Logger } from '../../log.ts'
import { createDatabasePool, type DatabasePool, type DatabaseTransactionConnection, sql, transactionKeepingConnection } from '../pool.ts'
import { redactUrl } from '../provision.ts'
import { createStatementPool, type StatementPool, type StatementQuery } from './statement-pool.ts'

export type ReplicaState = 'starting' | 'serving' | 'lagging' | 'down' | 'promoted' | 'refused'
/**
 * A standby as /readyz shows it: its place in READ_REPLICA_URLS (from 1), never its address; its
 * state, replay lag and hot_standby_feedback at the last check, and the reads it has answered.
 */
export type ReplicaReport = {
  position: number
  state: ReplicaState
  lag_ms: number | null
  hot_standby_feedback: boolean | null
  reads: number
  long_reads: number
}

/**
 * A standby chosen for one long read, with what was known of it before the read's transaction
 * began: the read's statements take their snapshots after that, so they hold at least as much.
 */
export type LongReadStandby = {
  label: string
  /** Runs `work` in a transaction on the standby, never retried there (the caller decides). */
  transaction: <T>(work: (db: DatabaseTransactionConnection) => Promise<T>) => Promise<T>
  /** The standby may answer this user: it had replayed the user's last write, and is still within the cap. */
  admits: (userId: string) => boolean
  /** The standby answered the read (counted on /readyz). */
  served: () => void
  /** The standby failed the read: a check runs at once (a standby that is gone is skipped from then on). */
  failed: () => void
}

/** The standby refused a long read before it began (a user whose last write it has not replayed, a refusal of authentication). */
export class StandbyRefusedError extends Error {}

export type ReadRouting = {
  /** The statement pool of single-statement reads: a standby when it may answer, else the primary. */
  pool: StatementPool
  /**
   * After a request of this user that may have written, before its answer: the user's reads stay on
   * the primary until a standby has replayed past the primary's WAL position as of now.
   */
  noteWrite: (userId: string) => Promise<void>
  /** A standby that may serve a long read now (serving, hot_standby_feedback on, within the cap), or null: the primary. */
  standbyForLongRead: () => LongReadStandby | null
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

/** Users whose last write a standby must have replayed before it answers them; past this, the oldest are forgotten. */
const MAX_REMEMBERED_WRITES = 100_000
/** Guarded texts kept per standby pool, like the named statements (src/db/request/statement-connection.ts). */
const MAX_GUARDED_TEXTS = 256

/**
 * The read behind the standby's one-time filter (still a standby), with the standby's replay
 * position on its first row. The read keeps its ORDER BY (a subquery with one is not pulled up into
 * the outer query), and when the filter is false PostgreSQL does not run it. The extra column's name
 * starts with auth_, so the route never sees it (unwrapRows in src/auth/authenticate.ts).
 */
function guardedText(text: string): string {
  return `select replica_read.*, (select pg_last_wal_replay_lsn())::text as auth_replica_replayed
  from (${text}) replica_read
 where (select pg_is_in_recovery())`
}

/**
 * The primary's insert position: at or past the end of every commit that has returned, even one
 * with synchronous_commit off, whose record may not be written out yet (pg_current_wal_lsn could
 * then be behind it).
 */
const CHECK_PRIMARY = 'select pg_current_wal_insert_lsn()::text as lsn'
/** Which cluster a server belongs to, and the timeline of its last checkpoint (a standby's: its last restartpoint). */
const CLUSTER_IDENTITY = `(select system_identifier::text from pg_control_system()) as cluster,
  (select timeline_id from pg_control_checkpoint()) as timeline`
const CHECK_PRIMARY_IDENTITY = `select ${CLUSTER_IDENTITY}`
const CHECK_STANDBY = `select pg_is_in_recovery() as standby, pg_last_wal_replay_lsn()::text as replayed,
  current_setting('hot_standby_feedback')::bool as feedback, ${CLUSTER_IDENTITY}`

type ClusterIdentity = { cluster: string; timeline: number }

/**
 * Why a server is not a standby of the primary, or null when it is one: in recovery, the primary's
 * cluster, and a timeline no newer than the primary's. A newer one means it follows a server
 * promoted from this cluster that is not the primary: its history has forked from ours. An older
 * one is a standby whose last restartpoint predates the primary's promotion, which is normal.
 */
export function notAStandbyOf(primary: ClusterIdentity, server: ClusterIdentity & { standby: boolean }): string | null {
  if (server.cluster !== primary.cluster) return `system identifier ${server.cluster}, not the primary's ${primary.cluster}`
  if (!server.standby) return null
  if (server.timeline > primary.timeline) return `timeline ${server.timeline}, newer than the primary's ${primary.timeline}`
  return null
}
/** Primary positions kept to date a standby's replay position (a check's worth and more). */
const MAX_PRIMARY_POSITIONS = 512

type Replica = {
  label: string
  position: number
  pool: StatementPool
  state: ReplicaState
  lagMs: number | null
  /** The newest replay position observed (0 when unknown). */
  replayed: bigint
  /** The latest time (this process's clock) at which the primary's position is known replayed here. */
  freshAt: number | null
  guarded: Map<string, string>
  reads: number
  /** hot_standby_feedback at the last check (null: not read yet). */
  feedback: boolean | null
  /** The pool of long reads' transactions, made at the first one. */
  transactions: Promise<DatabasePool> | null
  url: string
  longReads: number
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
  /** Connections per standby for long reads (each holds one for its whole stream). */
  longReadPoolSize: number
  logger: Logger
}): ReadRouting {
  const { primary, logger, maxLagMs } = options
  const checkEveryMs = Math.min(1000, Math.max(25, Math.floor(maxLagMs / 4)))
  // One connection for the position checks: they are one short query each, and shared (see observePrimary).
  const positions = new pg.Pool({ connectionString: options.primaryUrl, max: 1, connectionTimeoutMillis: 5000 })
  positions.on('error', () => {})
  const replicas: Replica[] = options.replicaUrls.map((url, index) => ({
    label: redactUrl(url),
    position: index + 1,
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
    freshAt: null,
    guarded: new Map(),
    reads: 0,
    feedback: null,
    transactions: null,
    url,
    longReads: 0,
  }))
  /** Primary positions seen, oldest first, each with when the query that read it was sent. */
  const primaryPositions: { lsn: bigint; at: number }[] = []
  /** Per user: the primary's position after the user's last write, until every standby has replayed it. */
  const writes = new Map<string, bigint>()
  /** Users who wrote and whose position is not known yet: their reads stay on the primary. */
  const pending = new Set<string>()
  let observing: Promise<void> | null = null
  let next = 0
  /** The primary's cluster and timeline, read at every check: no standby is used before it is known. */
  let primaryIdentity: ClusterIdentity | null = null

  async function observePrimaryIdentity(): Promise<void> {
    const { rows } = await positions.query(CHECK_PRIMARY_IDENTITY)
    primaryIdentity = { cluster: rows[0].cluster, timeline: Number(rows[0].timeline) }
  }

  function setState(replica: Replica, state: ReplicaState, lagMs: number | null, reason?: string): void {
    replica.lagMs = lagMs
    if (replica.state === state) return
    const was = replica.state
    replica.state = state
    const serving = replicas.filter((r) => r.state === 'serving').length
    const fields = { replica: replica.label, from: was, to: state, lag_ms: lagMs, reason, serving_replicas: serving }
    if (state === 'serving') logger.info('read routing changed', fields)
    else logger.warn('read routing changed', fields)
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
        const last = primaryPositions.at(-1)
        if (!last || (lsn >= last.lsn && observedAt >= last.at)) primaryPositions.push({ lsn, at: observedAt })
        if (primaryPositions.length > MAX_PRIMARY_POSITIONS) primaryPositions.splice(0, primaryPositions.length - MAX_PRIMARY_POSITIONS)
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

  /**
   * A replay position observed on a standby: everything the primary had written when it answered a
   * position at or below it is in every snapshot the standby takes from now on.
   */
  function observeReplay(replica: Replica, replayed: bigint): void {
    if (replayed > replica.replayed) replica.replayed = replayed
    for (let index = primaryPositions.length - 1; index >= 0; index--) {
      if (primaryPositions[index].lsn <= replica.replayed) {
        replica.freshAt = Math.max(replica.freshAt ?? 0, primaryPositions[index].at)
        return
      }
    }
  }

  /** How far behind the primary a standby is known to be: the age of the newest primary position it has replayed. */
  const lagOf = (replica: Replica) => (replica.freshAt === null ? null : Math.max(0, Date.now() - replica.freshAt))

  async function checkReplica(replica: Replica): Promise<void> {
    let row: { standby: boolean; replayed: string | null; feedback: boolean; cluster: string; timeline: number }
    try {
      row = (await replica.pool.rows({ sql: CHECK_STANDBY, values: [] }))[0] as typeof row
    } catch (error) {
      setState(replica, 'down', null, (error as Error).message)
      return
    }
    if (primaryIdentity === null) return
    const refusal = notAStandbyOf(primaryIdentity, { ...row, timeline: Number(row.timeline) })
    if (refusal !== null) {
      replica.freshAt = null
      setState(replica, 'refused', null, `not a standby of this primary: ${refusal}`)
      return
    }
    if (!row.standby || row.replayed === null) {
      setState(replica, 'promoted', null, 'not in recovery')
      return
    }
    replica.feedback = row.feedback
    observeReplay(replica, parseLsn(row.replayed))
    const lagMs = lagOf(replica)
    setState(replica, lagMs !== null && lagMs <= maxLagMs ? 'serving' : 'lagging', lagMs)
  }

  async function check(): Promise<void> {
    await Promise.all([observePrimary(), observePrimaryIdentity()]).catch((error: unknown) =>
      logger.warn('the primary WAL position or identity could not be read', { error: (error as Error).message }),
    )
    await Promise.all(replicas.map(checkReplica))
    // A write every standby of ours has replayed needs remembering no longer.
    let everywhere = replicas[0].replayed
    for (const replica of replicas) if (replica.state !== 'refused' && replica.replayed < everywhere) everywhere = replica.replayed
    for (const [user, lsn] of writes) if (lsn <= everywhere) writes.delete(user)
  }

  let checking = false
  let ended = false
  const checkInBackground = () => {
    if (checking || ended) return
    checking = true
    check()
      .catch((error: unknown) => logger.warn('read replica check failed', { error: (error as Error).message }))
      .finally(() => (checking = false))
  }
  const timer = setInterval(checkInBackground, checkEveryMs)
  timer.unref()
  checkInBackground()

  /**
   * A standby that may answer this user now: still a standby by the last check, known to have
   * replayed the user's last write and a primary position at most the cap old. Null: the primary.
   */
  function choose(userId: string): Replica | null {
    for (let tried = 0; tried < replicas.length; tried++) {
      const replica = replicas[next++ % replicas.length]
      if (replica.state !== 'serving' && replica.state !== 'lagging') continue
      if (mayAnswer(userId, replica.replayed, replica.freshAt)) return replica
    }
    return null
  }

  /** Whether a standby known to have replayed `replayed`, a primary position of `freshAt`, may answer this user now. */
  function mayAnswer(userId: string, replayed: bigint, freshAt: number | null): boolean {
    if (pending.has(userId) || freshAt === null || Date.now() - freshAt > maxLagMs) return false
    return replayed >= (writes.get(userId) ?? 0n)
  }

  function standbyForLongRead(): LongReadStandby | null {
    for (let tried = 0; tried < replicas.length; tried++) {
      const replica = replicas[next++ % replicas.length]
      if (replica.state !== 'serving' || replica.feedback !== true) continue
      const { replayed, freshAt } = replica
      if (freshAt === null || Date.now() - freshAt > maxLagMs) continue
      return {
        label: replica.label,
        transaction: async (work) => {
          replica.transactions ??= createDatabasePool(replica.url, {
            maxPoolSize: options.longReadPoolSize,
            connectionTimeoutMs: Math.min(1000, maxLagMs),
            transactionRetryLimit: 0,
          })
          return transactionKeepingConnection(await replica.transactions, async (db) => {
            await confirmStandby(replica, db)
            return work(db)
          })
        },
        admits: (userId) => mayAnswer(userId, replayed, freshAt),
        served: () => replica.longReads++,
        failed: checkInBackground,
      }
    }
    return null
  }

  /**
   * A long read's first statement: the server is still a standby of this primary (its snapshot is
   * taken by the statements after this one). Otherwise the read is refused before it began, the
   * primary runs it, and the standby is out until a check finds it back.
   */
  async function confirmStandby(replica: Replica, db: DatabaseTransactionConnection): Promise<void> {
    const row = (await db.one(sql.unsafe`select pg_is_in_recovery() as standby,
      (select system_identifier::text from pg_control_system()) as cluster,
      (select timeline_id from pg_control_checkpoint()) as timeline`)) as { standby: boolean; cluster: string; timeline: number }
    const refusal =
      primaryIdentity === null
        ? 'the primary is not known'
        : row.standby
          ? notAStandbyOf(primaryIdentity, { ...row, timeline: Number(row.timeline) })
          : 'not in recovery'
    if (refusal === null) return
    setState(replica, row.standby ? 'refused' : 'promoted', null, refusal)
    throw new StandbyRefusedError(`the standby is no longer a standby of this primary: ${refusal}`)
  }

  async function readOn(replica: Replica, query: StatementQuery): Promise<Record<string, unknown>[]> {
    let text = replica.guarded.get(query.sql)
    if (text === undefined) {
      text = guardedText(query.sql)
      if (replica.guarded.size < MAX_GUARDED_TEXTS) replica.guarded.set(query.sql, text)
    }
    const rows = await replica.pool.rows({ sql: text, values: query.values, name: query.name })
    if (rows.length > 0) observeReplay(replica, parseLsn(rows[0].auth_replica_replayed as string))
    return rows
  }

  const pool: StatementPool = {
    rows: async (query) => {
      const replica = query.readOnlyFor === undefined ? null : choose(query.readOnlyFor)
      if (replica) {
        try {
          const rows = await readOn(replica, query)
          if (rows.length > 0) {
            replica.reads++
            return rows
          }
        } catch (error) {
          // The standby refused (a bookkeeping write, a conflict with recovery) or is gone: the
          // primary answers; a standby that is gone is skipped until a check finds it back.
          if (isUnavailable(error)) setState(replica, 'down', null, (error as Error).message)
        }
      }
      return primary.rows(query)
    },
    end: async () => {
      ended = true
      clearInterval(timer)
      await Promise.all([
        primary.end(),
        positions.end(),
        ...replicas.map((replica) => replica.pool.end()),
        ...replicas.map(async (replica) => (await replica.transactions)?.end()),
      ])
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
    standbyForLongRead,
    report: () =>
      replicas.map((replica) => ({
        position: replica.position,
        state: replica.state,
        lag_ms: replica.lagMs,
        hot_standby_feedback: replica.feedback,
        reads: replica.reads,
        long_reads: replica.longReads,
      })),
    check,
    end: () => pool.end(),
  }
}
