// Turns a checked ListRequest into one SQL statement: filters, keyset condition, order and limit.
// Identifiers come only from the whitelist in fields.ts; values are bound parameters, each cast to
// its field's type. Row-level security adds the workspace and the caller's scope by itself.
import Type from 'typebox'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { type Cursor, encodeCursor } from '../paging.ts'
import { type FieldKind, type FieldSpec, ID_FIELD, type RecordType } from './fields.ts'
import type { Filter, ListRequest, SortKey } from './list-parameters.ts'

type Fragment = ReturnType<typeof sql.fragment>

const TYPE_NAME: Record<Exclude<FieldKind, 'json'>, string> = {
  text: 'text',
  lowercase: 'text',
  uuid: 'uuid',
  numeric: 'numeric',
  integer: 'int4',
  date: 'date',
  timestamp: 'timestamptz',
}

const CAST: Record<Exclude<FieldKind, 'json'>, Fragment> = {
  text: sql.fragment`text`,
  lowercase: sql.fragment`text`,
  uuid: sql.fragment`uuid`,
  numeric: sql.fragment`numeric`,
  integer: sql.fragment`int4`,
  date: sql.fragment`date`,
  timestamp: sql.fragment`timestamptz`,
}

export function column(field: FieldSpec): Fragment {
  return sql.fragment`${sql.identifier(['t', field.name])}`
}

function typed(kind: FieldKind, value: string): Fragment {
  return sql.fragment`${value}::${CAST[kind as Exclude<FieldKind, 'json'>]}`
}

export function escapeLike(text: string): string {
  return text.replace(/[\\%_]/g, (character) => `\\${character}`)
}

/** The JSON values a custom field equality may mean: "42" matches 42 and "42", "true" matches true. */
export function customFieldCandidates(value: string): (string | number | boolean | null)[] {
  const candidates: (string | number | boolean | null)[] = [value]
  if (/^-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?$/.test(value) && Number.isFinite(Number(value))) candidates.push(Number(value))
  if (value === 'true') candidates.push(true)
  if (value === 'false') candidates.push(false)
  if (value === 'null') candidates.push(null)
  return candidates
}

export function filterCondition(filter: Filter): Fragment {
  if (filter.kind === 'custom') {
    const alternatives = customFieldCandidates(filter.value).map(
      (candidate) => sql.fragment`t.custom_fields @> ${sql.jsonb({ [filter.key]: candidate })}`,
    )
    return sql.fragment`(${sql.join(alternatives, sql.fragment` or `)})`
  }
  const col = column(filter.field)
  const kind = filter.field.kind
  const [value] = filter.values
  switch (filter.op) {
    case 'eq':
      return sql.fragment`${col} = ${typed(kind, value)}`
    case 'ne':
      return sql.fragment`${col} is distinct from ${typed(kind, value)}`
    case 'lt':
      return sql.fragment`${col} < ${typed(kind, value)}`
    case 'lte':
      return sql.fragment`${col} <= ${typed(kind, value)}`
    case 'gt':
      return sql.fragment`${col} > ${typed(kind, value)}`
    case 'gte':
      return sql.fragment`${col} >= ${typed(kind, value)}`
    case 'in':
      return sql.fragment`${col} = any(${sql.array(filter.values, TYPE_NAME[kind as Exclude<FieldKind, 'json'>])})`
    case 'contains':
      return sql.fragment`${col} ilike ${`%${escapeLike(value)}%`}`
    case 'starts_with':
      return sql.fragment`${col} ilike ${`${escapeLike(value)}%`}`
    case 'is_null':
      return filter.isNull ? sql.fragment`${col} is null` : sql.fragment`${col} is not null`
  }
}

/** One key of an order: its expression, direction, and how a cursor value is written and read back. */
type OrderKey = {
  expression: Fragment
  descending: boolean
  nullable: boolean
  /** The key's value (the expression, or the column that carries it out of a subquery) as cursor text. */
  asText: (value: Fragment) => Fragment
  fromText: (value: string) => Fragment
}

function orderKey(key: SortKey): OrderKey {
  const expression = column(key.field)
  const kind = key.field.kind
  if (kind === 'timestamp') {
    // Microseconds since the epoch: exact (the API's JSON keeps only milliseconds).
    return {
      expression,
      descending: key.descending,
      nullable: key.field.nullable,
      asText: (value) => sql.fragment`((extract(epoch from ${value}) * 1000000)::bigint)::text`,
      fromText: (value) => sql.fragment`(timestamptz 'epoch' + ${value}::bigint * interval '1 microsecond')`,
    }
  }
  return {
    expression,
    descending: key.descending,
    nullable: key.field.nullable,
    asText: kind === 'date' ? (value) => sql.fragment`to_char(${value}, 'YYYY-MM-DD')` : (value) => sql.fragment`${value}::text`,
    fromText: (value) => typed(kind, value),
  }
}

export function orderKeys(request: ListRequest, score: Fragment | null): OrderKey[] {
  if (request.sort.length > 0) return request.sort.map(orderKey)
  // Search without an explicit sort: best score first, then id.
  const scoreExpression = score ?? sql.fragment`0::float8`
  return [
    {
      expression: scoreExpression,
      descending: true,
      nullable: false,
      asText: (value) => sql.fragment`(${value})::text`,
      fromText: (value) => sql.fragment`${value}::float8`,
    },
    orderKey({ field: ID_FIELD, descending: false }),
  ]
}

/**
 * Rows strictly after the cursor in this order. Nulls sort last in either direction, so a null
 * cursor value only ties with nulls. When no key can be null and all run the same way, this is a
 * row comparison, which a matching index answers with one range scan.
 */
export function keysetCondition(keys: OrderKey[], cursor: Cursor): Fragment {
  const values = cursor.values
  const sameDirection = keys.every((key) => key.descending === keys[0].descending)
  if (sameDirection && keys.every((key, index) => !key.nullable && values[index] !== null)) {
    const left = sql.join(
      keys.map((key) => key.expression),
      sql.fragment`, `,
    )
    const right = sql.join(
      keys.map((key, index) => key.fromText(values[index] as string)),
      sql.fragment`, `,
    )
    return keys[0].descending ? sql.fragment`((${left}) < (${right}))` : sql.fragment`((${left}) > (${right}))`
  }
  const alternatives: Fragment[] = []
  for (let i = 0; i < keys.length; i++) {
    const value = values[i]
    if (value === null) continue // nothing sorts after null in this key; ties are handled by later keys
    const key = keys[i]
    const after = key.descending
      ? sql.fragment`${key.expression} < ${key.fromText(value)}`
      : sql.fragment`${key.expression} > ${key.fromText(value)}`
    const conditions: Fragment[] = keys
      .slice(0, i)
      .map((previous, j) =>
        values[j] === null
          ? sql.fragment`${previous.expression} is null`
          : sql.fragment`${previous.expression} = ${previous.fromText(values[j] as string)}`,
      )
    conditions.push(key.nullable ? sql.fragment`(${after} or ${key.expression} is null)` : after)
    alternatives.push(sql.fragment`(${sql.join(conditions, sql.fragment` and `)})`)
  }
  return alternatives.length === 0 ? sql.fragment`false` : sql.fragment`(${sql.join(alternatives, sql.fragment` or `)})`
}

export function orderByClause(keys: OrderKey[]) {
  return sql.join(
    keys.map((key) => (key.descending ? sql.fragment`${key.expression} desc nulls last` : sql.fragment`${key.expression} asc nulls last`)),
    sql.fragment`, `,
  )
}

export type SearchPart = { where: Fragment; score: Fragment }

/**
 * A page as one row: `records`, the scanned rows' records as their JSON texts joined by U+001E
 * (null when nothing was found), `found`, how many rows the scan gave (one more than the page size
 * when a next page exists), and `cursor`, the page's last row's sort values as a JSON array's text
 * (only when a next page exists). runList cuts the extra row's record off and joins the rest with
 * commas: U+001E never occurs in JSON text (a control character inside a string is escaped, and
 * outside strings only spaces, tabs and line breaks are allowed), so the last one is the cut.
 *
 * The page's rows leave the scan with their sort keys as plain values (never rendered as text). One
 * level out, plain aggregates take them in the scan's order: `string_agg` of the records' texts
 * (a json value's text is the value itself, no function runs) and `array_agg` of each key, of
 * which the page's last row's element is rendered. Neither aggregate has an ORDER BY: the
 * subquery's LIMIT keeps it a subquery of its own, nothing (no join, no grouping) stands between
 * its sorted rows and the aggregates, and every aggregate reads each row in the same pass, so the
 * texts and the keys follow the scan's order together. Measured with pgbench (200,000 deals, the
 * statement alone, µs per statement): an ORDER BY in the aggregates sorts the page again before
 * PostgreSQL 16 (PostgreSQL 15: 276 → 330); the window that numbered the rows and `json_agg` cost
 * the rest of the old shape's 68 µs more than this one on 15 (349 → 280; the bare query: 272) and
 * 89 µs on 18 (562 → 473; the bare query: 471).
 */
export function listQuery(type: RecordType, request: ListRequest, search: SearchPart | null = null) {
  // Built when needed: a kept frame without a cursor needs no order keys.
  let keys: OrderKey[] | undefined
  const keysOf = () => (keys ??= orderKeys(request, search?.score ?? null))
  const conditions: Fragment[] = request.filters.map(filterCondition)
  if (search) conditions.push(search.where)
  if (request.cursor) conditions.push(keysetCondition(keysOf(), request.cursor))
  // A fragment of its own (a join has no text until embedded): its text names the cached statement.
  const where = conditions.length > 0 ? sql.fragment`${sql.join(conditions, sql.fragment` and `)}` : sql.fragment`true`
  if (search) {
    // A search's order holds its score, whose text is a bound value: its frame is built each time.
    const { before, after } = pageFrame(type, request, keysOf())
    return sql.type(PageRow)`${before} ${where} ${after}`
  }
  return cachedListStatement(type, request, keysOf, where)
}

/**
 * A list statement by its frame and its conditions' text, composed once and then bound to each
 * request's values: slonik renumbers the placeholders of every fragment it embeds with a regular
 * expression over the fragment's whole text, and the frame's text is long (profiled on list 50:
 * composing it cost more than the rest of slonik's work per list). The text depends only on the
 * frame and the conditions' text (which fixes how many values each part has), so the values are
 * put together directly, in slonik's order, checked against slonik's own on the first build. The
 * condition texts come from the whitelist of fields and operators, the length of an `in` list
 * aside; past MAX_LIST_STATEMENTS the rest are composed each time.
 */
const listStatements = new Map<string, ReturnType<typeof composeListStatement>>()
const MAX_LIST_STATEMENTS = 1024

function composeListStatement(frame: PageFrame, where: Fragment) {
  return sql.type(PageRow)`${frame.before} ${where} ${frame.after}`
}

function cachedListStatement(type: RecordType, request: ListRequest, keysOf: () => OrderKey[], where: Fragment) {
  const frame = cachedPageFrame(type, request, keysOf)
  const name = `${frameName(type, request)}\n${where.sql}`
  const values = [...frame.before.values, ...where.values, ...frame.after.values]
  const kept = listStatements.get(name)
  if (kept) return { ...kept, values }
  const built = composeListStatement(frame, where)
  if (built.values.length !== values.length || built.values.some((value, index) => value !== values[index])) {
    throw new Error("a list statement's values are not in slonik's order")
  }
  if (listStatements.size < MAX_LIST_STATEMENTS) listStatements.set(name, built)
  return built
}

type PageFrame = { before: Fragment; after: Fragment }

/**
 * A list statement's text around its WHERE conditions depends on the record type, the sort and the
 * page size only, so it is built once per combination (profiled: slonik 26 → 8 µs of the API
 * process per list). The combinations are bounded by the whitelist and the page size;
 * past MAX_PAGE_FRAMES the rest are built each time.
 */
const pageFrames = new Map<string, PageFrame>()
const MAX_PAGE_FRAMES = 512

function frameName(type: RecordType, request: ListRequest): string {
  return `${type.name} ${request.sortText} ${request.limit}`
}

function cachedPageFrame(type: RecordType, request: ListRequest, keysOf: () => OrderKey[]): PageFrame {
  const name = frameName(type, request)
  let frame = pageFrames.get(name)
  if (!frame) {
    frame = pageFrame(type, request, keysOf())
    if (pageFrames.size < MAX_PAGE_FRAMES) pageFrames.set(name, frame)
  }
  return frame
}

function pageFrame(type: RecordType, request: ListRequest, keys: OrderKey[]): PageFrame {
  const size = pageLimit(request.limit)
  const lastKey = (index: number) => sql.fragment`${sql.identifier(['l', `last_key_${index}`])}`
  return {
    before: sql.fragment`
    select l.records, l.found,
           case when l.found > ${size}
                then json_build_array(${sql.join(
                  keys.map((key, index) => key.asText(lastKey(index))),
                  sql.fragment`, `,
                )})::text
           end as cursor
      from (select string_agg(p.record::text, ${RECORD_SEPARATOR}) as records,
                   count(*) as found,
                   ${sql.join(
                     keys.map(
                       (_, index) =>
                         sql.fragment`(array_agg(${sql.identifier(['p', `cursor_key_${index}`])}))[${size}] as ${sql.identifier([`last_key_${index}`])}`,
                     ),
                     sql.fragment`, `,
                   )}
              from (select ${type.jsonFunction}(t) as record, ${sql.join(
                keys.map((key, index) => sql.fragment`${key.expression} as ${sql.identifier([`cursor_key_${index}`])}`),
                sql.fragment`, `,
              )}
                      from ${type.table} as t
                     where`,
    after: sql.fragment`
                     order by ${orderByClause(keys)}
                     limit ${pageLimit(request.limit + 1)}) as p) as l`,
  }
}

/** Between the records' texts in a page's row: a character no JSON text holds (see listQuery). */
const SEPARATOR = '\u001e'
const RECORD_SEPARATOR = sql.fragment`chr(30)`

/**
 * The LIMIT is written into the text, not sent as a parameter: with a parameter PostgreSQL's
 * generic plan assumes a tenth of the rows, so a prepared list statement kept being planned again
 * on every request (profiled: about a fifth of the database's time for a list). With the number in
 * the text, the named statement settles on its generic plan after five runs like GET one does. The
 * page size is an integer from 1 to 200 (parseListRequest), so at most 200 texts per filter shape.
 */
function pageLimit(rows: number): Fragment {
  if (!Number.isInteger(rows) || rows < 1 || rows > 1000) throw new Error(`page limit out of range: ${rows}`)
  return sql.literalValue(String(rows))
}

/** A page: its records as one JSON array's text (PostgreSQL renders each record; Node cuts and joins their texts, never parsing them). */
export type Page = { records: string; next_cursor: string | null }

const PageRow = rowType(
  Type.Object({
    records: Type.Union([Type.String(), Type.Null()]),
    found: Type.Number(),
    cursor: Type.Union([Type.String(), Type.Null()]),
  }),
)

export async function runList(
  db: DatabaseTransactionConnection,
  type: RecordType,
  request: ListRequest,
  search: SearchPart | null = null,
): Promise<Page> {
  const page = await db.one(listQuery(type, request, search))
  const more = page.found > request.limit
  return {
    records: pageRecords(page.records, more),
    next_cursor: more ? encodeCursor(request.sortText, lastCursor(page.cursor)) : null,
  }
}

/** The page's records as a JSON array's text: the extra row's record cut off, the rest joined by commas. */
function pageRecords(records: string | null, more: boolean): string {
  if (records === null) return '[]'
  const kept = more ? records.slice(0, records.lastIndexOf(SEPARATOR)) : records
  return `[${kept.replaceAll(SEPARATOR, ',')}]`
}

function lastCursor(values: string | null): (string | null)[] {
  if (values === null) throw new Error("a list page's last row came without its sort values")
  return JSON.parse(values) as (string | null)[]
}

/** The page's body, `{"data":[...],"next_cursor":...}`, as JSON text. */
export function pageJson(page: Page): string {
  return `{"data":${page.records},"next_cursor":${JSON.stringify(page.next_cursor)}}`
}
