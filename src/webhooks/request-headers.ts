// The headers of a delivery's request (docs/api.md section 8), in one place: the worker sends them and
// the delivery log shows them. The signature is per attempt (send.ts signs each one afresh), and
// the attempt logs the header it sent.
import { readFileSync } from 'node:fs'
import Type from 'typebox'
import { Compile } from 'typebox/compile'

const VERSION = Compile(Type.Object({ version: Type.String() })).Parse(
  JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')),
).version
export const USER_AGENT = `crm-webhooks/${VERSION}`

/** send.ts sets it on every request. */
export const CONTENT_TYPE = 'application/json'

export type DeliveryRequest = { event: string; deliveryId: string; subscriptionId: string }

/**
 * What the worker passes to sendSignedWebhook; send.ts adds Content-Type, X-Service-Signature and
 * the Standard Webhooks headers (webhook-id, webhook-timestamp, webhook-signature), all per attempt.
 */
export function deliveryHeaders(delivery: DeliveryRequest): Record<string, string> {
  return {
    'user-agent': USER_AGENT,
    'x-service-event': delivery.event,
    'x-service-delivery-id': delivery.deliveryId,
    'x-service-webhook-id': delivery.subscriptionId,
  }
}

/**
 * The headers of an attempt's request, as the delivery log shows them (signature last); the
 * Standard Webhooks timestamp is X-Service-Signature's t, and its signature is not kept.
 */
export function requestHeaders(delivery: DeliveryRequest, signature: string | null): Record<string, string> {
  return {
    'content-type': CONTENT_TYPE,
    ...deliveryHeaders(delivery),
    'webhook-id': delivery.deliveryId,
    ...(signature === null ? {} : { 'x-service-signature': signature }),
  }
}
