// /api/webhook-subscriptions (docs/api.md section 7): the routes. What they do is in
// src/webhooks/subscriptions.ts, their shapes in src/webhooks/subscription-schemas.ts.
import { PAGING_PARAMETERS, pageHeaders } from '../../paging.ts'
import { parseQueryString } from '../../records/query-string.ts'
import {
  CreateBody,
  CreatedSubscription,
  DELIVERY_STATUSES,
  Delivery,
  EXAMPLE,
  one,
  page,
  RECOVERY_DAYS,
  RecoverBody,
  Recovered,
  RotateBody,
  RotatedSecret,
  Subscription,
  TestBody,
  UpdateBody,
} from '../../webhooks/subscription-schemas.ts'
import {
  createSubscription,
  deleteSubscription,
  getSubscription,
  listDeliveries,
  listSubscriptions,
  previewRecovery,
  readDelivery,
  recoverDeliveries,
  redeliver,
  rotateSecret,
  sendTestEvent,
  setSubscriptionPaused,
  updateSubscription,
} from '../../webhooks/subscriptions.ts'
import { defineRoutes, patchAndPut } from '../route.ts'

const BASE = '/api/webhook-subscriptions'
const TAG = 'webhooks'

export default defineRoutes(
  {
    method: 'POST',
    path: BASE,
    summary: 'Create a webhook subscription; the answer holds the signing secret, shown this once',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    body: CreateBody,
    status: 201,
    response: one(CreatedSubscription),
    errors: [401, 402, 403, 413, 415, 422],
    example: {
      request: { name: EXAMPLE.name, url: EXAMPLE.url, events: EXAMPLE.events },
      response: { data: { ...EXAMPLE, secret: 'whsec_...' } },
    },
    handler: async ({ db, body, caller, services }) => {
      const created = await createSubscription(db, services.config, caller.workspaceId, body)
      return { status: 201, body: { data: created }, headers: { Location: `${BASE}/${created.id}` } }
    },
  },
  {
    method: 'GET',
    path: BASE,
    summary: 'List the webhook subscriptions (oldest first, paged)',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    response: page(Subscription),
    queryParameters: PAGING_PARAMETERS,
    errors: [400, 401, 402, 403],
    example: { response: { data: [EXAMPLE], next_cursor: null } },
    handler: async ({ db, req }) => {
      const parameters = parseQueryString(req.url)
      const result = await listSubscriptions(db, parameters)
      return { body: result, headers: pageHeaders(BASE, parameters, result.next_cursor) }
    },
  },
  {
    method: 'GET',
    path: `${BASE}/:id`,
    summary: 'Read a webhook subscription with its 24-hour stats',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    response: one(Subscription),
    errors: [401, 402, 403, 404],
    example: { response: { data: EXAMPLE } },
    handler: async ({ db, params }) => ({ body: { data: await getSubscription(db, params.id) } }),
  },
  patchAndPut({
    path: `${BASE}/:id`,
    summary: 'Change name, url or events of a webhook subscription (only the fields sent change)',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    body: UpdateBody,
    response: one(Subscription),
    errors: [401, 402, 403, 404, 413, 415, 422],
    example: { request: { events: ['*'] }, response: { data: { ...EXAMPLE, events: ['*'] } } },
    handler: async ({ db, params, body, services }) => ({ body: { data: await updateSubscription(db, services.config, params.id, body) } }),
  }),
  {
    method: 'DELETE',
    path: `${BASE}/:id`,
    summary: 'Delete a webhook subscription; its pending deliveries are cancelled and its delivery log removed',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    status: 204,
    errors: [401, 402, 403, 404],
    handler: async ({ db, params }) => {
      await deleteSubscription(db, params.id)
      return { status: 204 }
    },
  },
  {
    method: 'POST',
    path: `${BASE}/:id/pause`,
    summary: 'Pause a subscription: new events and due retries are held until resume',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    response: one(Subscription),
    errors: [401, 402, 403, 404],
    example: { response: { data: { ...EXAMPLE, status: 'paused', paused_reason: 'manual', paused_at: '2026-11-22T03:11:00.000Z' } } },
    handler: async ({ db, params }) => ({ body: { data: await setSubscriptionPaused(db, params.id, true) } }),
  },
  {
    method: 'POST',
    path: `${BASE}/:id/resume`,
    summary: 'Resume a subscription: held deliveries go out in their original order with the attempts they had left',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    response: one(Subscription),
    errors: [401, 402, 403, 404],
    example: { response: { data: EXAMPLE } },
    handler: async ({ db, params }) => ({ body: { data: await setSubscriptionPaused(db, params.id, false) } }),
  },
  {
    method: 'POST',
    path: `${BASE}/:id/rotate-secret`,
    summary: 'Replace the signing secret; the old one keeps signing (a second v1) for the grace period',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    body: RotateBody,
    response: one(RotatedSecret),
    errors: [401, 402, 403, 404, 422],
    example: {
      request: { grace_period_seconds: 86400 },
      response: { data: { id: EXAMPLE.id, secret: 'whsec_...', previous_secret_expires_at: '2026-11-23T03:00:21.123Z' } },
    },
    handler: async ({ db, params, body, caller, services }) => ({
      body: { data: await rotateSecret(db, services.config, caller.workspaceId, params.id, body.grace_period_seconds ?? 86_400) },
    }),
  },
  {
    method: 'GET',
    path: `${BASE}/:id/deliveries`,
    summary: 'The delivery log of a subscription, newest first (attempts are in the single-delivery read)',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    response: page(Delivery),
    queryParameters: {
      status: { description: 'Only deliveries in this status', schema: { type: 'string', enum: DELIVERY_STATUSES } },
      event: { description: 'Only deliveries of this event name (e.g. deal.updated)', schema: { type: 'string' } },
      ...PAGING_PARAMETERS,
    },
    errors: [400, 401, 402, 403, 404],
    handler: async ({ db, req, params }) => {
      const parameters = parseQueryString(req.url)
      const result = await listDeliveries(db, params.id, parameters)
      return { body: result, headers: pageHeaders(`${BASE}/${params.id.toLowerCase()}/deliveries`, parameters, result.next_cursor) }
    },
  },
  {
    method: 'GET',
    path: `${BASE}/:id/deliveries/:delivery_id`,
    summary: 'One delivery with all its attempts',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    response: one(Delivery),
    errors: [401, 402, 403, 404],
    handler: async ({ db, params }) => ({ body: { data: await readDelivery(db, params.id, params.delivery_id) } }),
  },
  {
    method: 'POST',
    path: `${BASE}/:id/deliveries/:delivery_id/redeliver`,
    summary:
      'Send a dead or delivered delivery again: a fresh cycle of 7 attempts, same delivery_id, the first at once (409 for any other status)',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    status: 202,
    response: one(Delivery),
    errors: [401, 402, 403, 404, 409],
    handler: async ({ db, params }) => ({ status: 202, body: { data: await redeliver(db, params.id, params.delivery_id) } }),
  },
  {
    method: 'POST',
    path: `${BASE}/:id/test`,
    summary: 'Send a test event: a sample of the event with "test": true, signed and logged like any other, sent even while paused',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    body: TestBody,
    status: 202,
    response: one(Delivery),
    errors: [401, 402, 403, 404, 413, 415, 422, 429],
    example: { request: { event: 'deal.updated' } },
    handler: async ({ db, params, body }) => ({ status: 202, body: { data: await sendTestEvent(db, params.id, body) } }),
  },
  {
    method: 'POST',
    path: `${BASE}/:id/recover`,
    summary: `Send again every dead delivery created in a window (since at most ${RECOVERY_DAYS} days back): fresh cycles, same delivery_ids, oldest first`,
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    body: RecoverBody,
    status: 202,
    response: one(Recovered),
    errors: [401, 402, 403, 404, 413, 415, 422, 429],
    example: { request: { since: '2026-11-22T00:00:00.000Z' }, response: { data: { deliveries: 1834 } } },
    handler: async ({ db, params, body }) => ({ status: 202, body: { data: await recoverDeliveries(db, params.id, body) } }),
  },
  {
    method: 'GET',
    path: `${BASE}/:id/recover`,
    summary: 'How many dead deliveries POST .../recover would send again for this window (nothing changes)',
    tag: TAG,
    auth: 'required',
    scope: 'webhooks:manage',
    response: one(Recovered),
    queryParameters: {
      since: {
        description: `Required: dead deliveries created at or after this time (RFC 3339, at most ${RECOVERY_DAYS} days back)`,
        schema: { type: 'string', format: 'date-time' },
      },
      until: { description: 'and before this time (default: now)', schema: { type: 'string', format: 'date-time' } },
    },
    errors: [400, 401, 402, 403, 404],
    example: { response: { data: { deliveries: 1834 } } },
    handler: async ({ db, req, params }) => ({ body: { data: await previewRecovery(db, params.id, parseQueryString(req.url)) } }),
  },
)
