// The pool single-statement reads run on: plain `pg`, not slonik. Those reads are one named
// statement each (single-statement.ts of the HTTP layer) and need none of slonik's per-query machinery
// (interceptor chain, query ids, result normalisation, its own pool queue); measured on GET one,
// skipping it saves about a third of the API process's CPU per request (README, "Performance").
// Everything else keeps using slonik (src/db/pool.ts). Values come back as slonik's pool returns
// them: numeric as exact strings, bigint as numbers, timestamps as RFC 3339 UTC, dates as text.
import pg from 'pg'
import { API_TYPE_PARSERS, pgQueryText, withSessionRole } from './pool.ts'

export type StatementQuery = { sql: string; values: readonly unknown[]; name?: string }
export type StatementPool = {
  rows: (query: StatementQuery) => Promise<Record<string, unknown>[]>
  end: () => Promise<void>
}

const OIDS: Record<keyof typeof API_TYPE_PARSERS, number> = { int8: 20, numeric: 1700, timestamptz: 1184, timestamp: 1114, date: 1082 }
const PARSERS = new Map<number, (value: string) => unknown>(
  Object.entries(API_TYPE_PARSERS).map(([name, parse]) => [OIDS[name as keyof typeof OIDS], parse]),
)
const types = {
  getTypeParser: (oid: number, format?: 'text' | 'binary') =>
    (format !== 'binary' && PARSERS.get(oid)) || pg.types.getTypeParser(oid, format as 'text'),
}

/** A connection that refused or timed out while being taken: the API answers 503 for it. */
export class StatementPoolUnavailable extends Error {
  code = '08006'
}

export function createStatementPool(
  url: string,
  options: {
    maxPoolSize: number
    connectionTimeoutMs?: number
    sessionRole: string
    onQuery?: (text: string) => void
    onError?: (error: Error) => void
  },
): StatementPool {
  const pool = new pg.Pool({
    connectionString: withSessionRole(url, options.sessionRole),
    max: options.maxPoolSize,
    connectionTimeoutMillis: options.connectionTimeoutMs ?? 5000,
    statement_timeout: 30_000,
    idle_in_transaction_session_timeout: 60_000,
    types,
  })
  // An idle connection that breaks (the database restarting) must not take the process down.
  pool.on('error', (error) => options.onError?.(error))
  return {
    rows: async (query) => {
      const text = pgQueryText(query.sql)
      options.onQuery?.(text)
      let result: pg.QueryResult
      try {
        result = await pool.query({ text, values: query.values as unknown[], name: query.name })
      } catch (error) {
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
