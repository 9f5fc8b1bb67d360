// Paging of every list the API offers (records, search, webhook subscriptions, deliveries): the
// limit parameter, the keyset cursor, and the Link header of the next page. A list's answer is
// `{"data": [...], "next_cursor": ...}` plus `Link: <...>; rel="next"` while there is more.
//
// Keyset cursors hold the sort values of the last row of a page, so the next page starts strictly
// after it whatever was inserted or deleted meanwhile (an offset would skip or repeat rows).
// Opaque to clients (base64url JSON of the sort and its values), but checked like any other input
// when it comes back: a cursor for another sort, or one edited by hand, is a 400.
import { InvalidParameterError } from './errors.ts'
import { UUID_PATTERN } from './uuid.ts'

export const DEFAULT_LIMIT = 50
export const MAX_LIMIT = 200

/** The `limit` and `cursor` query parameters of every paged list, as the OpenAPI document describes them. */
export const PAGING_PARAMETERS = {
  limit: {
    description: `Page size, 1 to ${MAX_LIMIT} (default ${DEFAULT_LIMIT})`,
    schema: { type: 'integer', minimum: 1, maximum: MAX_LIMIT, default: DEFAULT_LIMIT },
  },
  cursor: { description: 'The next_cursor of the previous page (opaque)', schema: { type: 'string' } },
}

/** A page of a list: its rows and the cursor of the next page (null on the last). */
export type Page<T> = { data: T[]; next_cursor: string | null }

/**
 * The page of `rows`, fetched with `limit + 1` so that the extra row tells there is more: the first
 * `limit` rows, and a cursor holding `key` of the last one under `order`.
 */
export function pageOf<T>(rows: readonly T[], limit: number, order: string, key: (row: T) => string): Page<T> {
  const data = rows.slice(0, limit)
  return { data, next_cursor: rows.length > limit ? encodeCursor(order, [key(data[data.length - 1])]) : null }
}

/** The `limit` parameter: a whole number from 1 to `max`; absent or empty means `fallback`. */
export function limitOf(value: string | undefined, fallback = DEFAULT_LIMIT, max = MAX_LIMIT): number {
  if (value === undefined || value === '') return fallback
  if (!/^\d{1,4}$/.test(value) || Number(value) < 1 || Number(value) > max) {
    throw new InvalidParameterError(`limit must be a whole number from 1 to ${max}`)
  }
  return Number(value)
}

/** Each sort key's value as PostgreSQL text (timestamps as microseconds since the epoch), or null. */
export type Cursor = { values: (string | null)[] }

/** What one cursor value must look like: its kind (uuid, numeric, ...; any other kind is text) and whether it may be null. */
export type CursorColumn = { kind: string; nullable: boolean }

const VALUE_FORMATS: Record<string, (value: string) => boolean> = {
  uuid: (value) => UUID_PATTERN.test(value),
  numeric: (value) => /^-?\d{1,18}(\.\d{1,6})?$/.test(value),
  integer: (value) => /^-?\d{1,10}$/.test(value),
  timestamp: (value) => /^-?\d{1,17}$/.test(value),
  date: (value) => /^\d{4}-\d{2}-\d{2}$/.test(value),
  score: (value) => /^-?\d+(\.\d+)?(e[-+]?\d+)?$/i.test(value) && Number.isFinite(Number(value)),
}

export function encodeCursor(sortText: string, values: (string | null)[]): string {
  return Buffer.from(JSON.stringify({ s: sortText, k: values })).toString('base64url')
}

function invalid(): never {
  throw new InvalidParameterError('cursor is not valid: pass the next_cursor of the previous page unchanged, with the same sort')
}

/** Decodes a cursor written by encodeCursor for this sort, checking each value against its column. */
export function decodeCursor(text: string, sortText: string, columns: CursorColumn[]): Cursor {
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
  if (!Array.isArray(k) || k.length !== columns.length) invalid()
  const values = k.map((value, index) => {
    if (value === null) {
      if (!columns[index].nullable) invalid()
      return null
    }
    if (typeof value !== 'string' || value.length > 1000) invalid()
    const format = VALUE_FORMATS[columns[index].kind]
    if (format ? !format(value) : /\u0000/.test(value)) invalid()
    return value
  })
  return { values }
}

/** The URL of the next page: this request's parameters with the new cursor (filter[...] brackets kept readable). */
export function nextLink(path: string, parameters: Map<string, string>, cursor: string): string {
  const next = new Map(parameters)
  next.set('cursor', cursor)
  const query = [...next]
    .map(([name, value]) => `${encodeURIComponent(name).replace(/%5B/g, '[').replace(/%5D/g, ']')}=${encodeURIComponent(value)}`)
    .join('&')
  return `<${path}?${query}>; rel="next"`
}

/** The headers of a page: a Link to the next one while there is more. */
export function pageHeaders(path: string, parameters: Map<string, string>, nextCursor: string | null): Record<string, string> {
  return nextCursor ? { Link: nextLink(path, parameters, nextCursor) } : {}
}
