// Webhook subscriptions and their delivery log, as the API manages them (docs/api.md section 7). Every
// operation first calls crm.require_webhook_access() (403 for non-admins, 402 without the plan);
// RLS repeats the admin rule, so a member sees zero rows even in SQL. Deliveries are read here and
// written only through SECURITY DEFINER functions (pause, resume, redeliver, rotate, test, recover).
import type { Static } from 'typebox'
import Type from 'typebox'
import { parseCidrList } from '../cidr.ts'
import type { Config } from '../config.ts'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { InvalidParameterError, NotFoundError, ValidationError } from '../errors.ts'
import { decodeCursor, limitOf, type Page, pageOf } from '../paging.ts'
import { UUID_PATTERN } from '../uuid.ts'
import { type AddressPolicy, checkWebhookUrl } from './address-guard.ts'
import { deliveryBody } from './delivery-body.ts'
import { requestHeaders } from './request-headers.ts'
import { sealWebhookSecret, webhookSecretKey } from './secret-store.ts'
import { newWebhookSecret } from './signature.ts'
import { DEFAULT_TEST_EVENT, DELIVERY_STATUSES, Delivery, EVENT_NAME, RECOVERY_DAYS, Subscription } from './subscription-schemas.ts'

export type SubscriptionJson = Static<typeof Subscription>
export type DeliveryJson = Static<typeof Delivery>

const SubscriptionRow = rowType(Type.Object({ subscription: Subscription }))
const DeliveryRow = rowType(Delivery)
const IdRow = rowType(Type.Object({ id: Type.String() }))
const ExpiryRow = rowType(Type.Object({ expires_at: Type.Union([Type.String(), Type.Null()]) }))
const CountRow = rowType(Type.Object({ deliveries: Type.Integer() }))
const BodyPartsRow = rowType(Type.Object({ body_head: Type.String(), body_tail: Type.String() }))

const DELIVERY_COLUMNS = sql.fragment`
  d.id as delivery_id, d.subscription_id, d.event, d.event_id, d.record_type, d.record_id, d.status, d.attempt_count,
  d.next_attempt_at, d.created_at, d.completed_at, d.is_test as test`

/** Subscriptions run oldest first, deliveries newest first; the cursor records which. */
const SUBSCRIPTION_ORDER = 'id'
const DELIVERY_ORDER = '-id'
const ID_CURSOR = [{ kind: 'uuid', nullable: false }]

export async function requireWebhookAccess(db: DatabaseTransactionConnection): Promise<void> {
  await db.query(sql.unsafe`select crm.require_webhook_access()`)
}

// Operations take path ids as sent and check them after access, so a non-admin gets 403 whatever
// the id. A path id that is not a UUID names nothing: 404, like an unknown one.
function idOf(value: string | undefined, what: 'webhook subscription' | 'delivery'): string {
  if (value === undefined || !UUID_PATTERN.test(value)) throw new NotFoundError(`No such ${what}`)
  return value.toLowerCase()
}

async function readSubscription(db: DatabaseTransactionConnection, id: string): Promise<SubscriptionJson> {
  const row = await db.maybeOne(sql.type(SubscriptionRow)`
    select crm.webhook_subscription_json(s.workspace_id, s.id) as subscription from crm.webhook_subscriptions s
     where s.workspace_id = (select crm.current_workspace_id()) and s.id = ${id}`)
  if (row === null) throw new NotFoundError('No such webhook subscription')
  return row.subscription
}

export async function getSubscription(db: DatabaseTransactionConnection, pathId: string | undefined): Promise<SubscriptionJson> {
  await requireWebhookAccess(db)
  return readSubscription(db, idOf(pathId, 'webhook subscription'))
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
    throw new ValidationError(
      `url is not allowed: ${check.reason}`,
      [{ pointer: '/url', code: 'url_not_allowed', message: check.reason }],
      'url_not_allowed',
    )
  }
}

function dedupe(events: string[]): string[] {
  return [...new Set(events)]
}

/** A new subscription with its signing secret, which is shown this once. */
export async function createSubscription(
  db: DatabaseTransactionConnection,
  config: Config,
  workspaceId: string,
  body: { name: string; url: string; events: string[] },
): Promise<SubscriptionJson & { secret: string }> {
  await requireWebhookAccess(db)
  await checkUrl(config, body.url)
  const secret = newWebhookSecret()
  const sealed = sealWebhookSecret(webhookSecretKey(config.appSecret), secret, workspaceId)
  const created = await db.one(sql.type(IdRow)`
    insert into crm.webhook_subscriptions (name, url, events, secret_encrypted, secret_last4)
    values (${body.name}, ${body.url}, ${sql.array(dedupe(body.events), 'text')}, ${sql.binary(sealed)}, ${secret.slice(-4)})
    returning id`)
  return { ...(await readSubscription(db, created.id)), secret }
}

/** Changes only the fields sent. */
export async function updateSubscription(
  db: DatabaseTransactionConnection,
  config: Config,
  pathId: string | undefined,
  body: { name?: string; url?: string; events?: string[] },
): Promise<SubscriptionJson> {
  await requireWebhookAccess(db)
  const id = idOf(pathId, 'webhook subscription')
  if (body.url !== undefined) await checkUrl(config, body.url)
  const sets = [
    body.name !== undefined ? sql.fragment`name = ${body.name}` : null,
    body.url !== undefined ? sql.fragment`url = ${body.url}` : null,
    body.events !== undefined ? sql.fragment`events = ${sql.array(dedupe(body.events), 'text')}` : null,
  ].filter((set) => set !== null)
  if (sets.length > 0) {
    const changed = await db.maybeOne(sql.type(IdRow)`
      update crm.webhook_subscriptions set ${sql.join(sets, sql.fragment`, `)}
       where workspace_id = (select crm.current_workspace_id()) and id = ${id} returning id`)
    if (changed === null) throw new NotFoundError('No such webhook subscription')
  }
  return readSubscription(db, id)
}

export async function deleteSubscription(db: DatabaseTransactionConnection, pathId: string | undefined): Promise<void> {
  await requireWebhookAccess(db)
  const id = idOf(pathId, 'webhook subscription')
  const deleted = await db.maybeOne(sql.type(IdRow)`
    delete from crm.webhook_subscriptions
     where workspace_id = (select crm.current_workspace_id()) and id = ${id} returning id`)
  if (deleted === null) throw new NotFoundError('No such webhook subscription')
}

/** Pause (held until resume) or resume (held deliveries go out in order); the functions check access themselves. */
export async function setSubscriptionPaused(
  db: DatabaseTransactionConnection,
  pathId: string | undefined,
  paused: boolean,
): Promise<SubscriptionJson> {
  const id = idOf(pathId, 'webhook subscription')
  await db.query(
    paused ? sql.unsafe`select crm.pause_webhook_subscription(${id})` : sql.unsafe`select crm.resume_webhook_subscription(${id})`,
  )
  return readSubscription(db, id)
}

/** A new signing secret; the old one keeps signing for `graceSeconds`. */
export async function rotateSecret(
  db: DatabaseTransactionConnection,
  config: Config,
  workspaceId: string,
  pathId: string | undefined,
  graceSeconds: number,
) {
  await requireWebhookAccess(db)
  const id = idOf(pathId, 'webhook subscription')
  const secret = newWebhookSecret()
  const sealed = sealWebhookSecret(webhookSecretKey(config.appSecret), secret, workspaceId)
  const { expires_at } = await db.one(sql.type(ExpiryRow)`
    select crm.rotate_webhook_secret(${id}, ${sql.binary(sealed)}, ${secret.slice(-4)}, ${graceSeconds}) as expires_at`)
  return { id, secret, previous_secret_expires_at: expires_at }
}

/** The workspace's subscriptions, oldest first, a page at a time (`limit`, `cursor`). */
export async function listSubscriptions(
  db: DatabaseTransactionConnection,
  parameters: Map<string, string>,
): Promise<Page<SubscriptionJson>> {
  await requireWebhookAccess(db)
  const limit = limitOf(parameters.get('limit'))
  const cursor = parameters.get('cursor')
  const after = cursor === undefined ? null : decodeCursor(cursor, SUBSCRIPTION_ORDER, ID_CURSOR).values[0]
  const rows = await db.any(sql.type(SubscriptionRow)`
    select crm.webhook_subscription_json(s.workspace_id, s.id) as subscription from crm.webhook_subscriptions s
     where s.workspace_id = (select crm.current_workspace_id()) ${after ? sql.fragment`and s.id > ${after}` : sql.fragment``}
     order by s.id limit ${limit + 1}`)
  return pageOf(
    rows.map((row) => row.subscription),
    limit,
    SUBSCRIPTION_ORDER,
    (subscription) => subscription.id,
  )
}

const DELIVERY_PARAMETERS = ['status', 'event', 'limit', 'cursor']

/** A subscription's deliveries, newest first, filtered by `status` and `event`, a page at a time. */
export async function listDeliveries(
  db: DatabaseTransactionConnection,
  pathId: string | undefined,
  parameters: Map<string, string>,
): Promise<Page<DeliveryJson>> {
  await requireWebhookAccess(db)
  const id = idOf(pathId, 'webhook subscription')
  for (const name of parameters.keys()) {
    if (!DELIVERY_PARAMETERS.includes(name)) throw new InvalidParameterError(`Unknown query parameter ${name}`)
  }
  const limit = limitOf(parameters.get('limit'))
  const status = parameters.get('status')
  if (status !== undefined && !DELIVERY_STATUSES.includes(status))
    throw new InvalidParameterError(`status must be one of ${DELIVERY_STATUSES.join(', ')}`)
  const event = parameters.get('event')
  if (event !== undefined && !EVENT_NAME.test(event)) throw new InvalidParameterError('event must be an event name such as deal.updated')
  const cursor = parameters.get('cursor')
  const before = cursor === undefined ? null : decodeCursor(cursor, DELIVERY_ORDER, ID_CURSOR).values[0]
  await readSubscription(db, id)
  const rows = await db.any(sql.type(DeliveryRow)`
    select ${DELIVERY_COLUMNS} from crm.webhook_deliveries d
     where d.workspace_id = (select crm.current_workspace_id()) and d.subscription_id = ${id}
       ${status ? sql.fragment`and d.status = ${status}` : sql.fragment``}
       ${event ? sql.fragment`and d.event = ${event}` : sql.fragment``}
       ${before ? sql.fragment`and d.id < ${before}` : sql.fragment``}
     order by d.id desc limit ${limit + 1}`)
  return pageOf(rows, limit, DELIVERY_ORDER, (delivery) => delivery.delivery_id)
}

/** One delivery with all its attempts. */
export async function readDelivery(
  db: DatabaseTransactionConnection,
  pathId: string | undefined,
  pathDeliveryId: string | undefined,
): Promise<DeliveryJson> {
  await requireWebhookAccess(db)
  const id = idOf(pathId, 'webhook subscription')
  const deliveryId = idOf(pathDeliveryId, 'delivery')
  const delivery = await db.maybeOne(sql.type(DeliveryRow)`
    select ${DELIVERY_COLUMNS},
           coalesce((select json_agg(json_build_object(
                      'attempt', a.attempt, 'started_at', crm.api_time(a.started_at), 'duration_ms', a.duration_ms,
                      'response_status', a.response_status, 'error', a.error, 'response_body_excerpt', a.response_body_excerpt,
                      'signature', a.signature, 'request_headers', a.request_headers)
                      order by a.attempt)
                      from crm.webhook_attempts a where a.workspace_id = d.workspace_id and a.delivery_id = d.id), '[]') as attempts
      from crm.webhook_deliveries d
     where d.workspace_id = (select crm.current_workspace_id()) and d.subscription_id = ${id} and d.id = ${deliveryId}`)
  if (delivery === null) throw new NotFoundError('No such delivery')
  const latest = delivery.attempts?.at(-1)
  const headers =
    latest?.request_headers ?? requestHeaders({ event: delivery.event, deliveryId: delivery.delivery_id, subscriptionId: id }, null)
  if (latest === undefined) return { ...delivery, request_headers: headers, body: null }
  // The body of the latest attempt: built as the worker built it, around that attempt's start,
  // which is the delivered_at it sent.
  const parts = await db.maybeOne(sql.type(BodyPartsRow)`select * from crm.webhook_delivery_body(${id}, ${deliveryId})`)
  const body = parts === null ? null : deliveryBody(parts, new Date(latest.started_at)).toString('latin1')
  return { ...delivery, request_headers: headers, body }
}

/** A fresh cycle of attempts for a delivery, the first at once (the function checks access itself). */
export async function redeliver(
  db: DatabaseTransactionConnection,
  pathId: string | undefined,
  pathDeliveryId: string | undefined,
): Promise<DeliveryJson> {
  const id = idOf(pathId, 'webhook subscription')
  const deliveryId = idOf(pathDeliveryId, 'delivery')
  await db.query(sql.unsafe`select crm.redeliver_webhook(${id}, ${deliveryId})`)
  return db.one(sql.type(DeliveryRow)`
    select ${DELIVERY_COLUMNS} from crm.webhook_deliveries d
     where d.workspace_id = (select crm.current_workspace_id()) and d.id = ${deliveryId}`)
}

/** A sample of an event sent to the subscription as a test delivery (sent even while paused). */
export async function sendTestEvent(
  db: DatabaseTransactionConnection,
  pathId: string | undefined,
  body: { event?: string },
): Promise<DeliveryJson> {
  const id = idOf(pathId, 'webhook subscription')
  const { delivery_id } = await db.one(
    sql.type(rowType(Type.Object({ delivery_id: Type.String() })))`
      select crm.send_webhook_test_event(${id}, ${body.event ?? DEFAULT_TEST_EVENT}) as delivery_id`,
  )
  return db.one(sql.type(DeliveryRow)`
    select ${DELIVERY_COLUMNS} from crm.webhook_deliveries d
     where d.workspace_id = (select crm.current_workspace_id()) and d.id = ${delivery_id}`)
}

export type RecoveryWindow = { since: string; until?: string }

/** A time of the API's format (the schema checked its shape) as an instant PostgreSQL can hold. */
function instantOf(value: string, pointer: string): string {
  const time = new Date(value)
  if (Number.isNaN(time.getTime()) || time.getUTCFullYear() < 1 || time.getUTCFullYear() > 9999)
    throw new ValidationError(`${pointer.slice(1)} must be an RFC 3339 time`, [
      { pointer, code: 'format', message: 'must be an RFC 3339 time such as 2026-11-22T03:00:21.123Z' },
    ])
  return time.toISOString()
}

/** Every dead delivery created in the window gets a fresh cycle (the function checks access and the window). */
export async function recoverDeliveries(
  db: DatabaseTransactionConnection,
  pathId: string | undefined,
  window: RecoveryWindow,
): Promise<{ deliveries: number }> {
  const id = idOf(pathId, 'webhook subscription')
  const since = instantOf(window.since, '/since')
  const until = window.until === undefined ? null : instantOf(window.until, '/until')
  return db.one(sql.type(CountRow)`select crm.recover_webhook_deliveries(${id}, ${since}, ${until}) as deliveries`)
}

const RECOVERY_PARAMETERS = ['since', 'until']
const RFC3339 = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$/i

/** How many deliveries a recovery with this window would send again; nothing changes. */
export async function previewRecovery(
  db: DatabaseTransactionConnection,
  pathId: string | undefined,
  parameters: Map<string, string>,
): Promise<{ deliveries: number }> {
  await requireWebhookAccess(db)
  const id = idOf(pathId, 'webhook subscription')
  // Another workspace's subscription is not found, whatever the query says.
  await readSubscription(db, id)
  for (const name of parameters.keys()) {
    if (!RECOVERY_PARAMETERS.includes(name)) throw new InvalidParameterError(`Unknown query parameter ${name}`)
  }
  const instant = (name: string): string | null => {
    const value = parameters.get(name)
    if (value === undefined) return null
    const time = new Date(value)
    if (value.length > 40 || !RFC3339.test(value) || Number.isNaN(time.getTime()) || time.getUTCFullYear() > 9999)
      throw new InvalidParameterError(`${name} must be an RFC 3339 time such as 2026-11-22T03:00:21.123Z`)
    return time.toISOString()
  }
  const since = instant('since')
  const until = instant('until')
  if (since === null) throw new InvalidParameterError('since is required')
  if (Date.parse(since) < Date.now() - RECOVERY_DAYS * 86_400_000)
    throw new InvalidParameterError(`since must be at most ${RECOVERY_DAYS} days back`)
  if (until !== null && Date.parse(until) <= Date.parse(since)) throw new InvalidParameterError('until must be later than since')
  return db.one(sql.type(CountRow)`select crm.webhook_recovery_count(${id}, ${since}, ${until}) as deliveries`)
}
