// Two verifiers that share no code with the service, for checking what receivers get:
// - the README's own snippet (section "Receiving webhooks"), taken from README.md as it stands, so
//   the documented code is run, not a copy of it;
// - Stripe's scheme as Stripe's libraries implement it (header `t=<unix>,v1=<hex>[,v1=...]`, the
//   HMAC-SHA256 hex of "<t>.<payload as UTF-8 text>" keyed with the secret string, any v1 may
//   match, a timestamp older than the tolerance is refused), so Stripe-style verifiers accept our
//   deliveries.
import { createHmac, timingSafeEqual } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

type ReadmeVerifier = (rawBody: Buffer, header: string, secret: string, toleranceSeconds?: number) => boolean

/** The README's verifyWebhook, loaded from the README's code block. */
export async function readmeVerifier(): Promise<ReadmeVerifier> {
  const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8')
  const block = readme
    .split('```ts\n')
    .slice(1)
    .map((part) => part.slice(0, part.indexOf('\n```')))
    .find((code) => code.includes('export function verifyWebhook'))
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

/** Stripe's verifyHeader: true when the header's timestamp is fresh and one of its v1 signatures matches. */
export function stripeVerifyHeader(payload: Buffer | string, header: string, secret: string, toleranceSeconds = 300): boolean {
  const text = typeof payload === 'string' ? payload : new TextDecoder('utf-8').decode(payload)
  let timestamp = -1
  const signatures: string[] = []
  for (const item of header.split(',')) {
    const [key, value] = item.split('=')
    if (key === 't') timestamp = Number.parseInt(value, 10)
    if (key === 'v1') signatures.push(value)
  }
  if (timestamp === -1 || Number.isNaN(timestamp) || signatures.length === 0) return false
  const expected = createHmac('sha256', secret).update(`${timestamp}.${text}`, 'utf8').digest('hex')
  const matches = signatures.some(
    (signature) => signature.length === expected.length && timingSafeEqual(Buffer.from(signature), Buffer.from(expected)),
  )
  if (!matches) return false
  return !(toleranceSeconds > 0 && Math.floor(Date.now() / 1000) - timestamp > toleranceSeconds)
}
