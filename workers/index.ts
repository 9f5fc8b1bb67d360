// The task list: every background task, named after what it does.
import type { TaskList } from 'graphile-worker'
import type { Config } from '../src/config.ts'
import { WebhookBatchSender } from '../src/webhooks/batch-sender.ts'
import { deliverWebhook } from './deliver_webhook.ts'
import { fanOutEvent } from './fan_out_event.ts'
import { housekeeping } from './housekeeping.ts'
import { processImportTask } from './process_import.ts'

export function taskList(config: Config): TaskList {
  const webhookSender = new WebhookBatchSender(config)
  return {
    housekeeping: housekeeping(config),
    process_import: processImportTask(config),
    fan_out_event: fanOutEvent(webhookSender),
    deliver_webhook: deliverWebhook(webhookSender),
  }
}

/** Housekeeping every 10 minutes; graphile-worker's cron survives restarts and never runs twice for one slot. */
export const crontab = '*/10 * * * * housekeeping ?max=1\n'
