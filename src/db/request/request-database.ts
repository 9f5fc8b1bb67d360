// The database a request runs on, in one place: the admission gate in front of the pool, the
// request transaction (authentication first, then the route's work as crm_api with the caller's
// context), the short authenticating transaction some requests take before their body or their
// long read, a long read on a streaming standby, and the single statement that carries a read or
// a cached caller's write with its authentication. Which of them a route takes is the HTTP layer's
// choice (src/http/app.ts); what a caller means is src/auth's. This layer only keeps the request's
// bookkeeping of where it was counted against the rate limit, so a request is counted once
// whatever path it took and whatever rolled back.
import type { IncomingMessage } from 'node:http'
import { ClientWentAwayError, CrmError, RateLimitedError, UnavailableError } from '../../errors.ts'
import type { Logger } from '../../log.ts'
import { databaseErrorOf } from '../database-errors.ts'
import { type DatabasePool, type DatabaseTransactionConnection, sql, transactionKeepingConnection } from '../pool.ts'
import { type LongReadStandby, StandbyRefusedError } from './read-replicas.ts'
import { SingleStatementConnection, type StatementAuthentication } from './statement-connection.ts'
import type { StatementPool } from './statement-pool.ts'

/** SQLSTATE of a write in a read-only transaction. */
const READ_ONLY_SQL_TRANSACTION = '25006'

/** What this layer reads of a caller (src/auth/caller.ts has the whole). */
export type RequestCaller = { userId: string; countedIn: 'database' | 'process' }

/** A request with the bookkeeping this layer keeps on it. */
export type DatabaseRequest = IncomingMessage & {
  requestId: string
  /** The caller's user, once authentication answered (the request's log line shows it). */
  callerId?: string
  /** The request was counted by crm.authenticate in its transaction (see Caller.countedIn). */
  countedInDatabase?: boolean
  /** A short transaction of its own authenticated and counted the request already (authenticateFirst). */
  authenticatedFirst?: boolean
}

/** Runs once a request's caller is known, before its work: the route's checks (which may refuse). */
export type OnCaller<Caller> = (caller: Caller) => void
export type Work<Caller, T> = (db: DatabaseTransactionConnection, caller: Caller) => Promise<T>

/** A read-only transaction's authentication found no current cached identity to resume (streamTransaction). */
class IdentityMovedError extends Error {
  constructor(cause: unknown) {
    super("The request's identity moved after its short authenticating transaction", { cause })
    this.name = 'IdentityMovedError'
  }
}

export class RequestDatabase<Caller extends RequestCaller> {
  readonly #pool: DatabasePool
  readonly #authenticate: (db: DatabaseTransactionConnection, req: IncomingMessage, requestId: string) => Promise<Caller>
  readonly #markCounted: (req: IncomingMessage, caller: Caller) => void
  readonly #admission: AdmissionGate
  readonly #logger: Logger
  readonly #statementPool: StatementPool | undefined
  #statementsRefused = false

  constructor(options: {
    pool: DatabasePool
    /** Authenticates a request inside its transaction, which it switches to crm_api (src/auth/authenticate.ts). */
    authenticate: (db: DatabaseTransactionConnection, req: IncomingMessage, requestId: string) => Promise<Caller>
    /** Marks a request as counted: its next authentication resumes the cached identity without counting it again. */
    markCounted: (req: IncomingMessage, caller: Caller) => void
    /** At most `capacity` requests use the pools at once; others wait up to `maxWaitMs`, then 503. */
    admission: { capacity: number; maxWaitMs: number }
    /** Single statements' pool (a standby's when it may answer, src/db/request/read-replicas.ts). */
    statementPool?: StatementPool
    logger: Logger
  }) {
    this.#pool = options.pool
    this.#authenticate = options.authenticate
    this.#markCounted = options.markCounted
    this.#admission = createAdmissionGate(options.admission.capacity, options.admission.maxWaitMs)
    this.#statementPool = options.statementPool
    this.#logger = options.logger
  }

  /** Runs database work behind the admission gate. */
  admitted<T>(req: DatabaseRequest, run: () => Promise<T>): Promise<T> {
    return this.#admission.run(run).catch(async (error: unknown) => {
      // The rollback took crm.authenticate's count with it: count the request again, outside
      // (unless the refusal is the rate limit itself, or the process counted it).
      if (req.callerId && req.countedInDatabase && !(error instanceof RateLimitedError && error.quota)) {
        await this.#pool.query(sql.unsafe`select crm.count_request(${req.callerId})`).catch(() => {})
      }
      throw error
    })
  }

  #known(req: DatabaseRequest, caller: Caller, onCaller: OnCaller<Caller>): void {
    req.callerId = caller.userId
    req.countedInDatabase = caller.countedIn === 'database'
    onCaller(caller)
  }

  /**
   * A request transaction: authentication first, then `work` as crm_api with the caller's context.
   * A stream's transaction is read-only (`readOnly`): it has no transaction id, so however long its
   * client takes to read, it holds no row lock that a revocation, a suspension or the token's other
   * requests could wait for. Its request was authenticated first (authenticateAhead), so it only
   * resumes the cached identity, which writes nothing there (sql/definitions/20_tenancy_and_access.sql); when that identity is no
   * longer cached or current, IdentityMovedError.
   */
  transaction<T>(req: DatabaseRequest, onCaller: OnCaller<Caller>, work: Work<Caller, T>, readOnly = false): Promise<T> {
    return transactionKeepingConnection(this.#pool, async (db) => {
      if (readOnly) await db.query(sql.unsafe`set transaction read only`)
      const caller = await this.#authenticate(db, req, req.requestId).catch((error: unknown) => {
        // A full authentication cannot write its count in a read-only transaction.
        if (readOnly && databaseErrorOf(error)?.code === READ_ONLY_SQL_TRANSACTION) throw new IdentityMovedError(error)
        throw error
      })
      this.#known(req, caller, onCaller)
      return work(db, caller)
    })
  }

  /**
   * Authenticates and counts the request in a short transaction of its own, before its body is read
   * or its long read begins: crm.authenticate's bookkeeping (the token's last use, the user's last
   * workspace) and the count are committed with it, and the identity is cached. The request's own
   * transaction then resumes that identity without counting it again (markCounted); `check` runs in
   * the short transaction, as crm_api with the caller's context.
   */
  authenticateFirst(req: DatabaseRequest, onCaller: OnCaller<Caller>, check?: Work<Caller, void>): Promise<void> {
    return this.admitted(req, () => this.#authenticateAhead(req, onCaller, check))
  }

  /** authenticateFirst for a request already admitted to the pool. */
  async #authenticateAhead(req: DatabaseRequest, onCaller: OnCaller<Caller>, check?: Work<Caller, void>): Promise<void> {
    await this.transaction(req, onCaller, async (db, caller) => {
      await check?.(db, caller)
      this.#markCounted(req, caller)
    })
    // Committed, and with it the request's count: a rollback of the handler's transaction leaves it.
    req.countedInDatabase = false
    req.authenticatedFirst = true
  }

  /**
   * A stream on the primary writes its request's bookkeeping and count in a short transaction
   * first, so that its long read's transaction can be read-only (see transaction). The identity may
   * move in between (a revocation, a role change, a standby that found it stale and dropped it):
   * then once more, and the second short transaction meets the change.
   */
  async streamTransaction<T>(req: DatabaseRequest, onCaller: OnCaller<Caller>, work: Work<Caller, T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      if (!req.authenticatedFirst || attempt > 0) await this.#authenticateAhead(req, onCaller)
      try {
        return await this.transaction(req, onCaller, work, true)
      } catch (error) {
        if (!(error instanceof IdentityMovedError)) throw error
        if (attempt > 0) throw new UnavailableError(error, 'Your access changed as the request began; retry it')
      }
    }
  }

  /**
   * A long read (an export) in a transaction on a streaming standby. Only a cached identity's
   * authentication may run there (crm.resume_identity writes nothing), and only for a user whose
   * last write the standby had replayed before the transaction began: any failure of
   * authentication there, a refused bookkeeping write included, is a refusal of the standby, and
   * the caller runs the read on the primary. A failure after the answer began (`answerBegan`) cuts
   * the response, which the client sees as a failed transfer; it is logged with the standby.
   */
  async longRead<T>(
    standby: LongReadStandby,
    req: DatabaseRequest,
    answerBegan: () => boolean,
    onCaller: OnCaller<Caller>,
    work: Work<Caller, T>,
  ): Promise<T> {
    try {
      return await standby.transaction(async (db) => {
        const caller = await this.#authenticate(db, req, req.requestId).catch((error: unknown) => {
          throw new StandbyRefusedError(`authentication on the standby: ${(error as Error).message}`, { cause: error })
        })
        // Counted by the process: if the primary runs it instead, it is not counted again.
        if (caller.countedIn === 'process') this.#markCounted(req, caller)
        if (caller.countedIn !== 'process' || !standby.admits(caller.userId)) {
          throw new StandbyRefusedError("the standby is not known to have replayed the user's last write within the cap")
        }
        this.#known(req, caller, onCaller)
        const answered = await work(db, caller)
        // Counted as the answer ends, before the commit's round trip.
        standby.served()
        return answered
      })
    } catch (error) {
      // The route's own refusal (a 403, a 422) is the standby's answer.
      if (error instanceof CrmError) standby.served()
      else if (!(error instanceof ClientWentAwayError)) standby.failed()
      if (answerBegan() && !(error instanceof ClientWentAwayError)) {
        this.#logger.warn('a long read on a standby failed after its answer began: the response is cut', {
          request_id: req.requestId,
          replica: standby.label,
          error: error instanceof Error ? error.message : String(error),
        })
      }
      throw error
    }
  }

  /** Whether single statements may be sent (a pool is configured and none was refused as unconfined). */
  get sendsSingleStatements(): boolean {
    return this.#statementPool !== undefined && !this.#statementsRefused
  }

  /**
   * The request's query in one statement with its authentication (statement-connection.ts): `run`
   * gets the connection that sends it. When the statement's connection turns out not to be confined
   * by row-level security, single statements stop for good and `inTransaction` runs the request.
   */
  inOneStatement<T>(
    req: DatabaseRequest,
    authentication: StatementAuthentication<Caller>,
    onCaller: OnCaller<Caller>,
    run: (db: SingleStatementConnection<Caller>) => Promise<T>,
    inTransaction: () => Promise<T>,
  ): Promise<T> {
    const db = new SingleStatementConnection(this.#statementPool as StatementPool, authentication, (caller: Caller) => {
      try {
        this.#known(req, caller, onCaller)
      } finally {
        // The statement committed (or, before a failure, the process counted it): nothing to count again.
        req.countedInDatabase = false
      }
    })
    return run(db).catch(async (error: unknown) => {
      // The read's connection is not confined by row-level security (a pooler that dropped its
      // role, a wrong RUNTIME_DATABASE_URL): the statement refused to run and changed nothing.
      // Requests go through transactions from now on, which switch to crm_api themselves.
      if (refusedAsUnconfined(error)) {
        this.#statementsRefused = true
        this.#logger.error(
          'single-statement reads refused to run: their connection is not confined by row-level security; reads use transactions instead',
          { error: (error as Error).message },
        )
        return inTransaction()
      }
      await db.authenticateAfterFailure()
      throw error
    })
  }
}

/** crm.require_confined_role's refusal (sql/definitions/20_tenancy_and_access.sql). */
function refusedAsUnconfined(error: unknown): boolean {
  const fields = databaseErrorOf(error)
  return fields?.code === '42501' && fields.hint === 'role_not_confined'
}

/**
 * A bounded wait for a database connection. Slonik queues requests for a busy pool without limit;
 * this gate admits at most `capacity` requests to the pools at once, lets others wait up to
 * `maxWaitMs`, and then refuses them with 503 so a saturated service sheds load instead of piling up.
 */
type AdmissionGate = { run: <T>(fn: () => Promise<T>) => Promise<T>; inFlight: () => number; waiting: () => number }

function createAdmissionGate(capacity: number, maxWaitMs: number): AdmissionGate {
  let active = 0
  const queue: { admit: () => void; timer: NodeJS.Timeout }[] = []

  const release = () => {
    const next = queue.shift()
    if (next) {
      clearTimeout(next.timer)
      next.admit()
    } else {
      active--
    }
  }

  const admitted = async <T>(fn: () => Promise<T>): Promise<T> => {
    try {
      return await fn()
    } finally {
      release()
    }
  }

  const enter = (): Promise<void> => {
    if (active < capacity) {
      active++
      return Promise.resolve()
    }
    return new Promise((resolve, reject) => {
      const entry = {
        admit: () => resolve(),
        timer: setTimeout(() => {
          queue.splice(queue.indexOf(entry), 1)
          reject(new UnavailableError(null, `All ${capacity} database connections stayed busy for ${maxWaitMs} ms; retry shortly`))
        }, maxWaitMs),
      }
      queue.push(entry)
    })
  }

  return {
    // A free slot is taken at once, without waiting a turn of the event loop for an already
    // settled promise (every request passes here).
    run: (fn) => {
      if (active < capacity) {
        active++
        return admitted(fn)
      }
      return enter().then(() => admitted(fn))
    },
    inFlight: () => active,
    waiting: () => queue.length,
  }
}
