// Sends a batch of deliveries of one subscription and records every attempt in one call. Shared by
// the two tasks that make attempts: fan_out_event (first attempts, before their delivery rows
// exist) and deliver_webhook (retries, releases, redeliveries, deferred first attempts).
//
// All HTTP happens outside any transaction: the caller's read committed first, and the attempts
// are recorded afterwards in one call of crm.record_webhook_attempts, the delivery state machine:
// it creates the deliveries of first attempts, moves the others on, adds the retry jobs (run_at per
// the database's schedule, or WEBHOOK_RETRY_SCHEDULE in tests) and applies the dead/auto-pause
// rule. A worker killed mid-batch leaves its job locked;
// the heartbeat unlocks it and the job runs again, sending what was not recorded (at least once;
// receivers deduplicate on X-Service-Delivery-Id, which a re-sent first attempt keeps).

import type { JobHelpers } from 'graphile-worker'
import type { QueryResult, QueryResultRow } from 'pg'
import { parseCidrList } from '../cidr.ts'
import type { Config } from '../config.ts'
import type { AddressPolicy } from './address-guard.ts'
import { deliveryBody } from './delivery-body.ts'
import { HostRateLimiter, webhookHost } from './host-rate-limiter.ts'
import { deliveryHeaders } from './request-headers.ts'
import { openWebhookSecret, webhookSecretKey } from './secret-store.ts'
import { sendSignedWebhook, type WebhookAttempt } from './send.ts'
import { type SigningSecret, signingSecret } from './signature.ts'
import { SubscriptionLimiter } from './subscription-limiter.ts'

export { USER_AGENT } from './request-headers.ts'

/** How long a batch waits for a slot of its subscription before it gives its worker slot back. */
export const WAIT_FOR_SLOT_MS = 50
/**
 * How long an attempt waits for its host's next token (WEBHOOK_HOST_RATE_PER_SECOND); past it, the
 * batch stops and the rest goes back to the queue, so a capped host does not hold worker slots.
 */
export const WAIT_FOR_HOST_MS = 250
/** No attempt of a batch starts later than this after its first. */
const BATCH_BUDGET_MS = 2_000
/**
 * Webhook statements (reads and records) running at once in this process. Every job slot may hold
 * a batch, but the database does the batches' work no faster with 20 of them at once than with a
 * few: more only contend for the same index pages and the same subscription row. In the benchmark
 * (bench/webhooks.ts, two cores) PostgreSQL spent about a tenth less CPU per delivery with 4 than
 * with 20, at the same throughput. The others wait their turn while their HTTP goes on.
 */
export const DATABASE_CONCURRENCY = 4

/**
 * One delivery to attempt, as crm.webhook_first_attempts_to_send and crm.webhook_deliveries_to_send
 * return it: the body around its delivered_at, the endpoint and its secrets (the same on every row
 * of a subscription).
 */
export type DeliveryToSend = {
  delivery_id: string
  event_id: string
  event: string
  body_head: string
  body_tail: string
  url: string
  secret_encrypted: Buffer
  previous_secret_encrypted: Buffer | null
  /** The generation its deliver_webhook job carries; absent for a first attempt (no row yet). */
  generation?: number
}

type Sent = { row: DeliveryToSend; startedAt: Date; result: WebhookAttempt }

/**
 * One entry of crm.record_webhook_attempts' batch, a crm.webhook_attempt_result. A first attempt has
 * no generation (its delivery is created from event_id); a first attempt not made has no started_at.
 */
export type AttemptResult = {
  delivery_id: string
  event_id: string
  generation: number | null
  started_at: string | null
  duration_ms: number | null
  response_status: number | null
  error: string | null
  response_body_excerpt: string | null
  /** The X-Service-Signature header the attempt sent (absent or null: none). */
  signature?: string | null
  /** The headers the attempt sent, secrets left out, as JSON text (absent or null: none). */
  request_headers?: string | null
}

/** The fields of crm.webhook_attempt_result, in the type's order. */
const ATTEMPT_RESULT_FIELDS = [
  'delivery_id',
  'event_id',
  'generation',
  'started_at',
  'duration_ms',
  'response_status',
  'error',
  'response_body_excerpt',
  'signature',
  'request_headers',
] as const satisfies readonly (keyof AttemptResult)[]

/**
 * One crm.webhook_attempt_result in PostgreSQL's record syntax (pg quotes it once more as an array
 * element): every value quoted with `"` and `\` escaped, an empty field for null. PostgreSQL reads
 * a batch in this form for about 1 µs more per attempt than as parallel arrays; from jsonb
 * (jsonb_populate_recordset) it took 7 µs more.
 */
export function attemptResultRecord(result: AttemptResult): string {
  const fields = ATTEMPT_RESULT_FIELDS.map((name) => {
    const value = result[name]
    return value === null || value === undefined ? '' : `"${String(value).replace(/["\\]/g, '\\$&')}"`
  })
  return `(${fields.join(',')})`
}

/**
 * A value as it stands inside a quoted record field inside a quoted array element: its `\` and `"`
 * escaped once for the record and once more for the array.
 */
const escapedTwice = (value: string) => (/["\\]/.test(value) ? value.replace(/\\/g, '\\\\\\\\').replace(/"/g, '\\\\\\"') : value)

/**
 * The batch as crm.record_webhook_attempts' parameter: the array literal of attemptResultRecord's
 * records, exactly as pg would quote their array (a test holds the two equal), built in one pass
 * over each value instead of one for the record and two more over the record for the array.
 */
export function attemptResultsParameter(results: readonly AttemptResult[]): string {
  const elements = results.map((result) => {
    const fields = ATTEMPT_RESULT_FIELDS.map((name) => {
      const value = result[name]
      return value === null || value === undefined ? '' : `\\"${escapedTwice(String(value))}\\"`
    })
    return `"(${fields.join(',')})"`
  })
  return `{${elements.join(',')}}`
}

const attemptResult = ({ row, startedAt, result }: Sent): AttemptResult => ({
  delivery_id: row.delivery_id,
  event_id: row.event_id,
  generation: row.generation ?? null,
  started_at: startedAt.toISOString(),
  duration_ms: result.durationMs,
  response_status: result.status,
  error: result.error,
  response_body_excerpt: result.bodyExcerpt,
  signature: result.signature,
  request_headers: result.requestHeaders === null ? null : JSON.stringify(result.requestHeaders),
})

const notAttempted = (row: DeliveryToSend): AttemptResult => ({
  delivery_id: row.delivery_id,
  event_id: row.event_id,
  generation: null,
  started_at: null,
  duration_ms: null,
  response_status: null,
  error: null,
  response_body_excerpt: null,
  signature: null,
})

export type SendOptions = {
  /** The caller already took one slot of the subscription, which this gives back. */
  holdsSlot: boolean
  /** A resume's release: one delivery, sent even at the cap. */
  ordered?: boolean
  /**
   * fan_out_event's first attempts: the deliveries are created as they are recorded, those not
   * attempted included (pending, handed to a deliver_webhook job), so nothing comes back.
   */
  firstAttempts?: boolean
}

export class WebhookBatchSender {
  readonly limiter: SubscriptionLimiter
  readonly hostRate: HostRateLimiter
  readonly #config: Config
  readonly #policy: AddressPolicy
  readonly #secretKey: Buffer
  /** WEBHOOK_RETRY_SCHEDULE as PostgreSQL intervals, or null for the database's own schedule. */
  readonly #retryDelays: string[] | null
  readonly #database = new Slots(DATABASE_CONCURRENCY)
  // Opening a secret and building its HMAC key costs more than the HMAC itself; sealed bytes are
  // immutable (rotation writes new ones), so they are a safe cache key.
  readonly #signingKeys = new Map<string, SigningSecret>()

  constructor(config: Config) {
    this.#config = config
    this.#policy = { allowHttp: config.webhook.allowHttp, allowedCidrs: parseCidrList(config.webhook.allowedCidrs) }
    this.#secretKey = webhookSecretKey(config.appSecret)
    this.#retryDelays = config.webhook.retryScheduleMs?.map((ms) => `${ms} milliseconds`) ?? null
    this.limiter = new SubscriptionLimiter(config.webhook.concurrencyPerSubscription)
    this.hostRate = new HostRateLimiter(config.webhook.hostRatePerSecond)
  }

  /** A webhook statement, run when one of the process's DATABASE_CONCURRENCY slots is free. */
  query<R extends QueryResultRow>(helpers: JobHelpers, text: string, values: unknown[]): Promise<QueryResult<R>> {
    return this.#database.run(() => helpers.query<R>(text, values))
  }

  /**
   * Sends the rows (all of one subscription) and records the attempts made. Returns the rows not
   * attempted (a slow endpoint or the batch budget), which the caller hands to a later job; with
   * `firstAttempts` those are recorded too, and nothing comes back.
   */
  async sendAndRecord(
    helpers: JobHelpers,
    workspaceId: string,
    subscriptionId: string,
    rows: DeliveryToSend[],
    options: SendOptions,
  ): Promise<DeliveryToSend[]> {
    const { limiter } = this
    const ordered = options.ordered ?? false
    const firstAttempts = options.firstAttempts ?? false
    if (rows.length === 0 || (!options.holdsSlot && !ordered)) {
      if (options.holdsSlot) limiter.release(subscriptionId)
      if (firstAttempts) await this.#record(helpers, workspaceId, subscriptionId, rows.map(notAttempted))
      return firstAttempts ? [] : rows
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
    // Each attempt also takes a token of its destination host (shared by every subscription of
    // every workspace in this process); when none comes within WAIT_FOR_HOST_MS the sender stops
    // likewise. A resume's release keeps its order, so it waits for its token however long.
    const sent: Sent[] = []
    const budgetEnds = performance.now() + BATCH_BUDGET_MS
    const host = webhookHost(rows[0].url)
    let next = 0
    const sender = async (holdsSlot: boolean) => {
      let holds = holdsSlot
      try {
        while (next < rows.length && (next === 0 || performance.now() < budgetEnds)) {
          if (!holds && !ordered) {
            holds = await limiter.acquire(subscriptionId, WAIT_FOR_SLOT_MS)
            if (!holds || next >= rows.length) break
          }
          if (!(await this.hostRate.take(host, ordered ? Number.POSITIVE_INFINITY : WAIT_FOR_HOST_MS))) break
          if (next >= rows.length) break
          const row = rows[next++]
          try {
            sent.push(await this.#send(subscriptionId, row, secrets))
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
    const failed = outcomes.find((outcome) => outcome.status === 'rejected')
    const rest = rows.slice(next)

    if (firstAttempts) {
      // After a failure only what was sent is recorded: the job runs again and sends the rest.
      await this.#record(helpers, workspaceId, subscriptionId, [...sent.map(attemptResult), ...(failed ? [] : rest).map(notAttempted)])
    } else if (sent.length > 0) {
      await this.#record(helpers, workspaceId, subscriptionId, sent.map(attemptResult))
    }
    // What a sender took and then threw on was neither sent nor recorded: the job fails and runs
    // again, sending whatever is still due.
    if (failed) throw failed.reason
    return firstAttempts ? [] : rest
  }

  /** Records a batch of attempts (crm.record_webhook_attempts), in one statement. */
  async #record(helpers: JobHelpers, workspaceId: string, subscriptionId: string, results: AttemptResult[]): Promise<void> {
    if (results.length === 0) return
    await this.query(helpers, 'select crm.record_webhook_attempts($1, $2, $3::crm.webhook_attempt_result[], $4::interval[])', [
      workspaceId,
      subscriptionId,
      attemptResultsParameter(results),
      this.#retryDelays,
    ])
  }

  #signingKey(sealed: Buffer, workspaceId: string): SigningSecret {
    const cacheKey = sealed.toString('base64')
    let key = this.#signingKeys.get(cacheKey)
    if (key === undefined) {
      key = signingSecret(openWebhookSecret(this.#secretKey, sealed, workspaceId))
      const oldest = this.#signingKeys.keys().next()
      if (this.#signingKeys.size >= 1000 && !oldest.done) this.#signingKeys.delete(oldest.value)
      this.#signingKeys.set(cacheKey, key)
    }
    return key
  }

  async #send(subscriptionId: string, row: DeliveryToSend, secrets: SigningSecret[]): Promise<Sent> {
    const startedAt = new Date()
    const result = await sendSignedWebhook({
      url: row.url,
      policy: this.#policy,
      id: row.delivery_id,
      secrets,
      body: deliveryBody(row, startedAt),
      timeoutMs: this.#config.webhook.timeoutMs,
      headers: deliveryHeaders({ event: row.event, deliveryId: row.delivery_id, subscriptionId }),
    })
    return { row, startedAt, result }
  }
}

/** At most `size` holders at once; the others wait their turn, first come first served. */
class Slots {
  #free: number
  readonly #waiting: (() => void)[] = []

  constructor(size: number) {
    this.#free = size
  }

  async run<T>(work: () => Promise<T>): Promise<T> {
    if (this.#free > 0) this.#free--
    else await new Promise<void>((resolve) => this.#waiting.push(resolve))
    try {
      return await work()
    } finally {
      // The slot passes straight to the next in line, or becomes free.
      const next = this.#waiting.shift()
      if (next === undefined) this.#free++
      else next()
    }
  }
}
