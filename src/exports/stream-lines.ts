// Writes the `line` column of a query to an HTTP response, a fetch of rows at a time from a cursor
// of the request transaction, waiting for the client to drain each 64 KiB chunk: a slow client
// pauses the fetches, so memory holds about one fetch plus one chunk whatever the row count.
//
// The cursor is our own (DECLARE, FETCH) rather than a driver stream: when the client goes away in
// the middle, the next write fails, the handler throws and the transaction rolls back on a
// connection that is between statements. A driver stream cut in the middle left its portal
// half-read and the ROLLBACK queued behind it, and the connection never came back to the pool
// (test/hostile/slow-readers.test.ts).
//
// A client that stays connected but stops reading is cut too: when a chunk has waited
// STREAM_STALL_MS for the socket to take it (the response's buffer full the whole time, not one
// chunk read), the response is destroyed, the handler throws, the transaction rolls back and the
// stream's slots are freed. Without it such a client kept a connection and a STREAMS_PER_PROCESS
// slot until EXPORT_TIMEOUT_MS (30 minutes).
import type { ServerResponse } from 'node:http'
import type { QuerySqlToken } from 'slonik'
import Type from 'typebox'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { ClientWentAwayError } from '../errors.ts'

const CHUNK_CHARACTERS = 64 * 1024
/** Rows per FETCH (written into its text: FETCH takes no parameter). */
const FETCH_ROWS = 1000

const LineSchema = Type.Object({ line: Type.String() })
/** A row of a streamed query: one finished line of text, without its line break. */
export const LineRow = rowType(LineSchema)
export type LinesQuery = QuerySqlToken<typeof LineRow>

/** The response's status line and headers, and the text before the first line (a CSV header row). */
export type StreamHead = { headers: Record<string, string>; prefix: string }

/**
 * Streams the query's lines and ends the response; past `deadlineMs` (slow readers included), or
 * when one chunk waits `stallMs` for the client to take it, the response is cut. The head goes out
 * with the first fetch's lines, once the query has answered: until then a failure can still be
 * answered (or the read run elsewhere: src/http/app.ts), and
 * after it the response is chunked, so a stream cut short lacks its last chunk and the client sees
 * a failed transfer, not a shorter file. Throws ClientWentAwayError when the client is gone before
 * the end.
 */
export async function streamLines(
  db: DatabaseTransactionConnection,
  query: LinesQuery,
  res: ServerResponse,
  options: { head: StreamHead; newline: string; deadlineMs: number; stallMs: number },
): Promise<number> {
  const { head, newline, stallMs } = options
  const deadline = setTimeout(() => res.destroy(), options.deadlineMs)
  try {
    await db.query(sql.unsafe`declare stream_lines no scroll cursor for ${query}`)
    let rows = 0
    let buffer = head.prefix
    for (;;) {
      const lines = await db.anyFirst(sql.type(LineRow)`fetch forward 1000 from stream_lines`)
      if (!res.headersSent) {
        res.writeHead(200, head.headers)
        res.flushHeaders()
      }
      for (const line of lines) {
        buffer += line + newline
        if (buffer.length >= CHUNK_CHARACTERS) {
          await write(res, buffer, stallMs)
          buffer = ''
        }
      }
      rows += lines.length
      if (lines.length < FETCH_ROWS) break
    }
    await write(res, buffer, stallMs)
    res.end()
    return rows
  } finally {
    clearTimeout(deadline)
  }
}

/** The client closed the connection before the whole stream was written. */
class ReaderWentAwayError extends ClientWentAwayError {
  constructor() {
    super(null)
    this.message = 'The client closed the connection before the whole response was written'
  }
}

/** The client kept the connection but took nothing for the stall bound: the stream was cut. */
class ReaderStalledError extends ClientWentAwayError {
  constructor(stallMs: number) {
    super(null)
    this.message = `The client read nothing of the response for ${stallMs} ms: the stream was cut`
  }
}

/**
 * Writes a chunk and waits until the response has room again; fails once the client is gone, or
 * cuts the response when it has had no room for `stallMs`.
 */
function write(res: ServerResponse, chunk: string, stallMs: number): Promise<void> {
  if (res.destroyed) return Promise.reject(new ReaderWentAwayError())
  if (res.write(chunk)) return Promise.resolve()
  return new Promise((resolve, reject) => {
    const settle = (error?: Error) => {
      clearTimeout(stalled)
      res.off('drain', onDrain)
      res.off('close', onClose)
      if (error) reject(error)
      else resolve()
    }
    const onDrain = () => settle()
    const onClose = () => settle(new ReaderWentAwayError())
    const stalled = setTimeout(() => {
      settle(new ReaderStalledError(stallMs))
      res.destroy()
    }, stallMs)
    res.once('drain', onDrain)
    res.once('close', onClose)
  })
}
