// Keyset cursors: the sort values of the last row of a page, so the next page starts strictly
// after it whatever was inserted or deleted meanwhile (an offset would skip or repeat rows).
// Opaque to clients (base64url JSON), but checked like any other input when it comes back:
// a cursor for another sort, or one edited by hand, is a 400.
import { UUID_PATTERN } from './fields.ts'
import type { SortKey } from './list-parameters.ts'
import { InvalidParameterError } from '../errors.ts'

/** Each sort key's value as PostgreSQL text (timestamps as microseconds since the epoch), or null. */
export type Cursor = { values: (string | null)[] }

const NUMERIC = /^-?\d{1,18}(\.\d{1,6})?$/
const INTEGER = /^-?\d{1,10}$/
const MICROSECONDS = /^-?\d{1,17}$/
const DATE = /^\d{4}-\d{2}-\d{2}$/
const FLOAT = /^-?\d+(\.\d+)?(e[-+]?\d+)?$/i

export function encodeCursor(sortText: string, values: (string | null)[]): string {
  return Buffer.from(JSON.stringify({ s: sortText, k: values })).toString('base64url')
}

function invalid(): never {
  throw new InvalidParameterError('cursor is not valid: pass the next_cursor of the previous page unchanged, with the same sort')
}

/** Decodes a cursor for this sort; `keys` is empty for score-ordered search (score, then id). */
export function decodeCursor(text: string, sortText: string, keys: SortKey[]): Cursor {
  if (text.length === 0 || text.length > 4096 || !/^[A-Za-z0-9_-]+$/.test(text)) invalid()
  let payload: unknown
  try {
    payload = JSON.parse(Buffer.from(text, 'base64url').toString('utf8'))
  } catch {
    invalid()
  }
  if (!payload || typeof payload !== 'object' || Array.isArray(payload)) invalid()
  const { s, k } = payload as { s?: unknown; k?: unknown }
  if (s !== sortText) {
    throw new InvalidParameterError('cursor belongs to another sort: keep the sort of the request that returned it')
  }
  const kinds = keys.length === 0 ? ['score', 'uuid'] : keys.map((key) => key.field.kind)
  const nullable = keys.length === 0 ? [false, false] : keys.map((key) => key.field.nullable)
  if (!Array.isArray(k) || k.length !== kinds.length) invalid()
  const values = k.map((value, index) => {
    if (value === null) {
      if (!nullable[index]) invalid()
      return null
    }
    if (typeof value !== 'string' || value.length > 1000) invalid()
    const ok =
      kinds[index] === 'uuid' ? UUID_PATTERN.test(value)
      : kinds[index] === 'numeric' ? NUMERIC.test(value)
      : kinds[index] === 'integer' ? INTEGER.test(value)
      : kinds[index] === 'timestamp' ? MICROSECONDS.test(value)
      : kinds[index] === 'date' ? DATE.test(value)
      : kinds[index] === 'score' ? FLOAT.test(value) && Number.isFinite(Number(value))
      : !/\u0000/.test(value)
    if (!ok) invalid()
    return value
  })
  return { values }
}
