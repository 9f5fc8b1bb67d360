// Periodic clean-up, each step one set-wise statement: idempotent, so a crash mid-way is harmless.
import type { Task } from 'graphile-worker'
import type { Config } from '../src/config.ts'

export function housekeeping(config: Config): Task {
  return async (_payload, helpers) => {
    const { rows } = await helpers.query<{ step: string; removed: number }>('select step, removed from crm.housekeeping($1)', [
      config.webhook.logRetentionDays,
    ])
    for (const row of rows) if (row.removed > 0) helpers.logger.info(`housekeeping: ${row.step} removed ${row.removed}`)
    // The audit log keeps its own retention, and only this function may remove its entries.
    const audit = await helpers.query<{ removed: string }>('select crm.retire_audit_log($1) as removed', [config.auditRetentionDays])
    const removed = Number(audit.rows[0].removed)
    if (removed > 0) helpers.logger.info(`housekeeping: crm.retire_audit_log removed ${removed}`)
  }
}
