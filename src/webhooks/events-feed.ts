// The events feed (docs/api.md section 8a): a workspace's outbox read in (xid, id) order, only
// below the oldest transaction still running, so an event never appears behind a cursor already
// handed out (docs/decisions.md, "The events feed's order"). Row-level security decides which
// events a caller reads (crm.events' policy events_select_viewable); this file parses the
// parameters, the cursor, and sends the one query.
import { createHmac, timingSafeEqual } from 'node:crypto'
import Type from 'typebox'
import type { DatabaseTransactionConnection } from '../db/pool.ts'
import { sql } from '../db/pool.ts'
import { NullableString, rowType } from '../db/typed-rows.ts'
import { CursorExpiredError, InvalidParameterError } from '../errors.ts'
import { limitOf } from '../paging.ts'
import { UUID_PATTERN } from '../uuid.ts'

export const FEED_DEFAULT_LIMIT = 100
export const FEED_MAX_LIMIT = 500
export const FEED_MAX_WAIT_SECONDS = 30

/** A position in a workspace's sequence of events: the writing transaction, then the event id. */
export type FeedPosition = { xid: string; id: string }

/** Before every event: where a feed without `after` starts. */
export const FEED_START: FeedPosition = { xid: '0', id: '00000000-0000-0000-0000-000000000000' }

/** `retentionDays`: the feed shows the events of that many last days (EVENTS_RETENTION_DAYS); older ones stay for record history. */
export type FeedRequest = { after: FeedPosition; types: string[] | null; limit: number; waitMs: number; retentionDays: number }

const TYPE_PATTERN = /^(\*|(contact|company|deal)\.(\*|created|updated|deleted))$/
const XID_PATTERN = /^\d{1,20}$/

function macOf(secret: string, payload: string): Buffer {
  return createHmac('sha256', `events-feed-cursor:${secret}`).update(payload).digest().subarray(0, 12)
}

/**
 * An opaque cursor: the position and when it was issued, with a MAC under APP_SECRET, so a cursor
 * cannot be made younger by hand to read past events that retention may have removed.
 */
export function encodeFeedCursor(position: FeedPosition, issuedAtMs: number, secret: string): string {
  const payload = `${position.xid}.${position.id}.${issuedAtMs}`
  return `${Buffer.from(payload).toString('base64url')}.${macOf(secret, payload).toString('base64url')}`
}

function invalidCursor(): never {
  throw new InvalidParameterError('after is not a valid cursor: pass the next_cursor of an earlier answer unchanged', [
    { pointer: 'after', code: 'cursor', message: 'is not a cursor of this feed' },
  ])
}

/** Decodes a cursor of encodeFeedCursor: 400 when it is not one, 410 when issued past the retention. */
export function decodeFeedCursor(text: string, secret: string, retentionDays: number, nowMs = Date.now()): FeedPosition {
  if (text.length > 200 || !/^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/.test(text)) invalidCursor()
  const [encoded, mac] = text.split('.')
  const payload = Buffer.from(encoded, 'base64url').toString('utf8')
  const given = Buffer.from(mac, 'base64url')
  const expected = macOf(secret, payload)
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) invalidCursor()
  const [xid, id, issued] = payload.split('.')
  if (!XID_PATTERN.test(xid ?? '') || !UUID_PATTERN.test(id ?? '') || !/^\d{1,15}$/.test(issued ?? '')) invalidCursor()
  if (Number(issued) < nowMs - retentionDays * 86_400_000) throw new CursorExpiredError(retentionDays)
  return { xid, id }
}

function single(query: Record<string, string | string[]>, name: string): string | undefined {
  const value = query[name]
  if (Array.isArray(value)) throw new InvalidParameterError(`${name} may be given once`)
  return value
}

/** The feed's query parameters: after, types, limit, wait. */
export function parseFeedRequest(query: Record<string, string | string[]>, secret: string, retentionDays: number): FeedRequest {
  for (const name of Object.keys(query)) {
    if (!['after', 'types', 'limit', 'wait'].includes(name))
      throw new InvalidParameterError(`${name} is not a parameter of the events feed`)
  }
  const afterText = single(query, 'after')
  const after = afterText === undefined || afterText === '' ? FEED_START : decodeFeedCursor(afterText, secret, retentionDays)
  const typesText = single(query, 'types')
  let types: string[] | null = null
  if (typesText !== undefined && typesText !== '') {
    if (typesText.length > 400) throw new InvalidParameterError('types is too long')
    types = [...new Set(typesText.split(','))]
    const wrong = types.find((type) => !TYPE_PATTERN.test(type))
    if (wrong !== undefined || types.length > 20) {
      throw new InvalidParameterError(
        'types is a comma-separated list of at most 20 event names or patterns: contact.created, deal.*, * ...',
        [
          {
            pointer: 'types',
            code: 'format',
            message: `${wrong === undefined ? 'has too many entries' : `names no event: ${wrong.slice(0, 40)}`}`,
          },
        ],
      )
    }
  }
  const limit = limitOf(single(query, 'limit'), FEED_DEFAULT_LIMIT, FEED_MAX_LIMIT)
  const waitText = single(query, 'wait')
  let waitMs = 0
  if (waitText !== undefined && waitText !== '') {
    if (!/^\d{1,2}$/.test(waitText) || Number(waitText) > FEED_MAX_WAIT_SECONDS) {
      throw new InvalidParameterError(`wait must be a whole number of seconds from 0 to ${FEED_MAX_WAIT_SECONDS}`)
    }
    waitMs = Number(waitText) * 1000
  }
  return { after, types, limit, waitMs, retentionDays }
}

const FeedPageRow = rowType(
  Type.Object({
    entries: Type.String(),
    last_xid: NullableString,
    last_id: NullableString,
    pending: Type.Boolean(),
    workspace_id: Type.String(),
  }),
)

export type FeedPage = {
  /** The page's events, each the JSON text of its envelope, joined by commas. */
  entries: string
  empty: boolean
  /** Where the next page starts: the last event's position, or the request's when the page is empty. */
  next: FeedPosition
  /**
   * Events of the workspace this caller may read are committed but not yet readable: a
   * transaction that began before them is still running, and no notification may follow when it
   * ends (it may write no event), so a waiting client asks again shortly.
   */
  pending: boolean
  workspaceId: string
}

/**
 * One page of the caller's feed, in one statement: the events after the position, readable by the
 * caller (RLS), written by transactions that have all ended before every transaction still running
 * (pg_snapshot_xmin of this statement's snapshot), in (xid, id) order.
 */
export async function readFeedPage(db: Pick<DatabaseTransactionConnection, 'one'>, request: FeedRequest): Promise<FeedPage> {
  const { after, types, limit, retentionDays } = request
  const row = await db.one(sql.type(FeedPageRow)`
    with gate as materialized (
      select pg_snapshot_xmin(pg_current_snapshot()) as xmin, (select crm.current_workspace_id()) as workspace_id
    ), workspace as materialized (
      select w.slug from crm.workspaces w, gate where w.id = gate.workspace_id
    ), page as materialized (
      select e.xid, e.id, crm.event_feed_entry(e, (select slug from workspace)) as entry
        from crm.events e, gate
       where e.workspace_id = gate.workspace_id
         and (e.xid, e.id) > (${after.xid}::xid8, ${after.id}::uuid)
         and e.xid < gate.xmin
         and e.occurred_at >= now() - make_interval(days => ${retentionDays})
         and (${types === null ? null : sql.array(types, 'text')}::text[] is null
              or crm.webhook_event_matches(${types === null ? null : sql.array(types, 'text')}::text[], e.event))
       order by e.xid, e.id
       limit ${limit}
    )
    select coalesce((select string_agg(p.entry, ',' order by p.xid, p.id) from page p), '') as entries,
           (select p.xid::text from page p order by p.xid desc, p.id desc limit 1) as last_xid,
           (select p.id::text from page p order by p.xid desc, p.id desc limit 1) as last_id,
           exists (select from crm.events e, gate where e.workspace_id = gate.workspace_id and e.xid >= gate.xmin) as pending,
           (select workspace_id::text from gate) as workspace_id`)
  const next = row.last_xid !== null && row.last_id !== null ? { xid: row.last_xid, id: row.last_id } : after
  return { entries: row.entries, empty: row.last_xid === null, next, pending: row.pending, workspaceId: row.workspace_id }
}
