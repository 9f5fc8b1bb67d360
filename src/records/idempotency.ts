// Idempotency-Key for POSTs (docs/api.md section 5). The key row is claimed first, inside the request
// transaction: a concurrent request with the same key waits on the primary key until the first
// commits, then replays its answer. A request that fails rolls back its claim with everything
// else, so only successful answers are remembered (a retry after a 422 runs again).
import { createHash } from 'node:crypto'
import Type from 'typebox'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { ConflictError, InvalidParameterError } from '../errors.ts'

export type StoredResponse = { status: number; body: unknown; headers: Record<string, string> }

const KEY = /^[\x21-\x7e][\x20-\x7e]{0,254}$/

/** A claimed key: the request it was first used for and, once that committed, its answer. */
const StoredRow = rowType(
  Type.Object({
    request_hash: Type.String(),
    response_status: Type.Union([Type.Integer(), Type.Null()]),
    response_body: Type.Union([Type.String(), Type.Null()]),
    response_headers: Type.Record(Type.String(), Type.String()),
  }),
)

/** JSON with sorted keys, so {"a":1,"b":2} and {"b":2,"a":1} are the same request. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`
  if (value && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    return `{${entries.map(([key, item]) => `${JSON.stringify(key)}:${canonicalJson(item)}`).join(',')}}`
  }
  return JSON.stringify(value) ?? 'null'
}

export function idempotencyKeyOf(header: string | string[] | undefined): string | null {
  if (header === undefined) return null
  const key = Array.isArray(header) ? header[0] : header
  if (!KEY.test(key)) throw new InvalidParameterError('Idempotency-Key must be 1 to 255 printable ASCII characters')
  return key
}

/**
 * Runs `create` once per key: the first time it runs and its answer is stored; later the stored
 * answer comes back with Idempotent-Replayed: true, or 409 when the request differs.
 */
export async function withIdempotency(
  db: DatabaseTransactionConnection,
  key: string | null,
  request: { method: string; path: string; body: unknown },
  create: () => Promise<StoredResponse>,
): Promise<StoredResponse> {
  if (key === null) return create()
  const hash = createHash('sha256')
    .update(`${request.method} ${request.path}\n${canonicalJson(request.body)}`)
    .digest('hex')
  const claimed = await db.maybeOneFirst(sql.unsafe`
    insert into crm.idempotency_keys as k (key, request_hash) values (${key}, ${hash})
    on conflict (workspace_id, user_id, key) do update
       set request_hash = excluded.request_hash, response_status = null, response_body = null,
           response_headers = '{}'::jsonb, created_at = now(), expires_at = now() + interval '24 hours'
     where k.expires_at <= now()
    returning true`)
  if (claimed === null) {
    const previous = await db.one(sql.type(StoredRow)`
      select request_hash, response_status, response_body, response_headers
        from crm.idempotency_keys
       where workspace_id = (select crm.current_workspace_id()) and user_id = (select crm.current_user_id()) and key = ${key}`)
    if (previous.request_hash !== hash || previous.response_status === null) {
      throw new ConflictError('idempotency_conflict', 'This Idempotency-Key was already used with a different request')
    }
    return {
      status: previous.response_status,
      body: previous.response_body === null ? undefined : JSON.parse(previous.response_body),
      headers: { ...previous.response_headers, 'Idempotent-Replayed': 'true' },
    }
  }
  const response = await create()
  await db.query(sql.unsafe`
    update crm.idempotency_keys
       set response_status = ${response.status},
           response_body = ${response.body === undefined ? null : JSON.stringify(response.body)},
           response_headers = ${sql.jsonb(response.headers)}
     where workspace_id = (select crm.current_workspace_id()) and user_id = (select crm.current_user_id()) and key = ${key}`)
  return response
}
