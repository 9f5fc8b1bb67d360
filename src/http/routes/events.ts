// GET /api/events: the events feed with long polling (docs/api.md section 8a). The page is one
// statement (src/webhooks/events-feed.ts); the wait between pages holds no connection (app.ts,
// src/webhooks/feed-listener.ts).
import Type from 'typebox'
import { readScope } from '../../auth/scopes.ts'
import { RECORD_TYPES } from '../../records/fields.ts'
import { Uuid } from '../../uuid.ts'
import { encodeFeedCursor, FEED_MAX_LIMIT, FEED_MAX_WAIT_SECONDS, parseFeedRequest, readFeedPage } from '../../webhooks/events-feed.ts'
import { defineRoutes, JsonText } from '../route.ts'

const FeedEvent = Type.Object(
  {
    id: Uuid,
    event: Type.String({ description: 'contact.created, deal.updated, ...' }),
    occurred_at: Type.String({ format: 'date-time' }),
    workspace: Type.Object({ id: Uuid, slug: Type.String() }),
    data: Type.Object(
      {
        object: Type.Object({}, { additionalProperties: true }),
        previous_attributes: Type.Optional(Type.Object({}, { additionalProperties: true })),
        associations_changed: Type.Optional(Type.Object({}, { additionalProperties: true })),
      },
      { additionalProperties: false },
    ),
    actor: Type.Object({}, { additionalProperties: true, description: '{"type", "id", "via"} as in webhook bodies' }),
  },
  { description: "A webhook body's envelope without delivery_id and delivered_at" },
)

export default defineRoutes({
  method: 'GET',
  path: '/api/events',
  summary: "The workspace's events the caller may view, in commit order, with long polling (wait)",
  tag: 'events',
  auth: 'required',
  scope: RECORD_TYPES.map(readScope),
  longPoll: true,
  response: Type.Object({ data: Type.Array(FeedEvent), next_cursor: Type.String() }),
  queryParameters: {
    after: {
      description: 'The next_cursor of an earlier answer; without it the feed starts at the oldest event kept',
      schema: { type: 'string' },
    },
    types: {
      description: 'Comma-separated event names or patterns: deal.*,contact.created (default: every event)',
      schema: { type: 'string' },
    },
    limit: {
      description: `Events per page, 1 to ${FEED_MAX_LIMIT} (default 100)`,
      schema: { type: 'integer', minimum: 1, maximum: FEED_MAX_LIMIT },
    },
    wait: {
      description: `Seconds (0 to ${FEED_MAX_WAIT_SECONDS}) to hold an empty answer open until an event arrives`,
      schema: { type: 'integer', minimum: 0, maximum: FEED_MAX_WAIT_SECONDS },
    },
  },
  errors: [400, 401, 403, 410, 503],
  handler: async ({ db, query, services }) => {
    const { appSecret, eventsRetentionDays } = services.config
    const request = parseFeedRequest(query, appSecret, eventsRetentionDays)
    const page = await readFeedPage(db, request)
    const nextCursor = encodeFeedCursor(page.next, Date.now(), appSecret)
    return {
      body: new JsonText(`{"data":[${page.entries}],"next_cursor":${JSON.stringify(nextCursor)}}`),
      headers: { 'Cache-Control': 'no-store' },
      wait: page.empty && request.waitMs > 0 ? { ms: request.waitMs, workspaceId: page.workspaceId, pending: page.pending } : undefined,
    }
  },
})
