// An export's response, shared by every export route (records, the audit log): its own statement
// timeout, the headers of a CSV or NDJSON attachment, and the lines streamed by streamLines.
import type { ServerResponse } from 'node:http'
import type { Config } from '../config.ts'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import type { ExportFormat } from './export-query.ts'
import { type LinesQuery, streamLines } from './stream-lines.ts'

/** Streams `query`'s lines as an attachment named `<name>-<today>.<csv|ndjson>`, after the CSV `header` row when there is one. */
export async function streamExport(
  db: DatabaseTransactionConnection,
  res: ServerResponse,
  config: Pick<Config, 'exportTimeoutMs' | 'streamStallMs'>,
  options: { query: LinesQuery; header: string | null; format: ExportFormat; name: string },
): Promise<number> {
  const csv = options.format === 'csv'
  // A million rows sorted for the first fetch can outlast the request transaction's statement
  // timeout, so the export gets its own, transaction-local (the whole stream is bounded too).
  await db.query(sql.unsafe`select set_config('statement_timeout', ${`${config.exportTimeoutMs}ms`}, true)`)
  const head = {
    headers: {
      'Content-Type': csv ? 'text/csv; charset=utf-8' : 'application/x-ndjson',
      'Content-Disposition': `attachment; filename="${options.name}-${new Date().toISOString().slice(0, 10)}.${options.format}"`,
      'Cache-Control': 'no-store',
    },
    prefix: options.header === null ? '' : options.header + '\r\n',
  }
  return streamLines(db, options.query, res, {
    head,
    newline: csv ? '\r\n' : '\n',
    deadlineMs: config.exportTimeoutMs,
    stallMs: config.streamStallMs,
  })
}
