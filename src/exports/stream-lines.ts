// Writes the `line` column of a query to an HTTP response as the rows arrive. slonik streams
// through a server-side cursor (pg-query-stream) and honours backpressure: a slow client pauses
// the cursor, so memory holds about one fetch plus one 64 KiB chunk whatever the row count.
import type { ServerResponse } from 'node:http'
import { Transform } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import type { QuerySqlToken } from 'slonik'
import Type, { type Static } from 'typebox'
import type { DatabaseTransactionConnection } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'

const CHUNK_CHARACTERS = 64 * 1024

const LineSchema = Type.Object({ line: Type.String() })
/** A row of a streamed query: one finished line of text, without its line break. */
export const LineRow = rowType(LineSchema)
export type LinesQuery = QuerySqlToken<typeof LineRow>

export async function streamLines(
  db: DatabaseTransactionConnection,
  query: LinesQuery,
  res: ServerResponse,
  newline: string,
): Promise<number> {
  let rows = 0
  let piping: Promise<void> | null = null
  await db.stream(query, (stream) => {
    let buffer = ''
    const lines = new Transform({
      writableObjectMode: true,
      transform(row: { data: Static<typeof LineSchema> }, _encoding, callback) {
        buffer += row.data.line + newline
        rows++
        if (buffer.length < CHUNK_CHARACTERS) return callback()
        const chunk = buffer
        buffer = ''
        callback(null, chunk)
      },
      flush(callback) {
        callback(null, buffer)
      },
    })
    piping = pipeline(stream, lines, res)
    // Handled below; avoids an unhandled rejection when the query fails first.
    piping.catch(() => {})
  })
  if (piping) await piping
  return rows
}
