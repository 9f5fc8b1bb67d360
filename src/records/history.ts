// A record's history (docs/api.md section 5b): its changes newest first, a page at a time, read from
// the view crm.record_history over the outbox. The view's policy decides who sees what, so this
// file filters nothing by permission: it asks for the record's rows and tells 404 apart from an
// empty page (a cursor past the first change) by whether the caller may see the record or any of
// its history at all.
import Type from 'typebox'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { InvalidParameterError, NotFoundError } from '../errors.ts'
import { type CursorColumn, decodeCursor, encodeCursor, limitOf } from '../paging.ts'
import { Uuid } from '../uuid.ts'
import type { RecordType } from './fields.ts'
import { pageJson } from './list-query.ts'
import { nullable, page, Time } from './schemas.ts'

const HISTORY_ORDER = '-id'
const ID_CURSOR: CursorColumn[] = [{ kind: 'uuid', nullable: false }]
const PARAMETERS = ['limit', 'cursor']

const FieldChange = Type.Object({ from: Type.Unknown(), to: Type.Unknown() }, { description: 'A field: its old and new value' })
const AssociationChange = Type.Object(
  { added: Type.Array(Uuid), removed: Type.Array(Uuid) },
  { description: 'associations.<type>: the ids linked and unlinked' },
)

export const HistoryEntrySchema = Type.Object({
  id: Uuid,
  occurred_at: Time,
  action: Type.Union([Type.Literal('created'), Type.Literal('updated'), Type.Literal('deleted')]),
  actor: Type.Object({
    user_id: nullable(Uuid),
    name: nullable(Type.String({ description: 'The user\u2019s name while they are a member of the workspace' })),
    via: Type.Union(['api', 'ui', 'import', 'oauth', 'system'].map((via) => Type.Literal(via))),
    token_id: Type.Optional(Uuid),
    app_id: Type.Optional(Uuid),
  }),
  changes: Type.Record(Type.String(), Type.Union([FieldChange, AssociationChange]), {
    description: 'Each changed field (custom_fields.<key> per custom field, associations.<type> for links)',
  }),
})

export const historyPageSchema = page(HistoryEntrySchema)

/** A page's body as JSON text, `{"data":[...],"next_cursor":...}`, and its cursor for the Link header. */
export type HistoryPage = { json: string; next_cursor: string | null }

const HistoryRow = rowType(
  Type.Object({
    visible: Type.Boolean(),
    entries: Type.String(),
    last_id: Type.Union([Type.String(), Type.Null()]),
  }),
)

/**
 * The statement of a history page: the `limit` entries before the `before` id (from the newest
 * when null) as one JSON text, the id of the last of them when one more follows (null otherwise),
 * and whether the caller may see the record or its history at all (bench/records.ts explains and
 * times it as it is). The first page (no cursor) holds the record's newest change the caller may
 * read, so a non-empty page already says its history is visible: only a later page asks the view
 * again for a change anywhere in the record's history, which planning the first page would
 * otherwise pay for on every request.
 */
export function historyPageQuery(type: RecordType, id: string, before: string | null, limit: number) {
  const historyVisible =
    before === null
      ? sql.fragment`page.entries is not null`
      : sql.fragment`exists (select from crm.record_history v where v.record_type = ${type.name} and v.record_id = ${id}::uuid)`
  return sql.type(HistoryRow)`
    select (exists (select from ${type.table} t where t.id = ${id}::uuid) or ${historyVisible}) as visible,
           coalesce(page.entries, '[]') as entries, page.last_id
      from (select (json_agg(json_build_object('id', p.id, 'occurred_at', crm.api_time(p.occurred_at), 'action', p.action,
                                               'actor', p.actor, 'changes', p.changes) order by p.id desc)
                      filter (where p.n <= ${limit}))::text as entries,
                   (array_agg(p.id::text) filter (where p.n = ${limit} and p.more))[1] as last_id
              from (select q.id, q.occurred_at, q.action, q.actor, q.changes,
                           row_number() over (order by q.id desc) as n, count(*) over () > ${limit} as more
                      from (select h.id, h.occurred_at, h.action, h.actor, h.changes from crm.record_history h
                             where h.record_type = ${type.name} and h.record_id = ${id}::uuid
                               ${before === null ? sql.fragment`` : sql.fragment`and h.id < ${before}::uuid`}
                             order by h.id desc limit ${limit + 1}) q) p
             offset 0) page`
}

/**
 * One page of the record's history, in one statement: the page (one row more than asked, to know
 * whether another follows) and whether the caller may see the record or its history at all. The
 * page's entries are answered as PostgreSQL rendered them, neither parsed nor serialized again.
 */
export async function readHistory(
  db: DatabaseTransactionConnection,
  type: RecordType,
  id: string,
  parameters: Map<string, string>,
): Promise<HistoryPage> {
  for (const name of parameters.keys()) {
    if (!PARAMETERS.includes(name)) throw new InvalidParameterError(`Unknown query parameter ${name}`)
  }
  const limit = limitOf(parameters.get('limit'))
  const cursor = parameters.get('cursor')
  const before = cursor === undefined ? null : decodeCursor(cursor, HISTORY_ORDER, ID_CURSOR).values[0]
  const row = await db.one(historyPageQuery(type, id, before, limit))
  if (!row.visible) throw new NotFoundError(`No such ${type.label}`)
  const next_cursor = row.last_id === null ? null : encodeCursor(HISTORY_ORDER, [row.last_id])
  return { json: pageJson({ records: row.entries, next_cursor }), next_cursor }
}
