// deliver_webhook: one attempt of one delivery. Re-reads the delivery by id and generation (a
// stale or final delivery ends quietly), signs and POSTs outside any transaction, then records the
// attempt and the next state in one call (crm.record_webhook_attempt), which also adds the retry
// job with run_at per WEBHOOK_RETRY_SCHEDULE, or marks the delivery dead and applies auto-pause.
import { readFileSync } from 'node:fs'
import type { KeyObject } from 'node:crypto'
import type { Task } from 'graphile-worker'
import type { Config } from '../src/config.ts'
import { parseCidrList, type AddressPolicy } from '../src/webhooks/address-guard.ts'
import { deliveryBody } from '../src/webhooks/delivery-body.ts'
import { openWebhookSecret, webhookSecretKey } from '../src/webhooks/secret-store.ts'
import { sendSignedWebhook } from '../src/webhooks/send.ts'
import { webhookSigningKey } from '../src/webhooks/signature.ts'
import { SubscriptionLimiter } from '../src/webhooks/subscription-limiter.ts'

const VERSION = (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }).version
export const USER_AGENT = `crm-webhooks/${VERSION}`

/** When a subscription is at its in-flight cap, the job comes back after this long (plus jitter). */
const DEFER_MS = 250
/** How long a job waits for a slot of its subscription before it gives its worker slot back. */
const WAIT_FOR_SLOT_MS = 50

/** workspace, subscription, delivery, generation; o: part of a resume's in-order release */
type Payload = { w: string; s: string; d: string; g: number; o?: boolean }

type ToSend = {
  delivery_id: string
  subscription_id: string
  event_id: string
  event: string
  occurred_at: Date
  data: Record<string, unknown>
  actor: Record<string, unknown>
  workspace_slug: string
  url: string
  secret_encrypted: Buffer
  previous_secret_encrypted: Buffer | null
  attempt: number
}

export function deliverWebhook(config: Config): Task {
  const policy: AddressPolicy = { allowHttp: config.webhook.allowHttp, allowedCidrs: parseCidrList(config.webhook.allowedCidrs) }
  const secretKey = webhookSecretKey(config.appSecret)
  const limiter = new SubscriptionLimiter(config.webhook.concurrencyPerSubscription)
  const retryDelays = config.webhook.retryScheduleMs
  // Opening a secret and building its HMAC key costs more than the HMAC itself; sealed bytes are
  // immutable (rotation writes new ones), so they are a safe cache key.
  const signingKeys = new Map<string, KeyObject>()
  const signingKey = (sealed: Buffer, workspaceId: string): KeyObject => {
    const cacheKey = sealed.toString('base64')
    let key = signingKeys.get(cacheKey)
    if (key === undefined) {
      key = webhookSigningKey(openWebhookSecret(secretKey, sealed, workspaceId))
      if (signingKeys.size >= 1000) signingKeys.delete(signingKeys.keys().next().value as string)
      signingKeys.set(cacheKey, key)
    }
    return key
  }

  return async (rawPayload, helpers) => {
    const payload = rawPayload as Payload
    // A release (resume) runs one job at a time per subscription and must keep its order, so it
    // never defers; every other job at the cap gives its worker slot back and comes again later.
    const acquired = payload.o ? limiter.tryAcquire(payload.s) : await limiter.acquire(payload.s, WAIT_FOR_SLOT_MS)
    if (!acquired && !payload.o) {
      await helpers.addJob('deliver_webhook', payload, { runAt: new Date(Date.now() + DEFER_MS + Math.random() * DEFER_MS), maxAttempts: 25 })
      return
    }
    let recorded: [Date, Awaited<ReturnType<typeof sendSignedWebhook>>]
    try {
      const { rows } = await helpers.query<ToSend>('select * from crm.webhook_delivery_to_send($1, $2, $3)', [payload.w, payload.d, payload.g])
      const row = rows[0]
      if (row === undefined) {
        // Stale job, final delivery, or now held. A release goes on with its next delivery.
        if (payload.o) await helpers.query('select crm.continue_webhook_release($1, $2)', [payload.w, payload.s])
        return
      }
      const secrets = [signingKey(row.secret_encrypted, payload.w)]
      if (row.previous_secret_encrypted !== null) secrets.push(signingKey(row.previous_secret_encrypted, payload.w))
      const startedAt = new Date()
      const body = deliveryBody(
        {
          deliveryId: row.delivery_id,
          eventId: row.event_id,
          event: row.event,
          occurredAt: row.occurred_at,
          workspace: { id: payload.w, slug: row.workspace_slug },
          data: row.data,
          actor: row.actor,
        },
        startedAt,
      )
      const result = await sendSignedWebhook({
        url: row.url,
        policy,
        secrets,
        body,
        timeoutMs: config.webhook.timeoutMs,
        headers: {
          'user-agent': USER_AGENT,
          'x-service-event': row.event,
          'x-service-delivery-id': row.delivery_id,
          'x-service-webhook-id': row.subscription_id,
        },
      })
      recorded = [startedAt, result]
    } finally {
      if (acquired) limiter.release(payload.s)
    }
    const [startedAt, result] = recorded
    await helpers.query('select crm.record_webhook_attempt($1, $2, $3, $4, $5, $6, $7, $8, $9)', [
      payload.w,
      payload.d,
      payload.g,
      startedAt,
      result.durationMs,
      result.status,
      result.error,
      result.bodyExcerpt,
      retryDelays,
    ])
    if (payload.o) await helpers.query('select crm.continue_webhook_release($1, $2)', [payload.w, payload.s])
  }
}
