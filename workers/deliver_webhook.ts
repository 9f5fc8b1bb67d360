// deliver_webhook: one attempt of each delivery in a batch of one subscription (a retry, a resume's
// release, a redelivery, or first attempts fan_out_event could not make at once; see
// crm.add_webhook_delivery_jobs). Reads the batch in one call (stale or final deliveries are left
// out, a paused subscription holds them), then sends and records it with the shared batch sender
// (src/webhooks/batch-sender.ts): POSTs outside any transaction, at most
// WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION in flight per subscription in this process, every attempt
// and each next state recorded in one call (crm.record_webhook_attempts), which adds the retry jobs
// with run_at per the retry schedule (crm.webhook_retry_delays), or marks deliveries dead and
// applies auto-pause.
import type { Task } from 'graphile-worker'
import Type, { type Static } from 'typebox'
import { Compile } from 'typebox/compile'
import { type DeliveryToSend, WAIT_FOR_SLOT_MS, type WebhookBatchSender } from '../src/webhooks/batch-sender.ts'

export { USER_AGENT } from '../src/webhooks/batch-sender.ts'

/** When a subscription is at its in-flight cap, the batch comes back after this long (plus jitter). */
const DEFER_MS = 250

/**
 * w: workspace, s: subscription, d/g: the deliveries and the generation each was added with (a
 * single id and number in jobs added before batching), o: part of a resume's in-order release.
 */
const Payload = Type.Object({
  w: Type.String(),
  s: Type.String(),
  d: Type.Union([Type.String(), Type.Array(Type.String())]),
  g: Type.Union([Type.Integer(), Type.Array(Type.Integer())]),
  o: Type.Optional(Type.Boolean()),
})
type Payload = Static<typeof Payload>
const payloadValidator = Compile(Payload)

/** fan_out_event sends first attempts through the same sender, so both share one per-subscription cap. */
export function deliverWebhook(sender: WebhookBatchSender): Task {
  const { limiter } = sender

  return async (payload, helpers) => {
    // Jobs are added by crm.add_webhook_delivery_jobs and by this task; any other shape is no job of ours.
    if (!payloadValidator.Check(payload)) return
    const { ids, generations } = deliveriesOf(payload)
    if (ids.length === 0) return
    const subscriptionId = payload.s
    const later = (deliveryIds: string[], deliveryGenerations: number[], delayMs: number) =>
      helpers.addJob(
        'deliver_webhook',
        { w: payload.w, s: subscriptionId, d: deliveryIds, g: deliveryGenerations, o: false },
        { runAt: new Date(Date.now() + delayMs), maxAttempts: 25 },
      )

    // A release (resume) runs one job at a time per subscription and must keep its order, so it
    // never defers; every other batch at the cap gives its worker slot back and comes again later.
    const holdsSlot = payload.o ? limiter.tryAcquire(subscriptionId) : await limiter.acquire(subscriptionId, WAIT_FOR_SLOT_MS)
    if (!holdsSlot && !payload.o) {
      await later(ids, generations, DEFER_MS + Math.random() * DEFER_MS)
      return
    }

    let rows: DeliveryToSend[]
    try {
      rows = (
        await sender.query<DeliveryToSend>(helpers, 'select * from crm.webhook_deliveries_to_send($1, $2, $3::uuid[], $4::int[])', [
          payload.w,
          subscriptionId,
          ids,
          generations,
        ])
      ).rows
    } catch (error) {
      if (holdsSlot) limiter.release(subscriptionId)
      throw error
    }
    const rest = await sender.sendAndRecord(helpers, payload.w, subscriptionId, rows, { holdsSlot, ordered: payload.o })
    // Not attempted (a slow endpoint, or the batch's time budget): a job of its own.
    if (rest.length > 0)
      await later(
        rest.map((row) => row.delivery_id),
        rest.map((row) => row.generation!),
        DEFER_MS,
      )
    // Stale job, final delivery, or now held: a release goes on with its next delivery either way.
    if (payload.o) await sender.query(helpers, 'select crm.continue_webhook_release($1, $2)', [payload.w, subscriptionId])
  }
}

/** The batch's distinct deliveries with their generations, in the order the job lists them. */
function deliveriesOf(payload: Payload): { ids: string[]; generations: number[] } {
  const rawIds = Array.isArray(payload.d) ? payload.d : [payload.d]
  const rawGenerations = Array.isArray(payload.g) ? payload.g : [payload.g]
  const ids: string[] = []
  const generations: number[] = []
  const seen = new Set<string>()
  rawIds.forEach((id, i) => {
    const generation = rawGenerations[i]
    if (generation === undefined || seen.has(id)) return
    seen.add(id)
    ids.push(id)
    generations.push(generation)
  })
  return { ids, generations }
}
