// The database connection a single-statement route sees: it accepts one query, sends it together
// with authentication as one statement (see createStatementAuthenticator), and answers with the
// route's rows as slonik would. A second query is a programming error: it would run outside the
// statement's implicit transaction and without the caller's context.
import { createHash } from 'node:crypto'
import { DataIntegrityError, NotFoundError, sql } from 'slonik'
import type { PlainStatement, StatementAuthenticator, StatementWrite } from '../auth/authenticate.ts'
import type { Caller } from '../auth/caller.ts'
import type { DatabasePool, DatabaseTransactionConnection } from '../db/pool.ts'
import { markJsonAsText, type StatementPool, type StatementQuery } from '../db/statement-pool.ts'
import type { RouteContext } from './route.ts'

type Query = Parameters<DatabasePool['any']>[0]
type Row = Record<string, unknown>

/**
 * Statement names for single-statement reads, by SQL text. A named statement is parsed and planned
 * once per connection and then reused, where an unnamed one is planned on every request (profiled:
 * about a fifth of the database's time for GET one). The texts come from a whitelist of fields and
 * operators and a page size of 1 to 200 (written into the text, see list-query.ts), so they are
 * finitely many; still, past MAX_NAMED texts the rest go unnamed, which bounds
 * the memory each connection spends on kept plans.
 */
const MAX_NAMED = 256
const statementNames = new Map<string, string>()

function named(query: PlainStatement): StatementQuery {
  let name = statementNames.get(query.sql)
  if (!name) {
    if (statementNames.size >= MAX_NAMED) return { ...query }
    name = `read_${createHash('sha256').update(query.sql).digest('hex').slice(0, 24)}`
    statementNames.set(query.sql, name)
  }
  return { sql: query.sql, values: query.values, name, readOnlyFor: query.readOnlyFor }
}

/**
 * One request's connection. A class rather than closures: a read creates one object per request
 * instead of a dozen functions (profiled on GET one).
 */
export class SingleStatementConnection {
  #pool: StatementPool
  #authentication: ReturnType<StatementAuthenticator>
  #onCaller: (caller: Caller) => void
  #caller: Caller | null = null
  #sent = false

  constructor(pool: StatementPool, authentication: ReturnType<StatementAuthenticator>, onCaller: (caller: Caller) => void) {
    this.#pool = pool
    this.#authentication = authentication
    this.#onCaller = onCaller
  }

  async #send(query: Query, singleRow: boolean, write?: StatementWrite): Promise<{ rows: Row[]; visible: boolean | null }> {
    if (this.#sent) throw new Error('a single-statement route sent a second query')
    this.#sent = true
    let answer: Awaited<ReturnType<ReturnType<StatementAuthenticator>['send']>>
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
    return answer
  }

  #answered(caller: Caller): void {
    this.#caller = caller
    this.#onCaller(caller)
  }

  /** The query's rows; `singleRow` when the caller expects one row at most (a lighter statement, see wrappedQuery). */
  async #rowsOf(query: Query, singleRow = false): Promise<Row[]> {
    return (await this.#send(query, singleRow)).rows
  }

  /**
   * A write (INSERT, UPDATE or DELETE ... RETURNING, gated on AUTHENTICATED) in the same one
   * statement as authentication. `visible` answers, when the write matched nothing, whether the
   * caller can see its target (403) or not (404); null otherwise.
   */
  async write(query: Query, write: StatementWrite = {}): Promise<{ rows: Row[]; visible: boolean | null }> {
    return this.#send(query, true, write)
  }

  async any(query: Query): Promise<Row[]> {
    return this.#rowsOf(query)
  }

  async anyFirst(query: Query): Promise<unknown[]> {
    return (await this.#rowsOf(query)).map(first)
  }

  async one(query: Query): Promise<Row> {
    return exactlyOne(await this.#rowsOf(query, true), query)
  }

  async oneFirst(query: Query): Promise<unknown> {
    return first(exactlyOne(await this.#rowsOf(query, true), query))
  }

  async maybeOne(query: Query): Promise<Row | null> {
    return atMostOne(await this.#rowsOf(query, true), query)
  }

  async maybeOneFirst(query: Query): Promise<unknown> {
    const row = atMostOne(await this.#rowsOf(query, true), query)
    return row ? first(row) : null
  }

  /** The handler's context: the request's, with this connection as `db` and the caller its statement answered. */
  contextFor(request: Omit<RouteContext, 'db' | 'caller'>): RouteContext {
    return new StatementRouteContext(request, this) as unknown as RouteContext
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
 * A single-statement route's context, whose `caller` is known once the statement answered. Its
 * getter is the class's: as an object literal with a getter, each request's context had a hidden
 * class of its own, which V8 allocates outside the young generation and which pointed at that
 * request's objects, so all of them outlived their first garbage collections (profiled on GET
 * one: 13 % of everything allocated was promoted, and the collector's pauses and helper threads
 * took 3.2 s of CPU in 22 s of load at 8,000 requests a second; see docs/performance.md).
 */
class StatementRouteContext {
  db: DatabaseTransactionConnection
  #statement: SingleStatementConnection

  constructor(request: Omit<RouteContext, 'db' | 'caller'>, statement: SingleStatementConnection) {
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

const first = (row: Row) => row[Object.keys(row)[0]]

function exactlyOne(rows: Row[], query: Query): Row {
  if (rows.length === 0) throw new NotFoundError('Resource not found.', query as never)
  if (rows.length > 1) throw new DataIntegrityError('Query returns more than one row.', query as never)
  return rows[0]
}

function atMostOne(rows: Row[], query: Query): Row | null {
  if (rows.length > 1) throw new DataIntegrityError('Query returns more than one row.', query as never)
  return rows[0] ?? null
}
