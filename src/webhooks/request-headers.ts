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
 * Headers that may carry a credential: never logged, whoever adds them. None is sent today; the
 * signatures are not among them (derived from the secret, they do not reveal it).
 */
const SECRET_HEADERS = new Set(['authorization', 'proxy-authorization', 'cookie', 'x-api-key'])

/**
 * What an attempt logs: every header of its request, with those the HTTP client adds for the
 * connection (Host, Connection, Content-Length; test/webhooks/logged-headers.test.ts holds this to
 * what a receiver gets), secrets left out.
 */
export function loggedHeaders(url: URL, sent: Record<string, string>, bodyBytes: number): Record<string, string> {
  const all: Record<string, string> = { host: url.host, connection: 'keep-alive', ...sent, 'content-length': String(bodyBytes) }
  return Object.fromEntries(Object.entries(all).filter(([name]) => !SECRET_HEADERS.has(name.toLowerCase())))
}

/**
 * The headers every attempt of a delivery sends, for one not attempted yet or attempted before its
 * attempts kept their headers (signature last); each attempt's own are in its request_headers.
 */
export function requestHeaders(delivery: DeliveryRequest, signature: string | null): Record<string, string> {
  return {
    'content-type': CONTENT_TYPE,
    ...deliveryHeaders(delivery),
    'webhook-id': delivery.deliveryId,
    ...(signature === null ? {} : { 'x-service-signature': signature }),
  }
}
