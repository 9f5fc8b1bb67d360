// The JSON body of one attempt (docs/api.md section 8). PostgreSQL writes it around its delivered_at
// (crm.webhook_body_head and crm.webhook_body_tail: the event as the outbox recorded it, the
// delivery id and the workspace), so the worker neither parses nor re-serialises the event; it
// adds the moment of the attempt and makes the whole body pure ASCII (see ascii-json.ts).
import { escapeNonAscii } from './ascii-json.ts'

export type DeliveryBodyParts = {
  /** Up to and including the opening quote of delivered_at's value. */
  body_head: string
  /** From the closing quote of delivered_at's value to the end. */
  body_tail: string
}

/** The bytes to sign and send. */
export function deliveryBody(parts: DeliveryBodyParts, deliveredAt: Date): Buffer {
  const text = parts.body_head + deliveredAt.toISOString() + parts.body_tail
  const bytes = Buffer.from(text, 'utf8')
  // One UTF-8 byte per character: the text is ASCII already (the usual case), and these are the bytes.
  return bytes.length === text.length ? bytes : Buffer.from(escapeNonAscii(text), 'latin1')
}
