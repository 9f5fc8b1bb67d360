// /api/webhook-subscriptions (API.md section 7). Every handler first calls
// crm.require_webhook_access() (403 for non-admins, 402 without the plan); RLS repeats the admin
// rule, so a member sees zero rows even in SQL. Deliveries are read here and written only through
// SECURITY DEFINER functions (pause, resume, redeliver, rotate).
import Type from 'typebox'
import { sql, type DatabaseTransactionConnection } from '../../db/pool.ts'
import { UUID_PATTERN, UUID_SCHEMA_PATTERN } from '../../records/fields.ts'
import { parseQueryString } from '../../records/query-string.ts'
import { checkWebhookUrl, parseCidrList, type AddressPolicy } from '../../webhooks/address-guard.ts'
import { sealWebhookSecret, webhookSecretKey } from '../../webhooks/secret-store.ts'
import { newWebhookSecret } from '../../webhooks/signature.ts'
import type { Config } from '../../config.ts'
import { problems } from '../problem.ts'
import { defineRoutes, patchAndPut, type RouteContext } from '../route.ts'

const BASE = '/api/webhook-subscriptions'
const TAG = 'webhooks'
const EVENT_PATTERN = '^(\\*|(contact|company|deal)\\.(\\*|created|updated|deleted))$'
const EVENT_NAME = /^(contact|company|deal)\.(created|updated|deleted)$/
const DELIVERY_STATUSES = ['pending', 'retrying', 'delivered', 'dead', 'held']

const nullable = (schema: Parameters<typeof Type.Union>[0][number]) => Type.Union([schema, Type.Null()])
const Uuid = Type.String({ format: 'uuid', maxLength: 36, pattern: UUID_SCHEMA_PATTERN })
const Time = Type.String({ format: 'date-time' })
const Events = Type.Array(Type.String({ maxLength: 15, pattern: EVENT_PATTERN, description: 'An event name, contact.*, company.*, deal.* or *' }), {
  minItems: 1,
  maxItems: 20,
})
const Name = Type.String({ minLength: 1, maxLength: 255, pattern: '\\S' })
const Url = Type.String({ minLength: 1, maxLength: 2048, description: 'https only; must resolve to public addresses' })

const Subscription = Type.Object({
  id: Uuid,
  name: Type.String(),
  url: Type.String(),
  events: Type.Array(Type.String()),
  status: Type.Union([Type.Literal('active'), Type.Literal('paused')]),
  paused_reason: nullable(Type.Union([Type.Literal('manual'), Type.Literal('auto')])),
  paused_at: nullable(Time),
  secret_last4: Type.String(),
  created_at: Time,
  updated_at: Time,
  stats: Type.Object({
    success_rate: nullable(Type.Number({ description: 'delivered / (delivered + dead) over the last 24 hours' })),
    deliveries_24h: Type.Integer({ description: 'Deliveries created in the last 24 hours' }),
    last_delivery_at: nullable(Time),
  }),
})
const Attempt = Type.Object({
  attempt: Type.Integer(),
  started_at: Time,
  duration_ms: Type.Integer(),
  response_status: nullable(Type.Integer()),
  error: nullable(Type.String()),
  response_body_excerpt: nullable(Type.String()),
})
const Delivery = Type.Object({
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
  attempts: Type.Optional(Type.Array(Attempt)),
})
const one = (schema: Parameters<typeof Type.Object>[0] | ReturnType<typeof Type.Object>) => Type.Object({ data: schema as ReturnType<typeof Type.Object> })
const page = (schema: ReturnType<typeof Type.Object>) => Type.Object({ data: Type.Array(schema), next_cursor: nullable(Type.String()) })

const CreateBody = Type.Object({ name: Name, url: Url, events: Events }, { additionalProperties: false })
const UpdateBody = Type.Object(
  {
    name: Type.Optional(Name),
    url: Type.Optional(Url),
    events: Type.Optional(Events),
    id: Type.Optional(Type.Unknown()),
    created_at: Type.Optional(Type.Unknown()),
    updated_at: Type.Optional(Type.Unknown()),
  },
  { additionalProperties: false },
)
const RotateBody = Type.Object({ grace_period_seconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 604_800, default: 86_400 })) }, { additionalProperties: false })

const EXAMPLE = {
  id: '01935f3c-9c00-7a11-9d2e-3c4b5a6f7e8d',
  name: 'Billing sync',
  url: 'https://hooks.example.com/crm',
  events: ['deal.*', 'contact.created'],
  status: 'active',
  paused_reason: null,
  paused_at: null,
  secret_last4: 'x9Qa',
  created_at: '2026-11-22T03:00:21.123Z',
  updated_at: '2026-11-22T03:00:21.123Z',
  stats: { success_rate: 0.998, deliveries_24h: 1532, last_delivery_at: '2026-11-22T03:10:00.000Z' },
}

// ---------------------------------------------------------------------------------------------

const SUBSCRIPTION_COLUMNS = sql.fragment`
  s.id, s.name, s.url, s.events, s.status, s.paused_reason, s.paused_at, s.secret_last4, s.created_at, s.updated_at,
  json_build_object(
    'success_rate', (select round(count(*) filter (where d.status = 'delivered')::numeric / nullif(count(*), 0), 4)::float8
                       from crm.webhook_deliveries d
                      where d.workspace_id = s.workspace_id and d.subscription_id = s.id
                        and d.completed_at is not null and d.completed_at > now() - interval '24 hours'),
    'deliveries_24h', (select count(*) from crm.webhook_deliveries d
                        where d.workspace_id = s.workspace_id and d.subscription_id = s.id
                          and d.id >= crm.uuid_v7_floor(now() - interval '24 hours')),
    'last_delivery_at', (select crm.api_time(d.created_at) from crm.webhook_deliveries d
                          where d.workspace_id = s.workspace_id and d.subscription_id = s.id
                          order by d.id desc limit 1)
  ) as stats`

const DELIVERY_COLUMNS = sql.fragment`
  d.id as delivery_id, d.subscription_id, d.event, d.event_id, d.record_type, d.record_id, d.status, d.attempt_count,
  d.next_attempt_at, d.created_at, d.completed_at`

async function access(db: DatabaseTransactionConnection): Promise<void> {
  await db.query(sql.unsafe`select crm.require_webhook_access()`)
}

function uuidParam(value: string | undefined, what: string): string {
  if (value === undefined || !UUID_PATTERN.test(value)) throw problems.notFound(`No such ${what}`)
  return value.toLowerCase()
}

async function readSubscription(db: DatabaseTransactionConnection, id: string): Promise<Record<string, unknown>> {
  const row = await db.maybeOne(sql.unsafe`
    select ${SUBSCRIPTION_COLUMNS} from crm.webhook_subscriptions s
     where s.workspace_id = (select crm.current_workspace_id()) and s.id = ${id}`)
  if (row === null) throw problems.notFound('No such webhook subscription')
  return row as Record<string, unknown>
}

const policies = new WeakMap<Config, AddressPolicy>()
function policyOf(config: Config): AddressPolicy {
  let policy = policies.get(config)
  if (!policy) {
    policy = { allowHttp: config.webhook.allowHttp, allowedCidrs: parseCidrList(config.webhook.allowedCidrs) }
    policies.set(config, policy)
  }
  return policy
}

async function checkUrl(config: Config, url: string): Promise<void> {
  const check = await checkWebhookUrl(url, policyOf(config))
  if (!check.ok) {
    throw problems.validation(`url is not allowed: ${check.reason}`, [{ pointer: '/url', code: 'url_not_allowed', message: check.reason }], 'url_not_allowed')
  }
}

function dedupe(events: string[]): string[] {
  return [...new Set(events)]
}

function cursorOf(id: string): string {
  return Buffer.from(id).toString('base64url')
}

function decodeCursor(text: string): string {
  const id = /^[A-Za-z0-9_-]{1,100}$/.test(text) ? Buffer.from(text, 'base64url').toString('utf8') : ''
  if (!UUID_PATTERN.test(id)) throw problems.invalidParameter('cursor is not valid: pass the next_cursor of the previous page unchanged')
  return id
}

function limitOf(parameters: Map<string, string>): number {
  const text = parameters.get('limit')
  if (text === undefined) return 50
  if (!/^\d{1,3}$/.test(text) || Number(text) < 1 || Number(text) > 200) {
    throw problems.invalidParameter('limit must be a whole number from 1 to 200', [{ pointer: 'limit', code: 'range', message: 'must be 1 to 200' }])
  }
  return Number(text)
}

function nextLink(path: string, parameters: Map<string, string>, cursor: string): string {
  const next = new Map(parameters)
  next.set('cursor', cursor)
  return `<${path}?${[...next].map(([name, value]) => `${encodeURIComponent(name)}=${encodeURIComponent(value)}`).join('&')}>; rel="next"`
}

function pageOf<T extends Record<string, unknown>>(rows: readonly T[], limit: number, key: (row: T) => string, path: string, parameters: Map<string, string>) {
  const data = rows.slice(0, limit)
  const nextCursor = rows.length > limit ? cursorOf(key(data[data.length - 1])) : null
  return { body: { data, next_cursor: nextCursor }, headers: nextCursor ? { Link: nextLink(path, parameters, nextCursor) } : {} }
}

/** Pause or resume (a SECURITY DEFINER function that checks access itself), then the subscription as it is now. */
function changeStatus(statement: (id: string) => ReturnType<typeof sql.unsafe>) {
  return async ({ db, params }: RouteContext) => {
    const id = uuidParam(params.id, 'webhook subscription')
    await db.query(statement(id))
    return { body: { data: await readSubscription(db, id) } }
  }
}

// ---------------------------------------------------------------------------------------------

async function update({ db, params, body, services }: RouteContext<{ name?: string; url?: string; events?: string[] }>) {
  await access(db)
  const id = uuidParam(params.id, 'webhook subscription')
  if (body.url !== undefined) await checkUrl(services.config, body.url)
  const sets = [
    body.name !== undefined ? sql.fragment`name = ${body.name}` : null,
    body.url !== undefined ? sql.fragment`url = ${body.url}` : null,
    body.events !== undefined ? sql.fragment`events = ${sql.array(dedupe(body.events), 'text')}` : null,
  ].filter((set) => set !== null)
  if (sets.length > 0) {
    const changed = await db.maybeOne(sql.unsafe`
      update crm.webhook_subscriptions set ${sql.join(sets, sql.fragment`, `)}
       where workspace_id = (select crm.current_workspace_id()) and id = ${id} returning id`)
    if (changed === null) throw problems.notFound('No such webhook subscription')
  }
  return { body: { data: await readSubscription(db, id) } }
}

export default defineRoutes(
  {
    method: 'POST',
    path: BASE,
    summary: 'Create a webhook subscription; the answer holds the signing secret, shown this once',
    tag: TAG,
    auth: 'required',
    body: CreateBody,
    status: 201,
    response: one(Type.Object({ ...Subscription.properties, secret: Type.String({ description: 'whsec_...: shown only in this answer' }) })),
    errors: [401, 402, 403, 413, 415, 422],
    example: { request: { name: EXAMPLE.name, url: EXAMPLE.url, events: EXAMPLE.events }, response: { data: { ...EXAMPLE, secret: 'whsec_...' } } },
    handler: async ({ db, body, caller, services }) => {
      await access(db)
      const { name, url, events } = body as { name: string; url: string; events: string[] }
      await checkUrl(services.config, url)
      const secret = newWebhookSecret()
      const sealed = sealWebhookSecret(webhookSecretKey(services.config.appSecret), secret, caller.workspaceId)
      const created = (await db.one(sql.unsafe`
        insert into crm.webhook_subscriptions (name, url, events, secret_encrypted, secret_last4)
        values (${name}, ${url}, ${sql.array(dedupe(events), 'text')}, ${sql.binary(sealed)}, ${secret.slice(-4)})
        returning id`)) as { id: string }
      const subscription = await readSubscription(db, created.id)
      return { status: 201, body: { data: { ...subscription, secret } }, headers: { Location: `${BASE}/${created.id}` } }
    },
  },
  {
    method: 'GET',
    path: BASE,
    summary: 'List the webhook subscriptions (oldest first, paged)',
    tag: TAG,
    auth: 'required',
    response: page(Subscription),
    queryParameters: {
      limit: { description: 'Page size, 1 to 200 (default 50)', schema: { type: 'integer', minimum: 1, maximum: 200, default: 50 } },
      cursor: { description: 'The next_cursor of the previous page (opaque)', schema: { type: 'string' } },
    },
    errors: [400, 401, 402, 403],
    example: { response: { data: [EXAMPLE], next_cursor: null } },
    handler: async ({ db, req }) => {
      await access(db)
      const parameters = parseQueryString(req.url)
      const limit = limitOf(parameters)
      const after = parameters.has('cursor') ? decodeCursor(parameters.get('cursor')!) : null
      const rows = (await db.any(sql.unsafe`
        select ${SUBSCRIPTION_COLUMNS} from crm.webhook_subscriptions s
         where s.workspace_id = (select crm.current_workspace_id()) ${after ? sql.fragment`and s.id > ${after}` : sql.fragment``}
         order by s.id limit ${limit + 1}`)) as Record<string, unknown>[]
      return pageOf(rows, limit, (row) => row.id as string, BASE, parameters)
    },
  },
  {
    method: 'GET',
    path: `${BASE}/:id`,
    summary: 'Read a webhook subscription with its 24-hour stats',
    tag: TAG,
    auth: 'required',
    response: one(Subscription),
    errors: [401, 402, 403, 404],
    example: { response: { data: EXAMPLE } },
    handler: async ({ db, params }) => {
      await access(db)
      return { body: { data: await readSubscription(db, uuidParam(params.id, 'webhook subscription')) } }
    },
  },
  patchAndPut({
    path: `${BASE}/:id`,
    summary: 'Change name, url or events of a webhook subscription (only the fields sent change)',
    tag: TAG,
    auth: 'required',
    body: UpdateBody,
    response: one(Subscription),
    errors: [401, 402, 403, 404, 413, 415, 422],
    example: { request: { events: ['*'] }, response: { data: { ...EXAMPLE, events: ['*'] } } },
    handler: update as (context: RouteContext) => ReturnType<typeof update>,
  }),
  {
    method: 'DELETE',
    path: `${BASE}/:id`,
    summary: 'Delete a webhook subscription; its pending deliveries are cancelled and its delivery log removed',
    tag: TAG,
    auth: 'required',
    status: 204,
    errors: [401, 402, 403, 404],
    handler: async ({ db, params }) => {
      await access(db)
      const deleted = await db.maybeOne(sql.unsafe`
        delete from crm.webhook_subscriptions
         where workspace_id = (select crm.current_workspace_id()) and id = ${uuidParam(params.id, 'webhook subscription')} returning id`)
      if (deleted === null) throw problems.notFound('No such webhook subscription')
      return { status: 204 }
    },
  },
  {
    method: 'POST',
    path: `${BASE}/:id/pause`,
    summary: 'Pause a subscription: new events and due retries are held until resume',
    tag: TAG,
    auth: 'required',
    response: one(Subscription),
    errors: [401, 402, 403, 404],
    example: { response: { data: { ...EXAMPLE, status: 'paused', paused_reason: 'manual', paused_at: '2026-11-22T03:11:00.000Z' } } },
    handler: changeStatus((id) => sql.unsafe`select crm.pause_webhook_subscription(${id})`),
  },
  {
    method: 'POST',
    path: `${BASE}/:id/resume`,
    summary: 'Resume a subscription: held deliveries go out in their original order with the attempts they had left',
    tag: TAG,
    auth: 'required',
    response: one(Subscription),
    errors: [401, 402, 403, 404],
    example: { response: { data: EXAMPLE } },
    handler: changeStatus((id) => sql.unsafe`select crm.resume_webhook_subscription(${id})`),
  },
  {
    method: 'POST',
    path: `${BASE}/:id/rotate-secret`,
    summary: 'Replace the signing secret; the old one keeps signing (a second v1) for the grace period',
    tag: TAG,
    auth: 'required',
    body: RotateBody,
    response: one(Type.Object({ id: Uuid, secret: Type.String(), previous_secret_expires_at: nullable(Time) })),
    errors: [401, 402, 403, 404, 422],
    example: { request: { grace_period_seconds: 86400 }, response: { data: { id: EXAMPLE.id, secret: 'whsec_...', previous_secret_expires_at: '2026-11-23T03:00:21.123Z' } } },
    handler: async ({ db, params, body, caller, services }) => {
      await access(db)
      const id = uuidParam(params.id, 'webhook subscription')
      const grace = (body as { grace_period_seconds?: number }).grace_period_seconds ?? 86_400
      const secret = newWebhookSecret()
      const sealed = sealWebhookSecret(webhookSecretKey(services.config.appSecret), secret, caller.workspaceId)
      const expires = await db.oneFirst(sql.unsafe`select crm.rotate_webhook_secret(${id}, ${sql.binary(sealed)}, ${secret.slice(-4)}, ${grace})`)
      return { body: { data: { id, secret, previous_secret_expires_at: expires } } }
    },
  },
  {
    method: 'GET',
    path: `${BASE}/:id/deliveries`,
    summary: 'The delivery log of a subscription, newest first (attempts are in the single-delivery read)',
    tag: TAG,
    auth: 'required',
    response: page(Delivery),
    queryParameters: {
      status: { description: 'Only deliveries in this status', schema: { type: 'string', enum: DELIVERY_STATUSES } },
      event: { description: 'Only deliveries of this event name (e.g. deal.updated)', schema: { type: 'string' } },
      limit: { description: 'Page size, 1 to 200 (default 50)', schema: { type: 'integer', minimum: 1, maximum: 200, default: 50 } },
      cursor: { description: 'The next_cursor of the previous page (opaque)', schema: { type: 'string' } },
    },
    errors: [400, 401, 402, 403, 404],
    handler: async ({ db, req, params }) => {
      await access(db)
      const id = uuidParam(params.id, 'webhook subscription')
      const parameters = parseQueryString(req.url)
      for (const name of parameters.keys()) {
        if (!['status', 'event', 'limit', 'cursor'].includes(name)) throw problems.invalidParameter(`Unknown query parameter ${name}`)
      }
      const limit = limitOf(parameters)
      const status = parameters.get('status')
      if (status !== undefined && !DELIVERY_STATUSES.includes(status)) throw problems.invalidParameter(`status must be one of ${DELIVERY_STATUSES.join(', ')}`)
      const event = parameters.get('event')
      if (event !== undefined && !EVENT_NAME.test(event)) throw problems.invalidParameter('event must be an event name such as deal.updated')
      const before = parameters.has('cursor') ? decodeCursor(parameters.get('cursor')!) : null
      await readSubscription(db, id)
      const rows = (await db.any(sql.unsafe`
        select ${DELIVERY_COLUMNS} from crm.webhook_deliveries d
         where d.workspace_id = (select crm.current_workspace_id()) and d.subscription_id = ${id}
           ${status ? sql.fragment`and d.status = ${status}` : sql.fragment``}
           ${event ? sql.fragment`and d.event = ${event}` : sql.fragment``}
           ${before ? sql.fragment`and d.id < ${before}` : sql.fragment``}
         order by d.id desc limit ${limit + 1}`)) as Record<string, unknown>[]
      return pageOf(rows, limit, (row) => row.delivery_id as string, `${BASE}/${id}/deliveries`, parameters)
    },
  },
  {
    method: 'GET',
    path: `${BASE}/:id/deliveries/:delivery_id`,
    summary: 'One delivery with all its attempts',
    tag: TAG,
    auth: 'required',
    response: one(Delivery),
    errors: [401, 402, 403, 404],
    handler: async ({ db, params }) => {
      await access(db)
      const id = uuidParam(params.id, 'webhook subscription')
      const deliveryId = uuidParam(params.delivery_id, 'delivery')
      const delivery = await db.maybeOne(sql.unsafe`
        select ${DELIVERY_COLUMNS},
               coalesce((select json_agg(json_build_object(
                          'attempt', a.attempt, 'started_at', crm.api_time(a.started_at), 'duration_ms', a.duration_ms,
                          'response_status', a.response_status, 'error', a.error, 'response_body_excerpt', a.response_body_excerpt)
                          order by a.attempt)
                          from crm.webhook_attempts a where a.workspace_id = d.workspace_id and a.delivery_id = d.id), '[]') as attempts
          from crm.webhook_deliveries d
         where d.workspace_id = (select crm.current_workspace_id()) and d.subscription_id = ${id} and d.id = ${deliveryId}`)
      if (delivery === null) throw problems.notFound('No such delivery')
      return { body: { data: delivery } }
    },
  },
  {
    method: 'POST',
    path: `${BASE}/:id/deliveries/:delivery_id/redeliver`,
    summary: 'Send a delivery again: a fresh cycle of 7 attempts, same delivery_id, the first at once',
    tag: TAG,
    auth: 'required',
    status: 202,
    response: one(Delivery),
    errors: [401, 402, 403, 404],
    handler: async ({ db, params }) => {
      const id = uuidParam(params.id, 'webhook subscription')
      const deliveryId = uuidParam(params.delivery_id, 'delivery')
      await db.query(sql.unsafe`select crm.redeliver_webhook(${id}, ${deliveryId})`)
      const delivery = await db.one(sql.unsafe`
        select ${DELIVERY_COLUMNS} from crm.webhook_deliveries d
         where d.workspace_id = (select crm.current_workspace_id()) and d.id = ${deliveryId}`)
      return { status: 202, body: { data: delivery } }
    },
  },
)
