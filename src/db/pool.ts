// The slonik pool the API uses. Values come back as the API shows them: numeric as exact decimal
// strings (money is never a float), bigint as numbers, timestamps as RFC 3339 UTC with milliseconds.

import { createPgDriverFactory } from '@slonik/pg-driver'
import { createPool, type DatabasePool, type DatabaseTransactionConnection, type Interceptor, type QueryResultRow } from 'slonik'
import { checkRow } from './request/rows.ts'

export type { CommonQueryMethods, DatabasePool, DatabaseTransactionConnection } from 'slonik'
export { sql } from 'slonik'

/** PostgreSQL prints timestamptz as `2026-11-22 03:00:21.123456+00`; the API wants `2026-11-22T03:00:21.123Z`. */
export function toApiTime(text: string): string {
  return new Date(text.replace(' ', 'T').replace(/([+-]\d\d)$/, '$1:00')).toISOString()
}

/**
 * How the API reads values, by PostgreSQL type name: numeric as exact decimal strings, bigint as
 * numbers, timestamps in API form, dates as text. Shared by this pool and the plain pg pool of
 * single-statement reads (statement-pool.ts), so both answer alike.
 */
export const API_TYPE_PARSERS = {
  int8: (value: string) => Number(value),
  numeric: (value: string) => value,
  timestamptz: toApiTime,
  timestamp: (value: string) => toApiTime(value + '+00'),
  date: (value: string) => value,
} satisfies Record<string, (value: string) => unknown>

/** Checks each row of a query typed with `sql.type(rowType(...))` (src/db/typed-rows.ts), by the one row contract (request/rows.ts). */
const ROW_SCHEMA_CHECK: Interceptor = {
  name: 'row-schema-check',
  transformRow: (context, query, row) => (context.resultParser ? (checkRow(context.resultParser, query, row) as QueryResultRow) : row),
}

/** A slonik query's text as plain pg takes it (slonik numbers its placeholders $slonik_1, ...). */
export function pgQueryText(slonikSql: string): string {
  return slonikSql.replaceAll('$slonik_', '$')
}

export async function createDatabasePool(
  url: string,
  options: {
    maxPoolSize?: number
    /** Connections kept open when idle (default 0: every idle connection closes after the idle timeout). */
    minPoolSize?: number
    connectionTimeoutMs?: number
    onQuery?: (text: string) => void
    /** Transactions retried on a serialization failure or deadlock (default 3); 0 where the caller decides. */
    transactionRetryLimit?: number
  } = {},
): Promise<DatabasePool> {
  return createPool(url, {
    driverFactory: createPgDriverFactory(),
    maxPoolSize: options.maxPoolSize ?? 20,
    minPoolSize: options.minPoolSize ?? 0,
    // A request waits this long for a free connection, then gets 503 (never an unbounded queue).
    connectionTimeout: options.connectionTimeoutMs ?? 5000,
    // Slonik captures a stack trace per query by default: measurable cost on every request.
    captureStackTrace: false,
    // Slonik runs DISCARD ALL when a connection goes back to the pool: one more round trip per
    // request. Everything this service sets is transaction-local (set_config(..., true)), so
    // there is nothing to discard.
    resetConnection: async () => {},
    // Request transactions are retried by slonik on serialization failures; side effects stay outside.
    transactionRetryLimit: options.transactionRetryLimit ?? 3,
    queryRetryLimit: 0,
    // Slonik would send these as startup parameters, which a pooler in transaction mode refuses or
    // drops. The runtime role carries them as role settings (src/db/runtime-role.ts), and each
    // request transaction sets them again, locally (src/auth/authenticate.ts).
    statementTimeout: 'DISABLE_TIMEOUT',
    idleInTransactionSessionTimeout: 'DISABLE_TIMEOUT',
    interceptors: [
      ROW_SCHEMA_CHECK,
      ...(options.onQuery
        ? [{ name: 'count-queries', beforeQueryExecution: (_context, query) => (options.onQuery?.(query.sql), null) } satisfies Interceptor]
        : []),
    ],
    typeParsers: Object.entries(API_TYPE_PARSERS).map(([name, parse]) => ({ name, parse })),
  })
}

/** Marks the handler's own error in transactionKeepingConnection's answer from the connection. */
const REFUSED = Symbol('the handler threw')

/**
 * `pool.transaction(handler)`, keeping the connection when the handler refused. slonik closes a
 * connection whenever its handler throws, even after a clean ROLLBACK: every request the service
 * answered 4xx from inside its transaction (a policy's refusal, a conflict, a record not found) cost
 * the next request a new connection, a backend to start with its caches and PL/pgSQL functions to
 * build again. In a test of 2,900 calls, most of them refused, the database saw about 17 new
 * sessions a second. Here the handler's own error, once slonik has rolled back without error, comes
 * out after the connection went back to the pool; any other failure (the ROLLBACK's or COMMIT's, a
 * terminated backend, the socket) still closes it, as slonik decides.
 */
export async function transactionKeepingConnection<T>(
  pool: DatabasePool,
  handler: (db: DatabaseTransactionConnection) => Promise<T>,
): Promise<T> {
  const outcome = await pool.connect(async (connection) => {
    let thrown: { error: unknown } | undefined
    try {
      return {
        value: await connection.transaction(async (db) => {
          try {
            return await handler(db)
          } catch (error) {
            thrown = { error }
            throw error
          }
        }),
      }
    } catch (error) {
      if (thrown !== undefined && thrown.error === error) return { [REFUSED]: error }
      throw error
    }
  })
  if (REFUSED in outcome) throw outcome[REFUSED]
  return outcome.value
}
