// The JSON body of one attempt (API.md section 8): the event as the outbox recorded it, plus
// delivery_id and delivered_at, written as pure ASCII (see ascii-json.ts).
import { asciiJson } from './ascii-json.ts'

export type EventToDeliver = {
  deliveryId: string
  eventId: string
  event: string
  occurredAt: Date
  workspace: { id: string; slug: string }
  /** {object, previous_attributes?, associations_changed?} as crm.events.data holds it */
  data: Record<string, unknown>
  actor: Record<string, unknown>
}

export function deliveryBody(event: EventToDeliver, deliveredAt: Date): string {
  return asciiJson({
    id: event.eventId,
    event: event.event,
    occurred_at: event.occurredAt.toISOString(),
    delivered_at: deliveredAt.toISOString(),
    delivery_id: event.deliveryId,
    workspace: event.workspace,
    data: event.data,
    actor: event.actor,
  })
}
