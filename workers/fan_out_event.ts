// fan_out_event: the outbox hand-off. One job per statement that wrote events: one delivery per
// matching subscription (held when paused, none while the plan has lapsed), created in one
// transaction, then the first attempts of the new pending deliveries made right here, per
// subscription, through the batch sender deliver_webhook uses (same per-subscription cap), and
// recorded in one call per subscription. No deliver_webhook job per first attempt: a batch the cap
// does not let through within a few milliseconds (a slow endpoint) is handed to a deliver_webhook
// job instead, so one slow endpoint never holds this job.
//
// Kill safety: until this job completes it is the only owner of its deliveries' first attempts. Run
// again (a killed worker's job is unlocked by the heartbeat), it creates nothing twice and sends
// again the deliveries that are still unattempted (crm.fan_out_webhook_events); one handed to a job
// has a new generation and is left to that job.
import type { JobHelpers, Task } from 'graphile-worker'
import { WAIT_FOR_SLOT_MS, type DeliveryToSend, type WebhookBatchSender } from '../src/webhooks/batch-sender.ts'

type Row = DeliveryToSend & { workspace_id: string; subscription_id: string }

/** Without a sender (tests of the SQL alone), every first attempt goes through a deliver_webhook job. */
export function fanOutEvent(sender: WebhookBatchSender | null): Task {
  return async (payload, helpers) => {
    const eventIds = (payload as { event_ids?: unknown }).event_ids
    if (!Array.isArray(eventIds) || eventIds.length === 0) return
    if (sender === null) {
      // No sender in this task list: every first attempt goes through its own deliver_webhook job.
      await helpers.query('select crm.fan_out_events($1::uuid[])', [eventIds])
      return
    }
    // A second run of this job (after a kill or a failure) also picks up what the first left unattempted.
    const rerun = helpers.job.attempts > 1
    const { rows } = await helpers.query<Row>('select * from crm.fan_out_webhook_events($1::uuid[], $2)', [eventIds, rerun])
    const batches = new Map<string, Row[]>()
    for (const row of rows) {
      const key = `${row.workspace_id} ${row.subscription_id}`
      const batch = batches.get(key)
      if (batch === undefined) batches.set(key, [row])
      else batch.push(row)
    }
    const outcomes = await Promise.allSettled([...batches.values()].map((batch) => firstAttempts(sender, helpers, batch)))
    const failed = outcomes.find((outcome) => outcome.status === 'rejected')
    if (failed) throw failed.reason
  }
}

async function firstAttempts(sender: WebhookBatchSender, helpers: JobHelpers, batch: Row[]): Promise<void> {
  const { workspace_id: workspaceId, subscription_id: subscriptionId } = batch[0]
  const holdsSlot = await sender.limiter.acquire(subscriptionId, WAIT_FOR_SLOT_MS)
  const rest = holdsSlot ? await sender.sendAndRecord(helpers, workspaceId, subscriptionId, batch, { holdsSlot }) : batch
  if (rest.length > 0) {
    await helpers.query('select crm.defer_webhook_deliveries($1, $2, $3::uuid[], $4::int[])', [
      workspaceId,
      subscriptionId,
      rest.map((row) => row.delivery_id),
      rest.map((row) => row.generation),
    ])
  }
}
