// Verifiers that share no code with the service, for checking what receivers get:
// - the README's own snippet (section "Receiving webhooks"), taken from README.md as it stands, so
//   the documented code is run, not a copy of it;
// - Stripe's own verifier from the `stripe` package (header `t=<unix>,v1=<hex>[,v1=...]`, the
//   HMAC-SHA256 hex of "<t>.<payload>" keyed with the secret string, any v1 may match, a timestamp
//   older than the tolerance is refused), so receivers using Stripe's library accept our deliveries;
// - the Standard Webhooks libraries `standardwebhooks` and `svix` (headers webhook-id,
//   webhook-timestamp, webhook-signature; the key is the base64 after `whsec_`), each its own verify.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { Webhook as StandardWebhook, WebhookVerificationError } from 'standardwebhooks'
import Stripe from 'stripe'
import { WebhookVerificationError as SvixVerificationError, Webhook as SvixWebhook } from 'svix'
import { readmeBlocks } from '../helpers/readme.ts'

type ReadmeVerifier = (rawBody: Buffer, header: string, secret: string, toleranceSeconds?: number) => boolean

/** The README's verifyWebhook, loaded from the README's code block. */
export async function readmeVerifier(): Promise<ReadmeVerifier> {
  const block = readmeBlocks('ts', 'Receiving webhooks').find((code) => code.includes('export function verifyWebhook'))
  if (block === undefined) throw new Error('README.md has no ts block with verifyWebhook')
  const directory = mkdtempSync(join(tmpdir(), 'crm-readme-verifier-'))
  try {
    const file = join(directory, 'verify-webhook.ts')
    writeFileSync(file, block)
    const module = (await import(pathToFileURL(file).href)) as { verifyWebhook: ReadmeVerifier }
    return module.verifyWebhook
  } finally {
    rmSync(directory, { recursive: true, force: true })
  }
}

/**
 * Stripe's own library (the `stripe` package's webhooks.constructEvent, which Stripe's receivers
 * call): true when the header's timestamp is fresh and one of its v1 signatures matches the body.
 */
export function stripeVerifyHeader(payload: Buffer | string, header: string, secret: string, toleranceSeconds = 300): boolean {
  try {
    Stripe.webhooks.constructEvent(payload, header, secret, toleranceSeconds)
    return true
  } catch (error) {
    if (error instanceof Stripe.errors.StripeSignatureVerificationError) return false
    throw error
  }
}

type Headers = Record<string, string | string[] | undefined>

/** The request's three Standard Webhooks headers, as a receiver hands them to either library. */
function standardHeaders(headers: Headers): Record<string, string> {
  return {
    'webhook-id': String(headers['webhook-id'] ?? ''),
    'webhook-timestamp': String(headers['webhook-timestamp'] ?? ''),
    'webhook-signature': String(headers['webhook-signature'] ?? ''),
  }
}

// Both libraries refuse, in their constructor, a secret that is not standard base64 (a secret issued
// in base64url before the rule): a receiver holding one verifies nothing with them.
const readable = (secret: string) => /^whsec_[A-Za-z0-9+/]+={0,2}$/.test(secret)

/** The `standardwebhooks` package's Webhook.verify: true when it accepts the request. */
export function standardWebhooksVerify(payload: Buffer, headers: Headers, secret: string): boolean {
  if (!readable(secret)) return false
  try {
    new StandardWebhook(secret).verify(payload, standardHeaders(headers))
    return true
  } catch (error) {
    if (error instanceof WebhookVerificationError) return false
    throw error
  }
}

/** The `svix` package's Webhook.verify, as a receiver of Svix-sent webhooks calls it. */
export function svixVerify(payload: Buffer, headers: Headers, secret: string): boolean {
  if (!readable(secret)) return false
  try {
    new SvixWebhook(secret).verify(payload, standardHeaders(headers))
    return true
  } catch (error) {
    if (error instanceof SvixVerificationError) return false
    throw error
  }
}

/** Every verifier a receiver might use, on one request: each must accept it with this secret. */
export function everyVerifierAccepts(request: { raw: Buffer; headers: Headers }, secret: string): Record<string, boolean> {
  return {
    stripe: stripeVerifyHeader(request.raw, String(request.headers['x-service-signature']), secret),
    standardwebhooks: standardWebhooksVerify(request.raw, request.headers, secret),
    svix: svixVerify(request.raw, request.headers, secret),
  }
}
