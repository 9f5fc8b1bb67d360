// fan_out_event: the outbox hand-off. One job per statement that wrote events: one delivery per
// matching subscription, its first attempt made right here, per subscription, through the batch
// sender deliver_webhook uses (same per-subscription cap), and the deliveries created as their
// attempts are recorded (crm.record_webhook_attempts), in one call per subscription. No
// pending row is written first and no deliver_webhook job added per first attempt. A paused
// subscription's deliveries are created held by the read (crm.webhook_first_attempts_to_send); none
// is created while the plan has lapsed. A batch the cap does not let through within a few
// milliseconds (a slow endpoint) is recorded pending and handed to a deliver_webhook job instead,
// so one slow endpoint never holds this job.
//
// Kill safety: until this job completes it owns the first attempts of its events. Run again (a
// killed worker's job is unlocked by the heartbeat), it sends again the ones not yet recorded,
// with the same delivery ids (derived from event and subscription), and creates nothing twice.
import type { JobHelpers, Task } from 'graphile-worker'
import Type from 'typebox'
import { Compile } from 'typebox/compile'
import { type DeliveryToSend, WAIT_FOR_SLOT_MS, type WebhookBatchSender } from '../src/webhooks/batch-sender.ts'

type Row = DeliveryToSend & { workspace_id: string; subscription_id: string }

/** The job crm.enqueue_event_fan_out adds: the events one statement wrote. */
const payloadValidator = Compile(Type.Object({ event_ids: Type.Array(Type.String(), { minItems: 1 }) }))

export function fanOutEvent(sender: WebhookBatchSender): Task {
  return async (payload, helpers) => {
    if (!payloadValidator.Check(payload)) return
    const eventIds = payload.event_ids
    // A second run of this job (after a kill or a failure) leaves out what the first recorded.
    const rerun = helpers.job.attempts > 1
    const { rows } = await sender.query<Row>(helpers, 'select * from crm.webhook_first_attempts_to_send($1::uuid[], $2)', [eventIds, rerun])
    // Rows come ordered by subscription.
    const batches: Row[][] = []
    for (const row of rows) {
      const batch = batches.at(-1)
      if (batch !== undefined && batch[0].subscription_id === row.subscription_id && batch[0].workspace_id === row.workspace_id)
        batch.push(row)
      else batches.push([row])
    }
    const outcomes = await Promise.allSettled(batches.map((batch) => firstAttempts(sender, helpers, batch)))
    const failed = outcomes.find((outcome) => outcome.status === 'rejected')
    if (failed) throw failed.reason
  }
}

async function firstAttempts(sender: WebhookBatchSender, helpers: JobHelpers, batch: Row[]): Promise<void> {
  const { workspace_id: workspaceId, subscription_id: subscriptionId } = batch[0]
  const holdsSlot = await sender.limiter.acquire(subscriptionId, WAIT_FOR_SLOT_MS)
  await sender.sendAndRecord(helpers, workspaceId, subscriptionId, batch, { holdsSlot, firstAttempts: true })
}
