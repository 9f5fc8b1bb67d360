// Many-to-many links between records of different types (crm.associations holds exactly two of
// contact_id, company_id, deal_id per row). PUT replaces, per key sent, the set of *visible* linked
// records: links to records the caller cannot see are neither shown nor removed.
import Type from 'typebox'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { ExistsRow, IdRow } from '../db/typed-rows.ts'
import { type FieldProblem, NotFoundError, ValidationError } from '../errors.ts'
import { Uuid } from '../uuid.ts'
import { RECORD_TYPES, type RecordType } from './fields.ts'
import { refuseWrite } from './operations.ts'

export const MAX_ASSOCIATION_IDS = 1000

export type Associations = Partial<Record<'contacts' | 'companies' | 'deals', string[]>>

export function otherTypes(type: RecordType): RecordType[] {
  return RECORD_TYPES.filter((other) => other !== type)
}

const IdList = Type.Array(Uuid, { maxItems: MAX_ASSOCIATION_IDS })

export function associationsBodySchema(type: RecordType) {
  return Type.Object(Object.fromEntries(otherTypes(type).map((other) => [other.path, Type.Optional(IdList)])), {
    additionalProperties: false,
    description: `The ${otherTypes(type)
      .map((other) => other.path)
      .join(' and/or ')} linked to this ${type.label}; each key sent replaces that set`,
  })
}

export function associationsResponseSchema(type: RecordType) {
  return Type.Object({ data: Type.Object(Object.fromEntries(otherTypes(type).map((other) => [other.path, Type.Array(Uuid)]))) })
}

const idColumn = (type: RecordType) => sql.identifier(['a', `${type.name}_id`])
const bareIdColumn = (type: RecordType) => sql.identifier([`${type.name}_id`])

/** The ids of visible `other` records linked to the subject: oldest link first, then by id. */
async function linkedIds(db: DatabaseTransactionConnection, subject: RecordType, id: string, other: RecordType): Promise<string[]> {
  const ids = await db.anyFirst(sql.type(IdRow)`
    select ${idColumn(other)} as id
      from crm.associations as a
      join ${other.table} as t on t.workspace_id = a.workspace_id and t.id = ${idColumn(other)}
     where a.workspace_id = (select crm.current_workspace_id()) and ${idColumn(subject)} = ${id}
     order by a.created_at, t.id`)
  return [...ids]
}

export async function readAssociations(db: DatabaseTransactionConnection, subject: RecordType, id: string): Promise<Associations> {
  const exists = await db.oneFirst(sql.type(ExistsRow)`
    select exists (select from ${subject.table} as t where t.workspace_id = (select crm.current_workspace_id()) and t.id = ${id})`)
  if (!exists) throw new NotFoundError(`No such ${subject.label}`)
  const result: Associations = {}
  for (const other of otherTypes(subject)) result[other.path] = await linkedIds(db, subject, id, other)
  return result
}

export async function replaceAssociations(
  db: DatabaseTransactionConnection,
  subject: RecordType,
  id: string,
  body: Associations,
): Promise<Associations> {
  // Needs update on the addressed record: the no-op UPDATE checks it through RLS and locks the
  // record, so concurrent PUTs on one record apply one after the other.
  const locked = await db.maybeOneFirst(sql.type(IdRow)`
    update ${subject.table} as t set owner_id = t.owner_id
     where t.workspace_id = (select crm.current_workspace_id()) and t.id = ${id}
    returning t.id`)
  if (locked === null) await refuseWrite(db, subject, id, 'update')

  const wanted = otherTypes(subject).filter((other) => body[other.path] !== undefined)
  const problemsFound: FieldProblem[] = []
  const desired = new Map<RecordType, string[]>()
  for (const other of wanted) {
    const ids = [...new Set(body[other.path]!.map((value) => value.toLowerCase()))]
    const visible = new Set(
      await db.anyFirst(sql.type(IdRow)`
        select t.id from ${other.table} as t
         where t.workspace_id = (select crm.current_workspace_id()) and t.id = any(${sql.array(ids, 'uuid')})`),
    )
    body[other.path]!.forEach((value, index) => {
      if (!visible.has(value.toLowerCase()))
        problemsFound.push({ pointer: `/${other.path}/${index}`, code: 'not_found', message: `is not a ${other.label} you can see` })
    })
    desired.set(other, ids)
  }
  if (problemsFound.length > 0) {
    throw new ValidationError(`${problemsFound[0].pointer.slice(1)} ${problemsFound[0].message}`, problemsFound.slice(0, 50))
  }

  const changes: Record<string, { added: string[]; removed: string[] }> = {}
  for (const [other, ids] of desired) {
    const current = await linkedIds(db, subject, id, other)
    const removed = current.filter((existing) => !ids.includes(existing))
    const added = ids.filter((wantedId) => !current.includes(wantedId))
    if (removed.length > 0) {
      await db.query(sql.unsafe`
        delete from crm.associations as a
         where a.workspace_id = (select crm.current_workspace_id()) and ${idColumn(subject)} = ${id}
           and ${idColumn(other)} = any(${sql.array(removed, 'uuid')})`)
    }
    if (added.length > 0) {
      await db.query(sql.unsafe`
        insert into crm.associations (${bareIdColumn(subject)}, ${bareIdColumn(other)})
        select ${id}::uuid, linked from unnest(${sql.array(added, 'uuid')}) as linked`)
    }
    if (added.length > 0 || removed.length > 0) changes[other.path] = { added, removed }
  }
  if (Object.keys(changes).length > 0) {
    await db.query(sql.unsafe`select crm.write_associations_changed_event(${subject.name}, ${id}::uuid, ${sql.jsonb(changes)})`)
  }
  return readAssociations(db, subject, id)
}
