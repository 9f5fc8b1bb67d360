// The database connection a single-statement route sees: it accepts one query, sends it together
// with authentication as one statement (see createStatementAuthenticator), and answers with the
// route's rows as slonik would. A second query is a programming error: it would run outside the
// statement's implicit transaction and without the caller's context.
import { createHash } from 'node:crypto'
import { DataIntegrityError, NotFoundError, sql } from 'slonik'
import type { Caller, StatementAuthenticator } from '../auth/authenticate.ts'
import type { DatabasePool, DatabaseTransactionConnection } from '../db/pool.ts'
import type { StatementPool, StatementQuery } from '../db/statement-pool.ts'

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

function named(query: { sql: string; values: readonly unknown[] }): StatementQuery {
  let name = statementNames.get(query.sql)
  if (!name) {
    if (statementNames.size >= MAX_NAMED) return query
    name = `read_${createHash('sha256').update(query.sql).digest('hex').slice(0, 24)}`
    statementNames.set(query.sql, name)
  }
  return { sql: query.sql, values: query.values, name }
}

export function singleStatementConnection(
  pool: StatementPool,
  authentication: ReturnType<StatementAuthenticator>,
  onCaller: (caller: Caller) => void,
) {
  let caller: Caller | null = null
  let sent = false

  const rowsOf = async (query: Query): Promise<Row[]> => {
    if (sent) throw new Error('a single-statement route sent a second query')
    sent = true
    const answer = authentication.unwrap(await pool.rows(named(authentication.wrap(query as never))))
    caller = answer.caller
    onCaller(caller)
    return answer.rows
  }
  const first = (row: Row) => row[Object.keys(row)[0]]
  const exactlyOne = (rows: Row[], query: Query): Row => {
    if (rows.length === 0) throw new NotFoundError('Resource not found.', query as never)
    if (rows.length > 1) throw new DataIntegrityError('Query returns more than one row.', query as never)
    return rows[0]
  }
  const atMostOne = (rows: Row[], query: Query): Row | null => {
    if (rows.length > 1) throw new DataIntegrityError('Query returns more than one row.', query as never)
    return rows[0] ?? null
  }

  const connection = {
    any: async (query: Query) => rowsOf(query),
    anyFirst: async (query: Query) => (await rowsOf(query)).map(first),
    one: async (query: Query) => exactlyOne(await rowsOf(query), query),
    oneFirst: async (query: Query) => first(exactlyOne(await rowsOf(query), query)),
    maybeOne: async (query: Query) => atMostOne(await rowsOf(query), query),
    maybeOneFirst: async (query: Query) => {
      const row = atMostOne(await rowsOf(query), query)
      return row ? first(row) : null
    },
  }
  return {
    connection: connection as unknown as DatabaseTransactionConnection,
    /**
     * For a handler that failed before sending its query (a malformed id, a bad filter):
     * authenticate on its own, so a bad token still answers 401 first and the request is counted.
     */
    authenticateIfNotSent: async (): Promise<void> => {
      if (!sent) await rowsOf(sql.unsafe`select null where false`)
    },
    caller: (): Caller => {
      if (!caller) throw new Error('a single-statement route read the caller before its query')
      return caller
    },
  }
}
