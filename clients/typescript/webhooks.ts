// verifyWebhook: a delivery's body checked against either signature scheme of docs/api.md section 8,
// X-Service-Signature (HMAC keyed by the whole secret string) or Standard Webhooks' webhook-signature
// (HMAC keyed by the bytes after whsec_), with a timestamp no further than 5 minutes from now.
import { createHmac, timingSafeEqual } from 'node:crypto'
import type { WebhookEvent } from './crm-client.ts'

export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'WebhookVerificationError'
  }
}

type Headers = Record<string, string | string[] | undefined> | globalThis.Headers
const TOLERANCE_SECONDS = 300

function header(headers: Headers, name: string): string | undefined {
  if (typeof (headers as globalThis.Headers).get === 'function') return (headers as globalThis.Headers).get(name) ?? undefined
  const entry = Object.entries(headers).find(([key]) => key.toLowerCase() === name)?.[1]
  return Array.isArray(entry) ? entry[0] : entry
}

const same = (a: Buffer, b: Buffer) => a.length === b.length && timingSafeEqual(a, b)

function checkTime(seconds: string | undefined, now: number): void {
  const t = Number(seconds)
  if (!Number.isInteger(t) || Math.abs(now - t) > TOLERANCE_SECONDS)
    throw new WebhookVerificationError('timestamp missing or too far from now')
}

/**
 * The event, once the body (the raw bytes or their text, exactly as received) is proven signed with
 * `secret` (whsec_...); throws WebhookVerificationError otherwise.
 */
export function verifyWebhook(payload: string | Uint8Array, headers: Headers, secret: string, now = Date.now() / 1000): WebhookEvent {
  const body = typeof payload === 'string' ? Buffer.from(payload, 'utf8') : Buffer.from(payload)
  const standard = header(headers, 'webhook-signature')
  const service = header(headers, 'x-service-signature')
  if (standard !== undefined) {
    const id = header(headers, 'webhook-id') ?? ''
    const timestamp = header(headers, 'webhook-timestamp')
    checkTime(timestamp, now)
    const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64')
    const expected = createHmac('sha256', key).update(`${id}.${timestamp}.`).update(body).digest()
    const offered = standard.split(' ').flatMap((entry) => (entry.startsWith('v1,') ? [Buffer.from(entry.slice(3), 'base64')] : []))
    if (!offered.some((signature) => same(signature, expected))) throw new WebhookVerificationError('no webhook-signature matches')
  } else if (service !== undefined) {
    const parts = service.split(',').map((part) => part.split('='))
    const timestamp = parts.find(([name]) => name === 't')?.[1]
    checkTime(timestamp, now)
    const expected = createHmac('sha256', Buffer.from(secret, 'utf8')).update(`${timestamp}.`).update(body).digest()
    const offered = parts.flatMap(([name, value]) => (name === 'v1' && value ? [Buffer.from(value, 'hex')] : []))
    if (!offered.some((signature) => same(signature, expected))) throw new WebhookVerificationError('no X-Service-Signature matches')
  } else {
    throw new WebhookVerificationError('neither webhook-signature nor X-Service-Signature is present')
  }
  return JSON.parse(body.toString('utf8')) as WebhookEvent
}
