// Sends a batch of deliveries of one subscription and records every attempt in one call. Shared by
// the two tasks that make attempts: fan_out_event (first attempts, right after it created the
// deliveries) and deliver_webhook (retries, releases, redeliveries, deferred batches).
//
// All HTTP happens outside any transaction: the caller's read committed first, and the attempts
// are recorded afterwards by crm.record_webhook_attempts, which also adds the retry jobs (run_at per
// WEBHOOK_RETRY_SCHEDULE) and applies the dead/auto-pause rule. A worker killed mid-batch leaves
// its job locked; the heartbeat unlocks it and the job runs again, sending what was not recorded
// (at least once; receivers deduplicate on X-Service-Delivery-Id).
import { readFileSync } from 'node:fs'
import type { KeyObject } from 'node:crypto'
import type { JobHelpers } from 'graphile-worker'
import type { Config } from '../config.ts'
import { parseCidrList, type AddressPolicy } from './address-guard.ts'
import { deliveryBody } from './delivery-body.ts'
import { openWebhookSecret, webhookSecretKey } from './secret-store.ts'
import { sendSignedWebhook, type WebhookAttempt } from './send.ts'
import { webhookSigningKey } from './signature.ts'
import { SubscriptionLimiter } from './subscription-limiter.ts'

const VERSION = (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version
export const USER_AGENT = `crm-webhooks/${VERSION}`

/** How long a batch waits for a slot of its subscription before it gives its worker slot back. */
export const WAIT_FOR_SLOT_MS = 50
/** No attempt of a batch starts later than this after its first. */
const BATCH_BUDGET_MS = 2_000

/** One delivery to attempt, as crm.webhook_deliveries_to_send and crm.fan_out_webhook_events return it. */
export type DeliveryToSend = {
  delivery_id: string
  generation: number
  event_id: string
  event: string
  occurred_at: Date
  data: Record<string, unknown>
  actor: Record<string, unknown>
  attempt: number
  workspace_slug: string
  url: string
  secret_encrypted: Buffer
  previous_secret_encrypted: Buffer | null
}

type Sent = { row: DeliveryToSend; startedAt: Date; result: WebhookAttempt }

export class WebhookBatchSender {
  readonly limiter: SubscriptionLimiter
  readonly #config: Config
  readonly #policy: AddressPolicy
  readonly #secretKey: Buffer
  // Opening a secret and building its HMAC key costs more than the HMAC itself; sealed bytes are
  // immutable (rotation writes new ones), so they are a safe cache key.
  readonly #signingKeys = new Map<string, KeyObject>()

  constructor(config: Config) {
    this.#config = config
    this.#policy = { allowHttp: config.webhook.allowHttp, allowedCidrs: parseCidrList(config.webhook.allowedCidrs) }
    this.#secretKey = webhookSecretKey(config.appSecret)
    this.limiter = new SubscriptionLimiter(config.webhook.concurrencyPerSubscription)
  }

  /**
   * Sends the rows (all of one subscription) and records the attempts made. `holdsSlot`: the caller
   * already took one slot of the subscription, which this gives back. `ordered`: a resume's release,
   * one delivery sent even at the cap. Returns the rows not attempted (a slow endpoint or the batch
   * budget), which the caller hands to a later job.
   */
  async sendAndRecord(
    helpers: JobHelpers,
    workspaceId: string,
    subscriptionId: string,
    rows: DeliveryToSend[],
    options: { holdsSlot: boolean; ordered?: boolean },
  ): Promise<DeliveryToSend[]> {
    const { limiter } = this
    const ordered = options.ordered ?? false
    if (rows.length === 0) {
      if (options.holdsSlot) limiter.release(subscriptionId)
      return []
    }
    const secrets = [this.#signingKey(rows[0].secret_encrypted, workspaceId)]
    if (rows[0].previous_secret_encrypted !== null) secrets.push(this.#signingKey(rows[0].previous_secret_encrypted, workspaceId))

    // Senders share the batch, each taking deliveries one after the other. Every attempt holds one
    // slot of the subscription (the first sender starts with the caller's slot) and gives it back
    // when done, so batches of one subscription take turns slot by slot and the subscription never
    // has more than `limit` attempts in flight in this process. A sender that waits
    // WAIT_FOR_SLOT_MS in vain stops (a slow endpoint), and after BATCH_BUDGET_MS no new attempt
    // starts: the rest goes back to the caller, so a slow endpoint cannot hold a worker slot, or the
    // records and retries of attempts already made, for long.
    const sent: Sent[] = []
    const budgetEnds = performance.now() + BATCH_BUDGET_MS
    let next = 0
    const sender = async (holdsSlot: boolean) => {
      let holds = holdsSlot
      try {
        while (next < rows.length && (next === 0 || performance.now() < budgetEnds)) {
          if (!holds && !ordered) {
            holds = await limiter.acquire(subscriptionId, WAIT_FOR_SLOT_MS)
            if (!holds || next >= rows.length) break
          }
          const row = rows[next++]
          try {
            sent.push(await this.#send(workspaceId, subscriptionId, row, secrets))
          } finally {
            if (holds) limiter.release(subscriptionId)
            holds = false
          }
        }
      } finally {
        if (holds) limiter.release(subscriptionId)
      }
    }
    const senders = [sender(options.holdsSlot)]
    const wanted = ordered ? 1 : Math.min(limiter.limit, rows.length)
    while (senders.length < wanted && next < rows.length && limiter.tryAcquire(subscriptionId)) senders.push(sender(true))
    const outcomes = await Promise.allSettled(senders)

    if (sent.length > 0) {
      await helpers.query(
        'select crm.record_webhook_attempts($1, $2, $3::uuid[], $4::int[], $5::timestamptz[], $6::int[], $7::int[], $8::text[], $9::text[], $10::int[])',
        [
          workspaceId,
          subscriptionId,
          sent.map((s) => s.row.delivery_id),
          sent.map((s) => s.row.generation),
          sent.map((s) => s.startedAt),
          sent.map((s) => s.result.durationMs),
          sent.map((s) => s.result.status),
          sent.map((s) => s.result.error),
          sent.map((s) => s.result.bodyExcerpt),
          this.#config.webhook.retryScheduleMs,
        ],
      )
    }
    const failed = outcomes.find((outcome) => outcome.status === 'rejected')
    // What a sender took and then threw on was neither sent nor recorded: the job fails and runs
    // again, sending whatever is still due.
    if (failed) throw failed.reason
    return rows.slice(next)
  }

  #signingKey(sealed: Buffer, workspaceId: string): KeyObject {
    const cacheKey = sealed.toString('base64')
    let key = this.#signingKeys.get(cacheKey)
    if (key === undefined) {
      key = webhookSigningKey(openWebhookSecret(this.#secretKey, sealed, workspaceId))
      if (this.#signingKeys.size >= 1000) this.#signingKeys.delete(this.#signingKeys.keys().next().value as string)
      this.#signingKeys.set(cacheKey, key)
    }
    return key
  }

  async #send(workspaceId: string, subscriptionId: string, row: DeliveryToSend, secrets: KeyObject[]): Promise<Sent> {
    const startedAt = new Date()
    const body = deliveryBody(
      {
        deliveryId: row.delivery_id,
        eventId: row.event_id,
        event: row.event,
        occurredAt: row.occurred_at,
        workspace: { id: workspaceId, slug: row.workspace_slug },
        data: row.data,
        actor: row.actor,
      },
      startedAt,
    )
    const result = await sendSignedWebhook({
      url: row.url,
      policy: this.#policy,
      secrets,
      body,
      timeoutMs: this.#config.webhook.timeoutMs,
      headers: {
        'user-agent': USER_AGENT,
        'x-service-event': row.event,
        'x-service-delivery-id': row.delivery_id,
        'x-service-webhook-id': subscriptionId,
      },
    })
    return { row, startedAt, result }
  }
}

