// One delivery attempt. The address guard runs again here (a host name is resolved and checked at
// every attempt), and the connection goes to exactly the address it approved: re-resolving at
// connect time would let a DNS answer that changed between check and connect (DNS rebinding) reach
// a private address.
import { isAscii } from 'node:buffer'
import { isIP, type LookupFunction } from 'node:net'
import type { Readable } from 'node:stream'
import { Pool } from 'undici'
import { type AddressPolicy, checkWebhookUrl, type ResolvedAddress, type WebhookUrlCheck } from './address-guard.ts'
import { CONTENT_TYPE, loggedHeaders } from './request-headers.ts'
import { type SigningSecret, signatureHeader, signingSecret, standardSignatureHeader } from './signature.ts'

export type WebhookAttemptError =
  | 'timeout'
  | 'connection_refused'
  | 'dns_failed'
  | 'address_refused'
  | 'tls_error'
  | 'redirect'
  | 'http_status'

export type WebhookAttempt = {
  status: number | null
  error: WebhookAttemptError | null
  durationMs: number
  /** The first 2 KiB of the response body, or null when no response arrived. */
  bodyExcerpt: string | null
  /** A human sentence for logs and the delivery log; null on success. */
  detail: string | null
  /** The X-Service-Signature header sent; null when no request went out (the address was refused). */
  signature: string | null
  /** Every header the request carried, secrets left out (loggedHeaders); null when no request went out. */
  requestHeaders: Record<string, string> | null
}

export type SignedWebhookRequest = {
  url: string
  policy: AddressPolicy
  /** The delivery id: sent as webhook-id and signed with the body. */
  id: string
  /** The current secret first; during a rotation grace period the old one second. */
  secrets: readonly (string | SigningSecret)[]
  body: Buffer | string
  headers?: Record<string, string>
  timeoutMs?: number
}

export const DEFAULT_TIMEOUT_MS = 10_000
export const EXCERPT_BYTES = 2048
// Draining a modest remainder keeps the connection reusable; anything larger is cut off by
// closing the socket, so a receiver cannot make us read an unbounded body.
const DRAIN_LIMIT_BYTES = 64 * 1024
const MAX_CACHED_POOLS = 256
const MAX_CACHED_CHECKS = 1024

export async function sendSignedWebhook(request: SignedWebhookRequest): Promise<WebhookAttempt> {
  const timeoutMs = request.timeoutMs ?? DEFAULT_TIMEOUT_MS
  const started = performance.now()
  const elapsed = () => Math.round(performance.now() - started)
  const deadline = new AbortController()
  const timer = setTimeout(() => deadline.abort(new Error(`no complete answer within ${timeoutMs} ms`)), timeoutMs)

  let status: number | null = null
  let excerpt: ExcerptReader | null = null
  let signature: string | null = null
  let requestHeaders: Record<string, string> | null = null
  try {
    const pending = checkTarget(request.url, request.policy)
    const check = pending instanceof Promise ? await beforeDeadline(pending, deadline.signal) : pending
    if (!check.ok) {
      const error = check.code === 'dns_failed' ? 'dns_failed' : 'address_refused'
      return { status: null, error, durationMs: elapsed(), bodyExcerpt: null, detail: check.reason, signature, requestHeaders }
    }

    const body = typeof request.body === 'string' ? Buffer.from(request.body, 'utf8') : request.body
    // Signed per attempt, so a retry hours later still falls inside the receiver's tolerance. Both
    // schemes sign the same timestamp.
    const timestamp = Math.floor(Date.now() / 1000)
    const secrets = request.secrets.map((secret) => (typeof secret === 'string' ? signingSecret(secret) : secret))
    signature = signatureHeader(
      secrets.map((secret) => secret.service),
      timestamp,
      body,
    )
    const headers = {
      'content-type': CONTENT_TYPE,
      ...request.headers,
      'x-service-signature': signature,
      'webhook-id': request.id,
      'webhook-timestamp': String(timestamp),
      'webhook-signature': standardSignatureHeader(
        secrets.map((secret) => secret.standard),
        request.id,
        timestamp,
        body,
      ),
    }
    requestHeaders = loggedHeaders(check.url, headers, body.length)
    const response = await pinnedPool(check.url.origin, check.addresses[0]).request({
      method: 'POST',
      path: check.url.pathname + check.url.search,
      headers,
      body,
      signal: deadline.signal,
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    })
    status = response.statusCode
    excerpt = new ExcerptReader()
    await excerpt.consume(response.body)

    const bodyExcerpt = excerpt.text()
    if (status >= 200 && status < 300)
      return { status, error: null, durationMs: elapsed(), bodyExcerpt, detail: null, signature, requestHeaders }
    if (status >= 300 && status < 400) {
      const location = String(response.headers.location ?? '(no Location header)').slice(0, 200)
      return {
        status,
        error: 'redirect',
        durationMs: elapsed(),
        bodyExcerpt,
        detail: `HTTP ${status} redirect to ${location} was not followed`,
        signature,
        requestHeaders,
      }
    }
    return { status, error: 'http_status', durationMs: elapsed(), bodyExcerpt, detail: `HTTP ${status}`, signature, requestHeaders }
  } catch (error) {
    const attemptError = deadline.signal.aborted ? 'timeout' : attemptErrorOf(error)
    const detail = deadline.signal.aborted ? (deadline.signal.reason as Error).message : describe(error)
    return { status, error: attemptError, durationMs: elapsed(), bodyExcerpt: excerpt?.text() ?? null, detail, signature, requestHeaders }
  } finally {
    clearTimeout(timer)
  }
}

/** For shutdown and tests: closes every cached keep-alive connection. */
export async function closeWebhookConnections(): Promise<void> {
  const closing = [...pools.values()].map((pool) => pool.close())
  pools.clear()
  newestPoolKey = ''
  await Promise.allSettled(closing)
}

// An IP-literal URL passes or fails the guard the same way every time under one policy (no name
// to resolve), so its verdict is kept; a host name is resolved and checked again at every attempt.
const checksByPolicy = new WeakMap<AddressPolicy, Map<string, WebhookUrlCheck>>()

function checkTarget(url: string, policy: AddressPolicy): WebhookUrlCheck | Promise<WebhookUrlCheck> {
  const known = checksByPolicy.get(policy)?.get(url)
  if (known !== undefined) return known
  return checkWebhookUrl(url, policy).then((check) => {
    if (check.ok && isIP(check.host) !== 0) {
      let checks = checksByPolicy.get(policy)
      if (checks === undefined) checksByPolicy.set(policy, (checks = new Map()))
      if (checks.size >= MAX_CACHED_CHECKS) checks.clear()
      checks.set(url, check)
    }
    return check
  })
}

// Keyed by origin and dialled address, so keep-alive connections are reused across deliveries but
// never shared between two addresses the same name resolved to. Map order doubles as LRU order.
const pools = new Map<string, Pool>()
let newestPoolKey = ''

function pinnedPool(origin: string, target: ResolvedAddress): Pool {
  const key = `${origin} ${target.address}`
  const cached = pools.get(key)
  if (cached !== undefined) {
    if (key !== newestPoolKey) {
      pools.delete(key)
      pools.set(key, cached)
      newestPoolKey = key
    }
    return cached
  }
  // The origin keeps the real host name, so undici sends it in Host and as TLS SNI and verifies the
  // certificate against it; only the lookup is replaced. An IP-literal origin skips lookup anyway.
  const pool = new Pool(origin, { connect: { lookup: pinnedLookup(target) }, keepAliveTimeout: 30_000 })
  pools.set(key, pool)
  newestPoolKey = key
  if (pools.size > MAX_CACHED_POOLS) {
    const [oldestKey, oldest] = pools.entries().next().value as [string, Pool]
    pools.delete(oldestKey)
    void oldest.close().catch(() => {})
  }
  return pool
}

function pinnedLookup(target: ResolvedAddress): LookupFunction {
  return (_hostname, options, callback) => {
    // Node asks for all addresses when it races IPv4 and IPv6 (autoSelectFamily).
    if (options.all) callback(null, [{ address: target.address, family: target.family }])
    else callback(null, target.address, target.family)
  }
}

function beforeDeadline<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason)
    signal.addEventListener('abort', onAbort, { once: true })
    work.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort))
  })
}

class ExcerptReader {
  #kept: Buffer[] = []
  #keptBytes = 0

  /** Reads the answer to its end, keeping the first EXCERPT_BYTES; gives up on it past DRAIN_LIMIT_BYTES. */
  consume(body: Readable): Promise<void> {
    // Stream events rather than an async iterator: the same outcome for less work per answer,
    // and most answers are one small chunk.
    return new Promise((resolve, reject) => {
      let seenBytes = 0
      let ended = false
      const onData = (chunk: Buffer) => {
        if (this.#keptBytes < EXCERPT_BYTES) {
          const piece = Buffer.from(chunk.subarray(0, EXCERPT_BYTES - this.#keptBytes))
          this.#kept.push(piece)
          this.#keptBytes += piece.length
        }
        seenBytes += chunk.length
        if (seenBytes > DRAIN_LIMIT_BYTES) {
          // Destroying the body makes undici close the connection.
          ended = true
          body.off('data', onData)
          body.destroy()
          resolve()
        }
      }
      body.on('data', onData)
      body.once('end', () => {
        ended = true
        resolve()
      })
      body.once('error', reject)
      body.once('close', () => {
        if (!ended) reject(new Error('the answer ended before its body was complete'))
      })
    })
  }

  text(): string {
    const kept = this.#kept.length === 1 ? this.#kept[0] : Buffer.concat(this.#kept)
    // Stream mode drops a character cut in half at the 2 KiB boundary instead of showing U+FFFD.
    const decoded = isAscii(kept) ? kept.toString('latin1') : new TextDecoder('utf-8').decode(kept, { stream: true })
    // PostgreSQL text cannot hold NUL.
    return decoded.includes('\u0000') ? decoded.replaceAll('\u0000', '\ufffd') : decoded
  }
}

const TLS_ERROR_CODE =
  /^(ERR_TLS_|ERR_SSL_|ERR_OSSL_|CERT_|EPROTO$|DEPTH_ZERO_SELF_SIGNED_CERT$|SELF_SIGNED_CERT_IN_CHAIN$|UNABLE_TO_|HOSTNAME_MISMATCH$)/
const TIMEOUT_CODES = new Set(['UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'ETIMEDOUT'])
const DNS_CODES = new Set(['ENOTFOUND', 'EAI_AGAIN', 'EAI_FAIL', 'EAI_NODATA'])

function attemptErrorOf(error: unknown): WebhookAttemptError {
  for (const code of errorCodes(error)) {
    if (TIMEOUT_CODES.has(code)) return 'timeout'
    if (code === 'ECONNREFUSED') return 'connection_refused'
    if (DNS_CODES.has(code)) return 'dns_failed'
    if (TLS_ERROR_CODE.test(code)) return 'tls_error'
  }
  // The contract has no separate code for resets, unreachable hosts or a connection closed before
  // the answer; to the subscriber they all mean the endpoint could not be reached.
  return 'connection_refused'
}

function errorCodes(error: unknown): string[] {
  const codes: string[] = []
  for (let current = error, depth = 0; current instanceof Error && depth < 5; current = current.cause, depth++) {
    const code = (current as { code?: unknown }).code
    if (typeof code === 'string') codes.push(code)
  }
  return codes
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error)
  const code = errorCodes(error)[0]
  return code === undefined ? error.message : `${error.message} (${code})`
}
