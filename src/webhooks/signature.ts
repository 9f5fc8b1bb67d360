// Signing follows the public API contract (docs/api.md sections 7 and 8), two schemes keyed by one secret:
// - X-Service-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>], each v1 HMAC-SHA256 over
//   "<t>.<raw body bytes>" keyed by the whole secret string (what Stripe's verifier does);
// - webhook-signature: v1,<base64>[ v1,<base64>], HMAC-SHA256 over "<id>.<t>.<raw body bytes>"
//   keyed by the bytes the part after `whsec_` decodes to (Standard Webhooks).
import { createHmac, createSecretKey, type KeyObject, randomBytes, timingSafeEqual } from 'node:crypto'

export const SIGNATURE_HEADER = 'X-Service-Signature'
export const DEFAULT_TOLERANCE_SECONDS = 300
const SECRET_PREFIX = 'whsec_'

/** Standard base64, which the Standard Webhooks libraries decode (secrets issued before were base64url). */
export function newWebhookSecret(): string {
  return `${SECRET_PREFIX}${randomBytes(32).toString('base64')}`
}

/** HMAC with a KeyObject is several times faster than with a raw key, so callers should keep these. */
export function webhookSigningKey(secret: string): KeyObject {
  return createSecretKey(Buffer.from(secret, 'utf8'))
}

/**
 * The Standard Webhooks key: the bytes after `whsec_`. Node's base64 decoder reads both alphabets,
 * so a secret issued in base64url before the rule signs with the same 32 bytes it always stood for.
 */
export function standardWebhooksKey(secret: string): KeyObject {
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret
  const bytes = Buffer.from(encoded, 'base64')
  if (bytes.length === 0) throw new Error('a webhook secret must carry base64 key bytes after whsec_')
  return createSecretKey(bytes)
}

/** Both keys of one secret, built once per secret (the worker keeps them). */
export type SigningSecret = { service: KeyObject; standard: KeyObject }

export function signingSecret(secret: string): SigningSecret {
  return { service: webhookSigningKey(secret), standard: standardWebhooksKey(secret) }
}

/**
 * The Standard Webhooks header: one `v1,<base64>` per secret, space-separated, the new secret first
 * during a rotation. `id` is the delivery id and `timestampSeconds` the same t as X-Service-Signature.
 */
export function standardSignatureHeader(
  secrets: readonly (string | KeyObject)[],
  id: string,
  timestampSeconds: number,
  body: Buffer | string,
): string {
  if (secrets.length === 0) throw new Error('standardSignatureHeader needs at least one secret')
  return secrets
    .map((secret) => {
      const key = typeof secret === 'string' ? standardWebhooksKey(secret) : secret
      return `v1,${createHmac('sha256', key).update(`${id}.${timestampSeconds}.`).update(body).digest('base64')}`
    })
    .join(' ')
}

export function computeSignature(secret: string | KeyObject, timestampSeconds: number, body: Buffer | string): string {
  const key = typeof secret === 'string' ? webhookSigningKey(secret) : secret
  return createHmac('sha256', key).update(`${timestampSeconds}.`).update(body).digest('hex')
}

/** During a rotation the new secret comes first and the old one second. */
export function signatureHeader(secrets: readonly (string | KeyObject)[], timestampSeconds: number, body: Buffer | string): string {
  if (secrets.length === 0) throw new Error('signatureHeader needs at least one secret')
  if (!Number.isSafeInteger(timestampSeconds) || timestampSeconds < 0) {
    throw new Error(`signatureHeader needs whole unix seconds, got ${timestampSeconds}`)
  }
  const signatures = secrets.map((secret) => `v1=${computeSignature(secret, timestampSeconds, body)}`)
  return [`t=${timestampSeconds}`, ...signatures].join(',')
}

export type VerifyOptions = {
  toleranceSeconds?: number
  nowSeconds?: number
}

/**
 * What a receiver does: accept when the timestamp is within the tolerance and any v1 matches any
 * of the given secrets. Comparison is constant-time so the signature cannot be probed byte by byte.
 */
export function verifySignature(
  header: string,
  body: Buffer | string,
  secrets: string | KeyObject | readonly (string | KeyObject)[],
  options: VerifyOptions = {},
): boolean {
  let timestamp: number | null = null
  const candidates: Buffer[] = []
  for (const part of header.split(',')) {
    const [name, value] = part.trim().split('=', 2)
    if (name === 't' && /^\d{1,15}$/.test(value ?? '')) timestamp = Number(value)
    else if (name === 'v1' && /^[0-9a-f]{64}$/i.test(value ?? '')) candidates.push(Buffer.from(value, 'hex'))
  }
  if (timestamp === null || candidates.length === 0) return false

  const tolerance = options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS
  const now = options.nowSeconds ?? Math.floor(Date.now() / 1000)
  if (Math.abs(now - timestamp) > tolerance) return false

  const secretList = Array.isArray(secrets) ? secrets : [secrets as string | KeyObject]
  let matched = false
  for (const secret of secretList) {
    const expected = Buffer.from(computeSignature(secret, timestamp, body), 'hex')
    // No early exit, so timing does not reveal which secret or signature matched.
    for (const candidate of candidates) matched = timingSafeEqual(expected, candidate) || matched
  }
  return matched
}
