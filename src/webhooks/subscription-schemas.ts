// The shapes of /api/webhook-subscriptions (docs/api.md section 7), in typebox: request bodies, the
// subscription and delivery as the API shows them (OpenAPI and row checks), and an example.
import Type, { type TSchema } from 'typebox'
import { CompanySchema, ContactSchema, DealSchema } from '../records/schemas.ts'
import { named } from '../schema-names.ts'
import { Uuid } from '../uuid.ts'

const EVENT_PATTERN = '^(\\*|(contact|company|deal)\\.(\\*|created|updated|deleted))$'
/** One event name (no wildcards), as the deliveries filter takes it. */
export const EVENT_NAME = /^(contact|company|deal)\.(created|updated|deleted)$/
export const DELIVERY_STATUSES = ['pending', 'retrying', 'delivered', 'dead', 'held']
/** The 9 events (docs/api.md section 8), in the order the events page lists them. */
export const EVENT_NAMES = ['contact', 'company', 'deal'].flatMap((type) =>
  ['created', 'updated', 'deleted'].map((action) => `${type}.${action}`),
)
export const DEFAULT_TEST_EVENT = 'contact.created'
/** How far back a recovery may reach: the delivery log's retention (sql: crm.check_webhook_recovery_window). */
export const RECOVERY_DAYS = 30

const nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()])
const Time = Type.String({ format: 'date-time' })
const Events = Type.Array(
  Type.String({ maxLength: 15, pattern: EVENT_PATTERN, description: 'An event name, contact.*, company.*, deal.* or *' }),
  {
    minItems: 1,
    maxItems: 20,
  },
)
const Name = Type.String({ minLength: 1, maxLength: 255, pattern: '\\S' })
const Url = Type.String({ minLength: 1, maxLength: 2048, description: 'https only; must resolve to public addresses' })

/** A subscription as crm.webhook_subscription_json renders it. */
export const Subscription = named(
  'WebhookSubscription',
  Type.Object({
    id: Uuid,
    name: Type.String(),
    url: Type.String(),
    events: Type.Array(Type.String()),
    status: Type.Union([Type.Literal('active'), Type.Literal('paused')]),
    paused_reason: nullable(Type.Union([Type.Literal('manual'), Type.Literal('auto')])),
    paused_at: nullable(Time),
    health: Type.Union([Type.Literal('healthy'), Type.Literal('failing'), Type.Literal('paused')], {
      description: 'paused while paused; failing when the last 3 attempts (test deliveries aside) failed; else healthy',
    }),
    secret_last4: Type.String(),
    created_at: Time,
    updated_at: Time,
    stats: Type.Object({
      success_rate: nullable(
        Type.Number({
          description: 'Successful / all attempts started in the last 24 hours, retrying deliveries included; null without any',
        }),
      ),
      attempts_24h: Type.Integer({ description: 'Attempts started in the last 24 hours, test deliveries aside: what success_rate counts' }),
      deliveries_24h: Type.Integer({ description: 'Deliveries created in the last 24 hours' }),
      last_delivery_at: nullable(Time),
    }),
  }),
)
export const CreatedSubscription = Type.Object({
  ...Subscription.properties,
  secret: Type.String({ description: 'whsec_...: shown only in this answer' }),
})

export const Attempt = Type.Object({
  attempt: Type.Integer(),
  started_at: Time,
  duration_ms: Type.Integer(),
  response_status: nullable(Type.Integer()),
  error: nullable(Type.String()),
  response_body_excerpt: nullable(Type.String()),
  signature: nullable(Type.String({ description: 'The X-Service-Signature header this attempt sent (null: no request was sent)' })),
  request_headers: nullable(
    Type.Record(Type.String(), Type.String(), {
      description: 'Every header this attempt sent, secrets left out (null: no request was sent, or logged before headers were kept)',
    }),
  ),
})
export const Delivery = named(
  'WebhookDelivery',
  Type.Object({
    delivery_id: Uuid,
    subscription_id: Uuid,
    event: Type.String(),
    event_id: Uuid,
    record_type: Type.String(),
    record_id: Uuid,
    status: Type.String({ enum: DELIVERY_STATUSES }),
    attempt_count: Type.Integer(),
    next_attempt_at: nullable(Time),
    created_at: Time,
    completed_at: nullable(Time),
    test: Type.Boolean({ description: 'A test event (POST .../test): not counted in the stats or auto-pause, never recovered' }),
    attempts: Type.Optional(Type.Array(Attempt)),
    request_headers: Type.Optional(
      Type.Record(Type.String(), Type.String(), {
        description: "The latest attempt's request_headers; before any, the headers every attempt sends, its signatures aside",
      }),
    ),
    body: Type.Optional(
      nullable(
        Type.String({
          description:
            'The body as the latest attempt sent it, byte for byte (earlier attempts differ only in delivered_at); null before the first',
        }),
      ),
    ),
  }),
)
export const RotatedSecret = Type.Object({ id: Uuid, secret: Type.String(), previous_secret_expires_at: nullable(Time) })

export const CreateBody = named(
  'WebhookSubscriptionCreate',
  Type.Object({ name: Name, url: Url, events: Events }, { additionalProperties: false }),
)
export const UpdateBody = named(
  'WebhookSubscriptionUpdate',
  Type.Object(
    {
      name: Type.Optional(Name),
      url: Type.Optional(Url),
      events: Type.Optional(Events),
      id: Type.Optional(Type.Unknown()),
      created_at: Type.Optional(Type.Unknown()),
      updated_at: Type.Optional(Type.Unknown()),
    },
    { additionalProperties: false },
  ),
)
export const RotateBody = Type.Object(
  { grace_period_seconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 604_800, default: 86_400 })) },
  { additionalProperties: false },
)

export const TestBody = Type.Object(
  {
    event: Type.Optional(
      Type.String({
        enum: EVENT_NAMES,
        default: DEFAULT_TEST_EVENT,
        description: 'The event to send a sample of (default contact.created)',
      }),
    ),
  },
  { additionalProperties: false },
)
const RecoverSince = Type.String({
  format: 'date-time',
  maxLength: 40,
  description: `Dead deliveries created at or after this time (at most ${RECOVERY_DAYS} days back)`,
})
const RecoverUntil = Type.String({ format: 'date-time', maxLength: 40, description: 'and before this time (default: now)' })
export const RecoverBody = Type.Object({ since: RecoverSince, until: Type.Optional(RecoverUntil) }, { additionalProperties: false })
export const Recovered = Type.Object({
  deliveries: Type.Integer({ description: 'How many dead deliveries get a fresh cycle (the preview: would get one)' }),
})

/**
 * An event as a webhook delivers it and the events feed lists it (docs/api.md section 8):
 * `delivery_id` and `delivered_at` are a delivery's only, `test` a test delivery's only.
 */
export const WebhookEvent = named(
  'WebhookEvent',
  Type.Object({
    id: Uuid,
    event: Type.String({ enum: EVENT_NAMES }),
    occurred_at: Time,
    delivered_at: Type.Optional(Time),
    delivery_id: Type.Optional(Uuid),
    test: Type.Optional(Type.Boolean({ description: 'Only on a test delivery (POST .../test)' })),
    workspace: Type.Object({ id: Uuid, slug: Type.String() }),
    data: Type.Object({
      object: Type.Union([ContactSchema, CompanySchema, DealSchema], {
        description: "The record after the change (before it, for .deleted); its type is the event name's first word",
      }),
      previous_attributes: Type.Optional(
        Type.Record(Type.String(), Type.Unknown(), { description: 'Updates only: the old value of each changed field' }),
      ),
      associations_changed: Type.Optional(
        Type.Record(Type.String(), Type.Object({ added: Type.Array(Uuid), removed: Type.Array(Uuid) }), {
          description: 'Association updates only, per associated type',
        }),
      ),
    }),
    actor: Type.Object({
      type: Type.String({ enum: ['user', 'system'] }),
      id: nullable(Uuid),
      via: Type.String({ enum: ['api', 'ui', 'import', 'oauth', 'system'], description: 'oauth: an OAuth app acted for the user' }),
      app_id: Type.Optional(Uuid),
    }),
  }),
)

export const one = <T extends TSchema>(schema: T) => Type.Object({ data: schema })
export const page = <T extends TSchema>(schema: T) => Type.Object({ data: Type.Array(schema), next_cursor: nullable(Type.String()) })

export const EXAMPLE = {
  id: '01935f3c-9c00-7a11-9d2e-3c4b5a6f7e8d',
  name: 'Billing sync',
  url: 'https://hooks.example.com/crm',
  events: ['deal.*', 'contact.created'],
  status: 'active',
  health: 'healthy',
  paused_reason: null,
  paused_at: null,
  secret_last4: 'x9Qa',
  created_at: '2026-11-22T03:00:21.123Z',
  updated_at: '2026-11-22T03:00:21.123Z',
  stats: { success_rate: 0.998, attempts_24h: 1535, deliveries_24h: 1532, last_delivery_at: '2026-11-22T03:10:00.000Z' },
}
