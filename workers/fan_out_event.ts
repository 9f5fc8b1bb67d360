// fan_out_event: the outbox hand-off. One job per statement that wrote events; one delivery per
// matching subscription (held when paused, none while the plan has lapsed) and each new pending
// delivery's first deliver_webhook job, all in one transaction (crm.fan_out_events). Re-running
// it creates nothing twice: deliveries are unique per (subscription, event).
import type { Task } from 'graphile-worker'

export function fanOutEvent(): Task {
  return async (payload, helpers) => {
    const eventIds = (payload as { event_ids?: unknown }).event_ids
    if (!Array.isArray(eventIds) || eventIds.length === 0) return
    await helpers.query('select crm.fan_out_events($1::uuid[])', [eventIds])
  }
}
