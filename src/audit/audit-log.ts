// The access audit log as the API reads it (docs/api.md section 11): the list, the chain's check and
// the export. The database writes every entry (sql/definitions/80_audit.sql) and row-level security
// shows a workspace's entries to its admins only; the admin gate here answers 403 up front, where
// RLS alone would answer an empty page.
import Type, { type Static } from 'typebox'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { InvalidParameterError, ValidationError } from '../errors.ts'
import { csvTextCellSql } from '../exports/csv-text-cell.ts'
import type { ExportFormat } from '../exports/export-query.ts'
import { LineRow, type LinesQuery } from '../exports/stream-lines.ts'
import { type Actor, requireAdmin } from '../members/admin-only.ts'
import { decodeCursor, limitOf, pageOf } from '../paging.ts'
import { isValidDate } from '../records/list-parameters.ts'
import { UUID_PATTERN, Uuid } from '../uuid.ts'

type Fragment = ReturnType<typeof sql.fragment>
const nullable = <T extends Parameters<typeof Type.Union>[0][number]>(schema: T) => Type.Union([schema, Type.Null()])

export const AuditEntry = Type.Object({
  id: Uuid,
  seq: Type.Integer({ description: "The entry's place in its workspace's chain, from 1" }),
  occurred_at: Type.String({ format: 'date-time' }),
  action: Type.String({ description: 'e.g. member.role_changed (docs/api.md section 11 lists them)' }),
  actor: Type.Object({
    user_id: nullable(Uuid),
    name: nullable(Type.String()),
    via: Type.String({ description: 'api, ui, oauth, import or system' }),
    token_id: Type.Optional(Uuid),
    app_id: Type.Optional(Uuid),
    ip: Type.Optional(Type.String()),
  }),
  target: Type.Object({ type: Type.String(), id: nullable(Uuid) }),
  details: Type.Record(Type.String(), Type.Unknown()),
  prev_hash: Type.String({ description: "The previous entry's hash (hex); 64 zeros for a chain's first" }),
  hash: Type.String({ description: 'SHA-256 (hex) over prev_hash and the canonical content' }),
})
export type AuditEntryJson = Static<typeof AuditEntry>
export const AuditPage = Type.Object({ data: Type.Array(AuditEntry), next_cursor: nullable(Type.String()) })
export const AuditVerdict = Type.Union([
  Type.Object({ intact: Type.Literal(true), entries: Type.Integer() }),
  Type.Object({ intact: Type.Literal(false), first_bad_id: nullable(Uuid) }),
])
export type AuditVerdictJson = Static<typeof AuditVerdict>

/** The filters of the list and the export, by their query-parameter names. */
export const AUDIT_FILTERS = ['action', 'actor_id', 'target_type', 'target_id', 'since', 'until'] as const
type AuditFilters = Partial<Record<(typeof AUDIT_FILTERS)[number], string>>

const ACTION = /^[a-z_]{1,40}\.[a-z_]{1,40}$/
const TARGET_TYPE = /^[a-z_]{1,40}$/
const TIME = /^(\d{4}-\d{2}-\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$/

/**
 * An RFC 3339 time of a real calendar day and clock that PostgreSQL stores as given: February 30th
 * or hour 24 would be moved to another day by the parser, or refused by the database with no
 * pointer to the filter.
 */
function isAuditTime(value: string): boolean {
  const match = TIME.exec(value)
  if (!match || !isValidDate(match[1]) || Number.isNaN(Date.parse(value))) return false
  return Number(match[2]) <= 23 && Number(match[3]) <= 59 && Number(match[4]) <= 59
}

/** Each filter checked (a bad one throws `invalid`), as SQL conditions on `l`. */
function filterConditions(filters: AuditFilters, invalid: (name: string, message: string) => never): Fragment[] {
  const conditions: Fragment[] = [sql.fragment`l.workspace_id = (select crm.current_workspace_id())`]
  const { action, actor_id, target_type, target_id, since, until } = filters
  if (action !== undefined) {
    if (!ACTION.test(action)) invalid('action', 'action must be an action name such as member.role_changed')
    conditions.push(sql.fragment`l.action = ${action}`)
  }
  for (const [name, value, column] of [
    ['actor_id', actor_id, 'actor_user_id'],
    ['target_id', target_id, 'target_id'],
  ] as const) {
    if (value === undefined) continue
    if (!UUID_PATTERN.test(value)) invalid(name, `${name} must be a UUID`)
    conditions.push(sql.fragment`${sql.identifier(['l', column])} = ${value.toLowerCase()}`)
  }
  if (target_type !== undefined) {
    if (!TARGET_TYPE.test(target_type)) invalid('target_type', 'target_type must be a type such as user, role or token')
    conditions.push(sql.fragment`l.target_type = ${target_type}`)
  }
  for (const [name, value, operator] of [
    ['since', since, sql.fragment`>=`],
    ['until', until, sql.fragment`<`],
  ] as const) {
    if (value === undefined) continue
    if (!isAuditTime(value)) invalid(name, `${name} must be an RFC 3339 time such as 2026-11-22T03:00:00Z`)
    conditions.push(sql.fragment`l.occurred_at ${operator} ${value}::timestamptz`)
  }
  return conditions
}

/** An entry as the API writes it, built in SQL from `l` (crm.audit_log) and `u` (its actor's user, if visible). */
const ENTRY_JSON = sql.fragment`jsonb_build_object(
    'id', l.id, 'seq', l.seq, 'occurred_at', crm.api_time(l.occurred_at), 'action', l.action,
    'actor', jsonb_build_object('user_id', l.actor_user_id, 'name', u.name, 'via', l.actor_via)
             || jsonb_strip_nulls(jsonb_build_object('token_id', l.actor_token_id, 'app_id', l.actor_app_id, 'ip', host(l.actor_ip))),
    'target', jsonb_build_object('type', l.target_type, 'id', l.target_id),
    'details', l.details, 'prev_hash', encode(l.prev_hash, 'hex'), 'hash', encode(l.hash, 'hex'))`
const FROM = sql.fragment`crm.audit_log l left join crm.users u on u.id = l.actor_user_id`

const EntryRow = rowType(Type.Object({ entry: AuditEntry }))
const LIST_ORDER = '-seq'
const SEQ_CURSOR = [{ kind: 'integer', nullable: false }]

/** GET /api/audit-log: newest first, filtered, a page at a time (admins only). */
export async function listAuditLog(
  db: CommonQueryMethods,
  actor: Actor,
  parameters: Map<string, string>,
): Promise<{ data: AuditEntryJson[]; next_cursor: string | null }> {
  requireAdmin(actor)
  for (const name of parameters.keys()) {
    if (!(AUDIT_FILTERS as readonly string[]).includes(name) && name !== 'limit' && name !== 'cursor')
      throw new InvalidParameterError(`Unknown query parameter ${name}`)
  }
  const limit = limitOf(parameters.get('limit'))
  const conditions = filterConditions(Object.fromEntries(parameters) as AuditFilters, (_name, message) => {
    throw new InvalidParameterError(message)
  })
  const cursor = parameters.get('cursor')
  if (cursor !== undefined) conditions.push(sql.fragment`l.seq < ${decodeCursor(cursor, LIST_ORDER, SEQ_CURSOR).values[0]}::bigint`)
  const rows = await db.anyFirst(sql.type(EntryRow)`
    select ${ENTRY_JSON} as entry from ${FROM}
     where ${sql.join(conditions, sql.fragment` and `)}
     order by l.seq desc limit ${limit + 1}`)
  return pageOf(rows, limit, LIST_ORDER, (entry) => String(entry.seq))
}

const VerdictRow = rowType(Type.Object({ intact: Type.Boolean(), entries: Type.Integer(), first_bad_id: nullable(Type.String()) }))

/** crm.verify_audit_log's answer as the API and the CLI give it. */
export function auditChainVerdict(row: { intact: boolean; entries: number | string; first_bad_id: string | null }): AuditVerdictJson {
  return row.intact ? { intact: true, entries: Number(row.entries) } : { intact: false, first_bad_id: row.first_bad_id }
}

/** GET /api/audit-log/verify: the workspace's chain walked from its anchor (admins only). */
export async function verifyAuditLog(db: CommonQueryMethods, actor: Actor): Promise<AuditVerdictJson> {
  requireAdmin(actor)
  return auditChainVerdict(
    await db.one(
      sql.type(
        VerdictRow,
      )`select intact, entries::int as entries, first_bad_id from crm.verify_audit_log((select crm.current_workspace_id()))`,
    ),
  )
}

export type AuditExportRequest = { format?: ExportFormat; filter?: AuditFilters }

/** The CSV columns of an audit export, each a text expression over `l` and `u`. */
const CSV_COLUMNS: [string, Fragment][] = [
  ['id', sql.fragment`l.id::text`],
  ['seq', sql.fragment`l.seq::text`],
  ['occurred_at', sql.fragment`crm.api_time(l.occurred_at)`],
  ['action', sql.fragment`l.action`],
  ['actor_user_id', sql.fragment`l.actor_user_id::text`],
  ['actor_name', csvTextCellSql(sql.fragment`u.name`)],
  ['actor_via', sql.fragment`l.actor_via`],
  ['actor_token_id', sql.fragment`l.actor_token_id::text`],
  ['actor_app_id', sql.fragment`l.actor_app_id::text`],
  ['actor_ip', sql.fragment`host(l.actor_ip)`],
  ['target_type', sql.fragment`l.target_type`],
  ['target_id', sql.fragment`l.target_id::text`],
  ['details', csvTextCellSql(sql.fragment`l.details::text`)],
  ['prev_hash', sql.fragment`encode(l.prev_hash, 'hex')`],
  ['hash', sql.fragment`encode(l.hash, 'hex')`],
]

/**
 * POST /api/audit-log/export: every entry the filters keep, oldest first (the chain's order, so a
 * script verifies it in one pass), as CSV lines or the list's JSON (admins only).
 */
export function auditExportQuery(actor: Actor, request: AuditExportRequest): { query: LinesQuery; header: string | null } {
  requireAdmin(actor)
  const conditions = filterConditions(request.filter ?? {}, (name, message) => {
    throw new ValidationError(message, [{ pointer: `/filter/${name}`, code: 'invalid', message }])
  })
  const line =
    request.format === 'ndjson'
      ? sql.fragment`${ENTRY_JSON}::text`
      : sql.fragment`concat_ws(',', ${sql.join(
          CSV_COLUMNS.map(([, value]) => sql.fragment`coalesce(${value}, '')`),
          sql.fragment`, `,
        )})`
  return {
    query: sql.type(LineRow)`select ${line} as line from ${FROM} where ${sql.join(conditions, sql.fragment` and `)} order by l.seq`,
    header: request.format === 'ndjson' ? null : CSV_COLUMNS.map(([name]) => name).join(','),
  }
}
