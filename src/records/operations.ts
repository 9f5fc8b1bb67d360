// Read, create, update and delete one record, in the caller's transaction (as crm_api, so RLS
// decides). A write that touches no row is told apart afterwards: still visible → 403, else 404.
// The queries name only the id: the policies add workspace_id = (select crm.current_workspace_id()),
// which with the id makes the primary-key lookup. Repeating it here would evaluate the request
// context helpers once more per statement (measured: ~0.25 ms each, see bench/records.ts).
import { hash } from 'node:crypto'
import Type from 'typebox'
import { AUTHENTICATED } from '../auth/authenticate.ts'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { oneStatementOf } from '../db/request/statement-connection.ts'
import { answersJsonAsText } from '../db/request/statement-pool.ts'
import { ExistsRow, IdRow, rowType } from '../db/typed-rows.ts'
import { ForbiddenError, NotFoundError, PreconditionFailedError, ValidationError } from '../errors.ts'
import { UUID_PATTERN } from '../uuid.ts'
import type { RecordType } from './fields.ts'
import { isValidDate } from './list-parameters.ts'
import { MONEY_PATTERN } from './schemas.ts'

type Fragment = ReturnType<typeof sql.fragment>

/** A record as crm.<type>_json renders it: every field of the type (schemas.ts has them all); the code here reads its id. */
export type RecordJson = Record<string, unknown> & { id: string }
/**
 * A record as the JSON text crm.<type>_json renders: GET one sends it as it is and every ETag is a
 * hash of it, so the same row gives the same tag whichever route rendered it.
 */
const RecordRow = rowType(Type.Object({ record: Type.String() }))
const IdRecordRow = rowType(Type.Object({ id: Type.String(), record: Type.String() }))

/** A strong ETag over the record's JSON text: it changes exactly when the representation does (one-shot hash, no Hash object). */
export function etagOf(recordText: string): string {
  return `"${hash('sha256', recordText, 'base64url').slice(0, 27)}"`
}

/** RFC 9110 If-Match: "*" or a list of strong tags; weak tags never match. */
export function ifMatchAccepts(header: string, etag: string): boolean {
  const text = header.trim()
  if (text === '*') return true
  return text.split(',').some((tag) => tag.trim() === etag)
}

/** A path id that is not a UUID names no record: 404, like an unknown one. */
export function checkId(id: string | undefined): string {
  if (!id || !UUID_PATTERN.test(id)) throw new NotFoundError()
  return id.toLowerCase()
}

/**
 * The record's JSON text as a column of `t`: json as it is on a connection that answers json as
 * text (the single-statement path), else cast to text (slonik would parse json). Either way the
 * text is the one PostgreSQL rendered, so its ETag is the same on both paths.
 */
function recordText(db: DatabaseTransactionConnection, type: RecordType) {
  return answersJsonAsText(db) ? sql.fragment`${type.jsonFunction}(t)` : sql.fragment`${type.jsonFunction}(t)::text`
}

/**
 * One record by id, or null, under the caller's policies. GET one is a single-statement route, so
 * this SELECT travels as a named statement and is planned once per connection.
 */
export async function readRecord(db: DatabaseTransactionConnection, type: RecordType, id: string): Promise<string | null> {
  return db.maybeOneFirst({ ...readQuery(db, type), values: [id] })
}

/**
 * readRecord's query by record type and connection kind, built once with slonik and then bound to
 * each request's id (profiled: building it on every read cost slonik's tag, its identifiers'
 * escaping and a fragment per GET one).
 */
const readQueries = new Map<string, ReturnType<typeof buildReadQuery>>()

function readQuery(db: DatabaseTransactionConnection, type: RecordType) {
  const key = `${type.name} ${answersJsonAsText(db)}`
  let query = readQueries.get(key)
  if (!query) {
    query = buildReadQuery(db, type)
    readQueries.set(key, query)
  }
  return query
}

function buildReadQuery(db: DatabaseTransactionConnection, type: RecordType) {
  const anyId = '00000000-0000-0000-0000-000000000000'
  return sql.type(RecordRow)`select ${recordText(db, type)} as record from ${type.table} t where t.id = ${anyId}::uuid`
}

async function isVisible(db: DatabaseTransactionConnection, type: RecordType, id: string): Promise<boolean> {
  return db.oneFirst(sql.type(ExistsRow)`
    select exists (select from ${type.table} as t where t.id = ${id})`)
}

/** After a write matched nothing: 403 when the caller can see the record, 404 when not. */
export async function refuseWrite(db: DatabaseTransactionConnection, type: RecordType, id: string, action: string): Promise<never> {
  refusal(type, action, await isVisible(db, type, id))
}

function refusal(type: RecordType, action: string, visible: boolean): never {
  if (visible) throw new ForbiddenError(`Your role does not allow you to ${action} this ${type.label}`)
  throw new NotFoundError(`No such ${type.label}`)
}

/**
 * Sends a write that answers one row, or none when it matched nothing (then 403 or 404). In a
 * request whose write travels in one statement with authentication, the write is gated on
 * AUTHENTICATED and the visibility check rides in the same statement; in a transaction, the
 * write is sent as it is and the check is a second query, only when the write matched nothing.
 * `write` builds the statement around the gate (`true` in a transaction: authentication ran).
 */
async function writeOne<T>(
  db: DatabaseTransactionConnection,
  type: RecordType,
  target: { id: string; action: string } | null,
  write: (gate: Fragment) => ReturnType<typeof sql.unsafe>,
): Promise<T> {
  const statement = oneStatementOf(db)
  if (statement) {
    const visibleAfterNoMatch = target ? sql.fragment`exists (select from ${type.table} as t where t.id = ${target.id})` : undefined
    const { rows, visible } = await statement.write(write(AUTHENTICATED), { visibleAfterNoMatch })
    if (rows.length === 1) return Object.values(rows[0])[0] as T
    if (!target || visible === null) throw new Error(`a ${type.label} write answered ${rows.length} rows`)
    refusal(type, target.action, visible)
  }
  const written = (await db.maybeOneFirst(write(sql.fragment`true`))) as T | null
  if (written !== null) return written
  if (!target) throw new Error(`a ${type.label} write answered no row`)
  return refuseWrite(db, type, target.id, target.action)
}

/** A writable field sent, with the value its column takes. */
type WrittenValue = { name: string; value: unknown; json: boolean }

/** The body's writable fields by name, with the values the columns take (checked and normalised); read-only fields are dropped. */
export function writableValues(type: RecordType, body: Record<string, unknown>): WrittenValue[] {
  const values: WrittenValue[] = []
  for (const [name, raw] of Object.entries(body)) {
    const field = type.byName.get(name)
    // Read-only fields are ignored when sent; the schema already refused unknown fields.
    if (!field?.writable) continue
    let value: unknown = raw
    if (field.kind === 'numeric' && typeof raw === 'number') {
      value = String(raw)
      if (!new RegExp(MONEY_PATTERN).test(value as string)) {
        throw new ValidationError(`${name} must have at most two decimal places`, [
          { pointer: `/${name}`, code: 'format', message: 'must be a decimal with at most two places' },
        ])
      }
    }
    if (field.kind === 'date' && typeof raw === 'string' && !isValidDate(raw)) {
      throw new ValidationError(`${name} must be a date`, [{ pointer: `/${name}`, code: 'format', message: 'must be a date (YYYY-MM-DD)' }])
    }
    if (field.kind === 'uuid' && typeof raw === 'string') value = raw.toLowerCase()
    values.push({ name, value, json: field.kind === 'json' })
  }
  return values
}

/** The body's writable fields as column/value pairs; read-only fields are dropped. */
export function assignments(type: RecordType, body: Record<string, unknown>): { name: string; column: Fragment; value: Fragment }[] {
  return pairsOf(writableValues(type, body))
}

function pairsOf(values: WrittenValue[]): { name: string; column: Fragment; value: Fragment }[] {
  return values.map(({ name, value, json }) => ({
    name,
    column: sql.fragment`${sql.identifier([name])}`,
    value: json ? jsonValue(value) : sql.fragment`${value as string | number | null}`,
  }))
}

function jsonValue(value: unknown): Fragment {
  return sql.fragment`${sql.jsonb(value as Record<string, unknown>)}`
}

/**
 * A new record. The workspace and the user go in from the request's context; its policies
 * (<table>_insert_own_bookkeeping, <table>_insert_scoped) check the same values. With the context
 * carrier those helpers are inlined reads of it, evaluated once for the one row.
 */
function insertPairs(type: RecordType, values: WrittenValue[]): { column: Fragment; value: Fragment }[] {
  return [
    ...pairsOf(values).map((pair) => ({ ...pair, value: insertedValue(type, pair.name, pair.value) })),
    ...bookkeepingPairs(values.some((value) => value.name === 'owner_id')),
  ]
}

/**
 * A value as an insert writes it. The deal trigger is skipped on an insert that gives a stage; an
 * unknown one would get only the foreign key's "refers to a record that does not exist", not the
 * workspace's stages, so the insert asks crm.known_deal_stage.
 */
function insertedValue(type: RecordType, name: string, value: Fragment): Fragment {
  return type.name === 'deal' && name === 'stage' ? sql.fragment`crm.known_deal_stage(crm.current_workspace_id(), ${value})` : value
}

/** The columns an insert fills from the request's context: the workspace, the author and, unless sent, the owner. */
function bookkeepingPairs(ownerSent: boolean): { column: Fragment; value: Fragment }[] {
  const pairs = [
    { column: sql.fragment`workspace_id`, value: sql.fragment`crm.current_workspace_id()` },
    { column: sql.fragment`created_by`, value: sql.fragment`crm.current_user_id()` },
    { column: sql.fragment`updated_by`, value: sql.fragment`crm.current_user_id()` },
  ]
  if (!ownerSent) pairs.push({ column: sql.fragment`owner_id`, value: sql.fragment`crm.current_user_id()` })
  return pairs
}

export async function createRecord(db: DatabaseTransactionConnection, type: RecordType, body: Record<string, unknown>): Promise<string> {
  const values = writableValues(type, body)
  return writeOne<string>(db, type, null, (gate) => insertStatement(db, type, values, gate))
}

/**
 * createRecord's INSERT. Its text depends only on the type, the fields sent (in their order), the
 * answer's form and the gate, so slonik builds it once for each of those and a create puts its
 * values into a copy of that query (measured: building it and its wrapper, src/auth/authenticate.ts,
 * on every create, and parsing the answer again, cost 28-41 µs of the API process's CPU a create on
 * the loaded host; see docs/performance.md). The first build checks that the values go in the order
 * slonik numbered them.
 */
function insertStatement(db: DatabaseTransactionConnection, type: RecordType, values: WrittenValue[], gate: Fragment) {
  const parameters = values.map(({ value, json }) => (json ? jsonValue(value).values[0] : value))
  const key = `${type.name} ${answersJsonAsText(db)} ${gate.sql} ${values.map((value) => value.name).join(',')}`
  let query = insertQueries.get(key)
  if (query === undefined) {
    const pairs = insertPairs(type, values)
    query = sql.type(RecordRow)`
      insert into ${type.table} as t (${sql.join(
        pairs.map((pair) => pair.column),
        sql.fragment`, `,
      )})
      select ${sql.join(
        pairs.map((pair) => pair.value),
        sql.fragment`, `,
      )}
       where ${gate}
      returning ${recordText(db, type)} as record`
    if (query.values.length !== parameters.length || query.values.some((value, index) => value !== parameters[index])) {
      throw new Error(`a ${type.label} insert's values do not match its text`)
    }
    // Kept without this create's values: the process holds no request's data past its answer.
    if (insertQueries.size < MAX_INSERT_QUERIES) insertQueries.set(key, { ...query, values: [] })
  }
  return { ...query, values: parameters as typeof query.values }
}

/** createRecord's INSERTs by type, fields sent, answer's form and gate; past the bound, built each time. */
const insertQueries = new Map<string, ReturnType<typeof sql.unsafe>>()
const MAX_INSERT_QUERIES = 256

/**
 * The id of a record from its JSON text as crm.<type>_json renders it (the id first), without
 * parsing the rest; parsed in full when the text does not start that way.
 */
export function recordIdOf(recordText: string): string {
  return RECORD_ID.exec(recordText)?.[1] ?? (JSON.parse(recordText) as RecordJson).id
}
const RECORD_ID = /^\{"id" : "([0-9a-f-]{36})",/

/**
 * The bodies' writable values grouped by the set of fields they send, each row keyed by field name
 * (the JSON that jsonb_populate_recordset types by the table's own row type), with the positions
 * of its bodies: one statement per group writes every row of it.
 */
function groupByFields(
  type: RecordType,
  bodies: readonly Record<string, unknown>[],
  extra: (index: number) => Record<string, unknown> = () => ({}),
): { names: string[]; rows: Record<string, unknown>[]; positions: number[] }[] {
  const groups = new Map<string, { names: string[]; rows: Record<string, unknown>[]; positions: number[] }>()
  for (const [index, body] of bodies.entries()) {
    const values = writableValues(type, body)
    const names = values.map((value) => value.name)
    const key = names.join(',')
    const group = groups.get(key) ?? { names, rows: [], positions: [] }
    group.rows.push({ ...extra(index), ...Object.fromEntries(values.map((value) => [value.name, value.value])) })
    group.positions.push(index)
    groups.set(key, group)
  }
  return [...groups.values()]
}

/**
 * Several new records (a batch's optimistic pass), each with the columns and values createRecord
 * sends: one INSERT per set of fields sent, its rows in one jsonb parameter typed by the table's
 * own row type (jsonb_populate_recordset), answered in the order of the bodies. One parameter
 * instead of one per value keeps planning and query building flat in the batch's size (a VALUES
 * list of 100 rows was measured at a third of the statement's time in planning alone). Any
 * refusal fails them all; the caller then creates them one by one to tell which.
 */
export async function createRecords(
  db: DatabaseTransactionConnection,
  type: RecordType,
  bodies: Record<string, unknown>[],
): Promise<string[]> {
  const records: string[] = []
  for (const { names, rows, positions } of groupByFields(type, bodies)) {
    const bookkeeping = bookkeepingPairs(names.includes('owner_id'))
    const columns = [...names.map((name) => sql.fragment`${sql.identifier([name])}`), ...bookkeeping.map((pair) => pair.column)]
    // Each context read as a subquery: evaluated once for the statement, not once per row.
    const values = [
      ...names.map((name) => insertedValue(type, name, sql.fragment`v.${sql.identifier([name])}`)),
      ...bookkeeping.map((pair) => sql.fragment`(select ${pair.value})`),
    ]
    // PostgreSQL inserts the rows in the order of the ORDER BY and RETURNING answers each as it is inserted.
    const written = await db.manyFirst(sql.type(RecordRow)`
      insert into ${type.table} as t (${sql.join(columns, sql.fragment`, `)})
      select ${sql.join(values, sql.fragment`, `)}
        from jsonb_populate_recordset(null::${type.table}, ${sql.jsonb(rows as never)}) with ordinality as v
       order by v.ordinality
      returning ${recordText(db, type)} as record`)
    if (written.length !== rows.length) throw new Error(`a ${type.label} batch insert answered ${written.length} rows for ${rows.length}`)
    for (const [position, index] of positions.entries()) records[index] = written[position]
  }
  return records
}

/**
 * Partial update. With If-Match the row is locked first and its current ETag compared (412 on a
 * mismatch), so two clients cannot both win a read-modify-write race (such a request runs in a
 * transaction: see writesInOneStatement in src/http/routes/records.ts).
 */
export async function updateRecord(
  db: DatabaseTransactionConnection,
  type: RecordType,
  id: string,
  body: Record<string, unknown>,
  ifMatch: string | undefined,
): Promise<string> {
  if (ifMatch !== undefined) {
    const current = await db.maybeOneFirst(sql.type(RecordRow)`
      select ${recordText(db, type)} as record from ${type.table} as t
       where t.id = ${id}
         for no key update`)
    if (!current) return refuseWrite(db, type, id, 'update')
    if (!ifMatchAccepts(ifMatch, etagOf(current))) throw new PreconditionFailedError()
  }
  const pairs = assignments(type, body)
  // Nothing to change: answer with the record as it is, if the caller may update it at all.
  const changes =
    pairs.length === 0
      ? sql.fragment`owner_id = t.owner_id`
      : sql.join(
          pairs.map((pair) => sql.fragment`${pair.column} = ${pair.value}`),
          sql.fragment`, `,
        )
  return writeOne<string>(
    db,
    type,
    { id, action: 'update' },
    (gate) => sql.type(RecordRow)`
      update ${type.table} as t
         set ${changes}
       where t.id = ${id} and ${gate}
      returning ${recordText(db, type)} as record`,
  )
}

/**
 * Several updates of distinct records (a batch's optimistic pass), each sending what updateRecord
 * would: one `UPDATE ... FROM` per set of fields changed, the new values typed by the table's own
 * row type (jsonb_populate_recordset), answered in the order of the changes. A row the policies
 * keep from the caller is skipped by the UPDATE: then a ForbiddenError fails them all, and the
 * caller updates them one by one to tell which answer each gets. With `ifMatch`, the rows are
 * locked first and a stale tag fails them all the same way.
 */
export async function updateRecords(
  db: DatabaseTransactionConnection,
  type: RecordType,
  changes: { id: string; body: Record<string, unknown>; ifMatch?: string }[],
): Promise<string[]> {
  const guarded = changes.filter((change) => change.ifMatch !== undefined)
  if (guarded.length > 0) {
    const current = await db.any(sql.type(IdRecordRow)`
      select t.id, ${recordText(db, type)} as record from ${type.table} as t
       where t.id = any(${sql.array(
         guarded.map((change) => change.id),
         'uuid',
       )})
         for no key update`)
    const etags = new Map(current.map((row) => [row.id, etagOf(row.record)]))
    for (const change of guarded) {
      const etag = etags.get(change.id)
      if (etag === undefined || !ifMatchAccepts(change.ifMatch as string, etag)) throw new PreconditionFailedError()
    }
  }
  const groups = groupByFields(
    type,
    changes.map((change) => change.body),
    (index) => ({ id: changes[index].id }),
  )
  const records = new Map<string, string>()
  for (const { names, rows } of groups) {
    // Nothing to change: answer with the records as they are, if the caller may update them at all.
    const set =
      names.length === 0
        ? sql.fragment`owner_id = t.owner_id`
        : sql.join(
            names.map((name) => sql.fragment`${sql.identifier([name])} = v.${sql.identifier([name])}`),
            sql.fragment`, `,
          )
    const updated = await db.any(sql.type(IdRecordRow)`
      update ${type.table} as t
         set ${set}
        from jsonb_populate_recordset(null::${type.table}, ${sql.jsonb(rows as never)}) as v
       where t.id = v.id
         -- The ids again as an array: the planner then finds the rows by primary key, not by a scan.
         and t.id = any(${sql.array(
           rows.map((row) => row.id as string),
           'uuid',
         )})
      returning t.id, ${recordText(db, type)} as record`)
    if (updated.length !== rows.length) throw new ForbiddenError(`Your role does not allow you to update every ${type.label} of the batch`)
    for (const row of updated) records.set(row.id, row.record)
  }
  return changes.map((change) => records.get(change.id) as string)
}

export async function deleteRecord(db: DatabaseTransactionConnection, type: RecordType, id: string): Promise<void> {
  await writeOne<string>(
    db,
    type,
    { id, action: 'delete' },
    (gate) => sql.type(IdRow)`
      delete from ${type.table} as t
       where t.id = ${id} and ${gate}
      returning t.id`,
  )
}
