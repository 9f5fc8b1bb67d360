// Periodic clean-up, each step one set-wise statement: idempotent, so a crash mid-way is harmless.
import type { Task } from 'graphile-worker'
import type { Config } from '../src/config.ts'

export function housekeeping(config: Config): Task {
  return async (_payload, helpers) => {
    const { rows } = await helpers.query<{ step: string; removed: number }>('select step, removed from crm.housekeeping($1, $2)', [
      config.webhook.logRetentionDays,
      config.eventsRetentionDays,
    ])
    for (const row of rows) if (row.removed > 0) helpers.logger.info(`housekeeping: ${row.step} removed ${row.removed}`)
  }
}
