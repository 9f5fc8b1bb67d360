// Read, create, update and delete one record, in the caller's transaction (as crm_api, so RLS
// decides). A write that touches no row is told apart afterwards: still visible → 403, else 404.
// The queries name only the id: the policies add workspace_id = (select crm.current_workspace_id()),
// which with the id makes the primary-key lookup. Repeating it here would evaluate the request
// context helpers once more per statement (measured: ~0.25 ms each, see bench/records.ts).
import { hash } from 'node:crypto'
import Type, { type Static } from 'typebox'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { ExistsRow, IdRow, rowType } from '../db/typed-rows.ts'
import { ForbiddenError, NotFoundError, PreconditionFailedError, ValidationError } from '../errors.ts'
import { UUID_PATTERN } from '../uuid.ts'
import type { RecordType } from './fields.ts'
import { isValidDate } from './list-parameters.ts'
import { MONEY_PATTERN } from './schemas.ts'

type Fragment = ReturnType<typeof sql.fragment>

/** A record as crm.<type>_json renders it: every field of the type (schemas.ts has them all); the code here reads its id. */
const RecordJsonSchema = Type.Object({ id: Type.String() })
export type RecordJson = Record<string, unknown> & Static<typeof RecordJsonSchema>
const RecordRow = rowType(Type.Object({ record: RecordJsonSchema }))

/** A strong ETag over the record's JSON: it changes exactly when the representation does (one-shot hash, no Hash object). */
export function etagOf(record: unknown): string {
  return `"${hash('sha256', JSON.stringify(record), 'base64url').slice(0, 27)}"`
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
 * One record by id, or null, under the caller's policies. GET one is a single-statement route, so
 * this SELECT travels as a named statement and is planned once per connection.
 */
export async function readRecord(db: DatabaseTransactionConnection, type: RecordType, id: string): Promise<RecordJson | null> {
  return db.maybeOneFirst(sql.type(RecordRow)`select ${type.jsonFunction}(t) as record from ${type.table} t where t.id = ${id}::uuid`)
}

async function isVisible(db: DatabaseTransactionConnection, type: RecordType, id: string): Promise<boolean> {
  return db.oneFirst(sql.type(ExistsRow)`
    select exists (select from ${type.table} as t where t.id = ${id})`)
}

/** After a write matched nothing: 403 when the caller can see the record, 404 when not. */
export async function refuseWrite(db: DatabaseTransactionConnection, type: RecordType, id: string, action: string): Promise<never> {
  if (await isVisible(db, type, id)) throw new ForbiddenError(`Your role does not allow you to ${action} this ${type.label}`)
  throw new NotFoundError(`No such ${type.label}`)
}

/** The body's writable fields as column/value pairs; read-only fields are dropped. */
export function assignments(type: RecordType, body: Record<string, unknown>): { column: Fragment; value: Fragment }[] {
  const pairs: { column: Fragment; value: Fragment }[] = []
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
    const fragment =
      field.kind === 'json'
        ? sql.fragment`${sql.jsonb(value as Record<string, unknown>)}`
        : sql.fragment`${value as string | number | null}`
    pairs.push({ column: sql.fragment`${sql.identifier([name])}`, value: fragment })
  }
  return pairs
}

/**
 * A new record. The caller's workspace and user go in as values rather than through the columns'
 * defaults: a default calls crm.current_workspace_id() or crm.current_user_id() per row, each a proof
 * check, where the insert's policies already check those same values once per statement
 * (<table>_insert_own_bookkeeping, <table>_insert_scoped), so nothing is trusted that was not before.
 */
export async function createRecord(
  db: DatabaseTransactionConnection,
  type: RecordType,
  body: Record<string, unknown>,
  caller: { userId: string; workspaceId: string },
): Promise<RecordJson> {
  const pairs = [
    ...assignments(type, body),
    { column: sql.fragment`workspace_id`, value: sql.fragment`${caller.workspaceId}` },
    { column: sql.fragment`created_by`, value: sql.fragment`${caller.userId}` },
    { column: sql.fragment`updated_by`, value: sql.fragment`${caller.userId}` },
  ]
  if (body.owner_id === undefined) pairs.push({ column: sql.fragment`owner_id`, value: sql.fragment`${caller.userId}` })
  return db.oneFirst(sql.type(RecordRow)`
    insert into ${type.table} as t (${sql.join(
      pairs.map((pair) => pair.column),
      sql.fragment`, `,
    )})
    values (${sql.join(
      pairs.map((pair) => pair.value),
      sql.fragment`, `,
    )})
    returning ${type.jsonFunction}(t) as record`)
}

/**
 * Partial update. With If-Match the row is locked first and its current ETag compared (412 on a
 * mismatch), so two clients cannot both win a read-modify-write race.
 */
export async function updateRecord(
  db: DatabaseTransactionConnection,
  type: RecordType,
  id: string,
  body: Record<string, unknown>,
  ifMatch: string | undefined,
): Promise<RecordJson> {
  if (ifMatch !== undefined) {
    const current = await db.maybeOneFirst(sql.type(RecordRow)`
      select ${type.jsonFunction}(t) as record from ${type.table} as t
       where t.id = ${id}
         for no key update`)
    if (!current) return refuseWrite(db, type, id, 'update')
    if (!ifMatchAccepts(ifMatch, etagOf(current))) throw new PreconditionFailedError()
  }
  const pairs = assignments(type, body)
  if (pairs.length === 0) {
    // Nothing to change: answer with the record as it is, if the caller may update it at all.
    const unchanged = await db.maybeOneFirst(sql.type(RecordRow)`
      update ${type.table} as t set owner_id = t.owner_id
       where t.id = ${id}
      returning ${type.jsonFunction}(t) as record`)
    return unchanged ?? refuseWrite(db, type, id, 'update')
  }
  const updated = await db.maybeOneFirst(sql.type(RecordRow)`
    update ${type.table} as t
       set ${sql.join(
         pairs.map((pair) => sql.fragment`${pair.column} = ${pair.value}`),
         sql.fragment`, `,
       )}
     where t.id = ${id}
    returning ${type.jsonFunction}(t) as record`)
  return updated ?? refuseWrite(db, type, id, 'update')
}

export async function deleteRecord(db: DatabaseTransactionConnection, type: RecordType, id: string): Promise<void> {
  const deleted = await db.maybeOneFirst(sql.type(IdRow)`
    delete from ${type.table} as t
     where t.id = ${id}
    returning t.id`)
  if (deleted === null) await refuseWrite(db, type, id, 'delete')
}
