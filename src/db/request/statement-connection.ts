// The database connection a single-statement route sees: it accepts one query, sends it together
// with authentication as one statement (the authentication is src/auth/authenticate.ts's
// createStatementAuthenticator, behind StatementAuthentication), and answers with the route's
// rows, checked by the row contract every connection keeps (rows.ts). A second query is a
// programming error: it would run outside the statement's implicit transaction and without the
// caller's context.
import { sql } from 'slonik'
import type { DatabaseTransactionConnection } from '../pool.ts'
import { checkedRows, firstColumn, maybeOne, one, type Row, type RowQuery } from './rows.ts'
import { markJsonAsText, named, type StatementPool } from './statement-pool.ts'

/** A statement in plain pg form ($1, $2, ...), ready for the statement pool. */
export type PlainStatement = {
  sql: string
  values: readonly unknown[]
  /**
   * The caller's user when the statement writes nothing (a cached identity's crm.resume_identity
   * and a read), so a streaming standby may answer it (read-replicas.ts); unset for
   * crm.authenticate, which counts the rate limit and keeps the last-used bookkeeping.
   */
  readOnlyFor?: string
}

/**
 * A data-modifying statement sent as one statement with authentication. `visibleAfterNoMatch` is
 * a boolean SQL expression evaluated only when the write matched no row (in the same statement, so
 * on the same snapshot): whether the caller can see the target, telling 403 from 404 without a
 * second round trip.
 */
export type StatementWrite = { visibleAfterNoMatch?: ReturnType<typeof sql.fragment> }

/** One request's authentication, which wraps the route's query into the one statement and answers its caller. */
export type StatementAuthentication<Caller> = {
  /**
   * Sends the route's query with authentication (`run` sends one statement) and answers with the
   * caller and the route's rows; `singleRow` when the query answers one row at most. A write also
   * answers whether the record it matched nothing of is visible to the caller (null when it wrote,
   * or for a read).
   */
  send: (
    query: ReturnType<typeof sql.unsafe>,
    run: (statement: PlainStatement) => Promise<readonly unknown[]>,
    options: { singleRow: boolean; write?: StatementWrite },
  ) => Promise<{ caller: Caller; rows: Row[]; visible: boolean | null }>
  /**
   * After `send` failed: the caller, when the failed statement resumed a cached identity that the
   * process had already counted against the rate limit (the rollback did not undo that count);
   * null when it authenticated in full, whose count the rollback took back.
   */
  callerCountedBeforeFailure: () => Caller | null
}

type Query = RowQuery & Parameters<DatabaseTransactionConnection['any']>[0]

/**
 * One request's connection. A class rather than closures: a read creates one object per request
 * instead of a dozen functions (profiled on GET one).
 */
export class SingleStatementConnection<Caller = unknown> {
  #pool: StatementPool
  #authentication: StatementAuthentication<Caller>
  #onCaller: (caller: Caller) => void
  #caller: Caller | null = null
  #sent = false

  constructor(pool: StatementPool, authentication: StatementAuthentication<Caller>, onCaller: (caller: Caller) => void) {
    this.#pool = pool
    this.#authentication = authentication
    this.#onCaller = onCaller
  }

  async #send(query: Query, singleRow: boolean, write?: StatementWrite): Promise<{ rows: Row[]; visible: boolean | null }> {
    if (this.#sent) throw new Error('a single-statement route sent a second query')
    this.#sent = true
    let answer: Awaited<ReturnType<StatementAuthentication<Caller>['send']>>
    try {
      answer = await this.#authentication.send(query as never, (statement) => this.#pool.rows(named(statement)), { singleRow, write })
    } catch (error) {
      // A caller the process already counted is known without another statement (see
      // authenticateAfterFailure for the others).
      const counted = this.#authentication.callerCountedBeforeFailure()
      if (counted) this.#answered(counted)
      throw error
    }
    this.#answered(answer.caller)
    return { rows: checkedRows(query, answer.rows), visible: answer.visible }
  }

  #answered(caller: Caller): void {
    this.#caller = caller
    this.#onCaller(caller)
  }

  /** The query's rows; `singleRow` when the caller expects one row at most (a lighter statement). */
  async #rowsOf(query: Query, singleRow = false): Promise<Row[]> {
    return (await this.#send(query, singleRow)).rows
  }

  /**
   * A write (INSERT, UPDATE or DELETE ... RETURNING, gated on authentication's success) in the same
   * one statement as authentication. `visible` answers, when the write matched nothing, whether
   * the caller can see its target (403) or not (404); null otherwise.
   */
  async write(query: Query, write: StatementWrite = {}): Promise<{ rows: Row[]; visible: boolean | null }> {
    return this.#send(query, true, write)
  }

  async any(query: Query): Promise<Row[]> {
    return this.#rowsOf(query)
  }

  async anyFirst(query: Query): Promise<unknown[]> {
    return (await this.#rowsOf(query)).map(firstColumn)
  }

  async one(query: Query): Promise<Row> {
    return one(query, await this.#rowsOf(query, true))
  }

  async oneFirst(query: Query): Promise<unknown> {
    return firstColumn(one(query, await this.#rowsOf(query, true)))
  }

  async maybeOne(query: Query): Promise<Row | null> {
    return maybeOne(query, await this.#rowsOf(query, true))
  }

  async maybeOneFirst(query: Query): Promise<unknown> {
    const row = maybeOne(query, await this.#rowsOf(query, true))
    return row ? firstColumn(row) : null
  }

  /** The handler's context: the request's, with this connection as `db` and the caller its statement answered. */
  contextFor<Request extends object>(request: Request): Request & { db: DatabaseTransactionConnection; caller: Caller } {
    return new StatementRouteContext(request, this) as unknown as Request & { db: DatabaseTransactionConnection; caller: Caller }
  }

  /** The connection as the handler sees it (the methods above are the ones a handler may call). */
  get connection(): DatabaseTransactionConnection {
    return this as unknown as DatabaseTransactionConnection
  }

  /**
   * For a handler that failed without an answer from its statement (a malformed id, a bad filter,
   * or a statement that failed and rolled back): authenticate on its own, so a bad token still
   * answers 401 first and the request is counted once. Not when the caller is known already (the
   * statement answered, or the process counted it before the statement failed).
   */
  async authenticateAfterFailure(): Promise<void> {
    if (this.#caller) return
    this.#sent = false
    await this.#rowsOf(sql.unsafe`select null where false`, true)
  }

  caller(): Caller {
    if (!this.#caller) throw new Error('a single-statement route read the caller before its query')
    return this.#caller
  }
}

/**
 * The connection of a request whose query travels in one statement with its authentication, or
 * null for a request transaction's: domain code asks this to send a write with its visibility check
 * in the same statement (src/records/operations.ts).
 */
export function oneStatementOf(db: DatabaseTransactionConnection): SingleStatementConnection | null {
  return db instanceof SingleStatementConnection ? db : null
}

/**
 * A single-statement route's context, whose `caller` is known once the statement answered. Its
 * getter is the class's: as an object literal with a getter, each request's context had a hidden
 * class of its own, which V8 allocates outside the young generation and which pointed at that
 * request's objects, so all of them outlived their first garbage collections (profiled on GET
 * one: 13 % of everything allocated was promoted, and the collector's pauses and helper threads
 * took 3.2 s of CPU in 22 s of load at 8,000 requests a second; see docs/performance.md).
 */
class StatementRouteContext<Caller> {
  db: DatabaseTransactionConnection
  #statement: SingleStatementConnection<Caller>

  constructor(request: object, statement: SingleStatementConnection<Caller>) {
    this.db = statement.connection
    this.#statement = statement
    Object.assign(this, request)
  }

  get caller(): Caller {
    return this.#statement.caller()
  }
}

// Its queries run on the statement pool, which answers json columns as their text.
markJsonAsText(SingleStatementConnection.prototype)
