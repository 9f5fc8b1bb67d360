// Signing follows the public API contract: X-Service-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>]
// where each v1 is HMAC-SHA256 over "<t>.<raw body bytes>" keyed by the whole secret string.
import { createHmac, createSecretKey, type KeyObject, randomBytes, timingSafeEqual } from 'node:crypto'

export const SIGNATURE_HEADER = 'X-Service-Signature'
export const DEFAULT_TOLERANCE_SECONDS = 300

export function newWebhookSecret(): string {
  return `whsec_${randomBytes(32).toString('base64url')}`
}

/** HMAC with a KeyObject is several times faster than with a raw key, so callers should keep these. */
export function webhookSigningKey(secret: string): KeyObject {
  return createSecretKey(Buffer.from(secret, 'utf8'))
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
