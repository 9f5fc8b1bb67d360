// The pool single-statement reads run on: plain `pg`, not slonik. Those reads are one named
// statement each (statement-connection.ts) and need none of slonik's per-query machinery
// (interceptor chain, query ids, result normalisation, its own pool queue); measured on GET one,
// skipping it saves about a third of the API process's CPU per request (docs/performance.md).
// Everything else keeps using slonik (src/db/pool.ts). Values come back as slonik's pool returns
// them: numeric as exact strings, bigint as numbers, timestamps as RFC 3339 UTC, dates as text.
import { createHash } from 'node:crypto'
import pg from 'pg'
import { API_TYPE_PARSERS, pgQueryText } from '../pool.ts'

/** A statement's text (pg's $1 placeholders, or slonik's, which are renumbered), values and name. */
export type StatementQuery = {
  sql: string
  values: readonly unknown[]
  name?: string
  /** The user of a statement that writes nothing, which a standby may answer (src/db/request/read-replicas.ts). */
  readOnlyFor?: string
}
export type StatementPool = {
  rows: (query: StatementQuery) => Promise<Record<string, unknown>[]>
  end: () => Promise<void>
}

/**
 * Statement names, by SQL text. A named statement is parsed and planned once per connection and
 * then reused, where an unnamed one is planned on every request (profiled: about a fifth of the
 * database's time for GET one). The texts come from a whitelist of fields and operators and a page
 * size of 1 to 200 (written into the text, see src/records/list-query.ts), so they are finitely
 * many; still, past MAX_NAMED texts the rest go unnamed, which bounds the memory each connection
 * spends on kept plans.
 */
const MAX_NAMED = 256
const statementNames = new Map<string, string>()

/** The statement with its name (the same for the same text), or unnamed past MAX_NAMED texts. */
export function named(query: StatementQuery): StatementQuery {
  let name = statementNames.get(query.sql)
  if (!name) {
    if (statementNames.size >= MAX_NAMED) return query
    name = `read_${createHash('sha256').update(query.sql).digest('hex').slice(0, 24)}`
    statementNames.set(query.sql, name)
  }
  return { sql: query.sql, values: query.values, name, readOnlyFor: query.readOnlyFor }
}

const OIDS: Record<keyof typeof API_TYPE_PARSERS, number> = { int8: 20, numeric: 1700, timestamptz: 1184, timestamp: 1114, date: 1082 }
const PARSERS = new Map<number, (value: string) => unknown>(
  Object.entries(API_TYPE_PARSERS).map(([name, parse]) => [OIDS[name as keyof typeof OIDS], parse]),
)
/**
 * json (not jsonb) comes back as its text, unparsed: a record's JSON is sent to the client as
 * PostgreSQL rendered it, so a statement on this pool selects it without a cast to text (see
 * answersJsonAsText), and the few other json columns are parsed where they are read.
 */
const JSON_OID = 114
PARSERS.set(JSON_OID, (value) => value)
const types = {
  getTypeParser: (oid: number, format?: 'text' | 'binary') =>
    (format !== 'binary' && PARSERS.get(oid)) || pg.types.getTypeParser(oid, format as 'text'),
}

const JSON_AS_TEXT = Symbol('json columns come back as their text')

/** Marks connections (a class's prototype) whose queries run on this pool (statement-connection.ts). */
export function markJsonAsText(connection: object): void {
  Object.defineProperty(connection, JSON_AS_TEXT, { value: true })
}

/**
 * Whether a connection answers json columns as their text (one on this pool) rather than parsed
 * (slonik's): a query selects a record's JSON text as json there, and with `::text` elsewhere.
 */
export function answersJsonAsText(connection: object): boolean {
  return (connection as { [JSON_AS_TEXT]?: boolean })[JSON_AS_TEXT] === true
}

/**
 * The query as a pg Query object: given a config object, pg copies it property by property through
 * their descriptors on every call (profiled at 2-3 % of GET one's API time); from a text it does not.
 * A client runs a Query object as it is (runStatement hands it one with its callback).
 */
function submittable(text: string, values: readonly unknown[], name: string | undefined): pg.QueryConfig {
  const query = new pg.Query(text, values as unknown[])
  if (name !== undefined) (query as { name?: string }).name = name
  return query as unknown as pg.QueryConfig
}

/**
 * Runs one statement on a connection of the pool and gives the connection back, kept when
 * PostgreSQL answered with an error of the statement. pg's own `Pool.query` closes a connection
 * after any error: every request the database refused (a policy's 42501, a constraint's 23505, a
 * rule's exception) cost the next request a new connection, a backend to start with its caches and
 * PL/pgSQL functions to build again. In a test of 2,900 calls, most of them refused, the database
 * saw about 17 new sessions a second. A statement of this pool runs alone in its own implicit
 * transaction, so after an ERROR the connection is as it was before; anything else (the socket,
 * the protocol, a FATAL) still closes it.
 */
async function runStatement(pool: pg.Pool, query: pg.QueryConfig): Promise<pg.QueryResult> {
  const client = await pool.connect()
  let broken: Error | undefined
  // A connection that dies while taken says so as an 'error' event too (pg's Pool.query listens the
  // same way): unheard, it would end the process.
  const onBroken = (error: Error) => {
    broken ??= error
  }
  client.on('error', onBroken)
  try {
    return await new Promise<pg.QueryResult>((resolve, reject) => {
      client.query(query, ((error: Error | null, result: pg.QueryResult) => (error ? reject(error) : resolve(result))) as never)
    })
  } catch (error) {
    if (!(error instanceof pg.DatabaseError && error.severity === 'ERROR')) broken ??= error as Error
    throw error
  } finally {
    client.removeListener('error', onBroken)
    client.release(broken)
  }
}

/** invalid_sql_statement_name (the name is not prepared here) and duplicate_prepared_statement. */
const LOST_NAMED_STATEMENT = new Set(['26000', '42P05'])

/** A connection that refused or timed out while being taken: the API answers 503 for it. */
export class StatementPoolUnavailable extends Error {
  code = '08006'
}

export function createStatementPool(
  url: string,
  options: {
    maxPoolSize: number
    connectionTimeoutMs?: number
    onQuery?: (text: string) => void
    onError?: (error: Error) => void
    onWarning?: (message: string) => void
  },
): StatementPool {
  const pool = new pg.Pool({
    // No startup parameters: a pooler in transaction mode refuses or drops them. The role is the
    // URL's login role, which each statement proves confined (crm.require_confined_role), and the
    // limits are that role's settings (src/db/runtime-role.ts).
    connectionString: url,
    max: options.maxPoolSize,
    // One connection outlives the 10 s idle timeout: the first read after a quiet spell (a long
    // poll's wake, above all) would otherwise pay a new connection, 85-129 ms on a busy machine.
    min: 1,
    connectionTimeoutMillis: options.connectionTimeoutMs ?? 5000,
    types,
  })
  let namedStatements = true
  // An idle connection that breaks (the database restarting) must not take the process down.
  pool.on('error', (error) => options.onError?.(error))
  return {
    rows: async (query) => {
      const text = query.sql.includes('$slonik_') ? pgQueryText(query.sql) : query.sql
      options.onQuery?.(text)
      let result: pg.QueryResult
      try {
        result = await runStatement(pool, submittable(text, query.values, namedStatements ? query.name : undefined))
      } catch (error) {
        if (namedStatements && query.name && LOST_NAMED_STATEMENT.has((error as { code?: string }).code ?? '')) {
          // A pooler in transaction mode runs each statement on any of its server connections,
          // where a name prepared on another is missing (or taken): nothing ran, so the statement
          // is sent again, unnamed, and so is every later one.
          namedStatements = false
          options.onWarning?.(
            `named statements do not survive these connections (a pooler?): ${(error as Error).message}; reads are sent unnamed from now on`,
          )
          return (await runStatement(pool, submittable(text, query.values, undefined))).rows
        }
        if (
          error instanceof Error &&
          !('code' in error) &&
          /timeout exceeded when trying to connect|Connection terminated/i.test(error.message)
        ) {
          throw Object.assign(new StatementPoolUnavailable(error.message), { cause: error })
        }
        throw error
      }
      return result.rows
    },
    end: () => pool.end(),
  }
}
