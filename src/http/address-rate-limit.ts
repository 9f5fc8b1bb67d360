// The per-address limit of the unauthenticated routes (docs/api.md section 3): sign-in, two-factor,
// sign-up and invitation acceptance, in the API and the UI, and the OAuth endpoints for clients
// that do not authenticate. Counted in this process, in fixed one-minute windows aligned to the
// clock, so with N API processes an address gets at most N × the limit a minute: a bound on
// guessing, not an exact quota (the per-email and per-user counts in PostgreSQL are the exact ones).
//
// An address is an IPv4 address, or an IPv6 client's /64: a subscriber is usually given a whole
// /64 and can take any address in it, so counting each IPv6 address alone would let one client
// rotate past the limit (an IPv4-mapped IPv6 address counts as the IPv4 address it is).
import type { IncomingMessage } from 'node:http'
import { addressBlock } from '../cidr.ts'
import { RateLimitedError } from '../errors.ts'
import { clientOf } from './client-address.ts'

/** Counts per key in fixed one-minute windows aligned to the clock, in this process. */
export class MinuteCounts {
  private windowMinute = -1
  private readonly counts = new Map<string, number>()
  private readonly now: () => number

  constructor(now: () => number = Date.now) {
    this.now = now
  }

  /** The key's count in this minute. */
  get(key: string): number {
    this.roll()
    return this.counts.get(key) ?? 0
  }

  /** Adds one to the key's count in this minute and answers the new count. */
  add(key: string): number {
    this.roll()
    const count = (this.counts.get(key) ?? 0) + 1
    this.counts.set(key, count)
    return count
  }

  /** Whole seconds until the window ends (at least 1): the Retry-After of a refusal. */
  secondsLeft(): number {
    const time = this.now()
    return Math.max(1, Math.ceil(((Math.floor(time / 60_000) + 1) * 60_000 - time) / 1000))
  }

  private roll(): void {
    const minute = Math.floor(this.now() / 60_000)
    if (minute !== this.windowMinute) {
      // Every count belongs to the window that just ended.
      this.counts.clear()
      this.windowMinute = minute
    }
  }
}

/** Counts the request against its address: 429 past the limit. */
export type AddressRateLimit = (req: IncomingMessage) => void

export function createAddressRateLimit(limitPerMinute: number, now: () => number = Date.now): AddressRateLimit {
  const counts = new MinuteCounts(now)
  return (req) => {
    if (counts.add(addressBlock(clientOf(req).address)) > limitPerMinute)
      throw new RateLimitedError(
        counts.secondsLeft(),
        'rate_limited',
        `More than ${limitPerMinute} attempts from this address in this minute`,
      )
  }
}

export type OAuthClientRateLimit = {
  /**
   * Before the database is asked about a client that sent a secret: 429 when that client has used
   * up its limit in this minute, or when the request's address has failed `failuresPerMinute` times.
   */
  admit: (req: IncomingMessage, clientId: string) => void
  /** The client authenticated: the request counts as the client's. */
  counted: (clientId: string) => void
  /** It did not (a wrong secret, or a request refused before its client was checked): it counts against its address. */
  failed: (req: IncomingMessage) => void
}

/**
 * The token and revocation endpoints' count of confidential clients (src/http/routes/oauth.ts).
 * A request counts as its client only once the database has checked the client's secret, so no
 * one can spend another client's count, and the counts kept grow with the clients that exist, not
 * with the ids and secrets a guesser makes up; those count against the guesser's address.
 */
export function createOAuthClientRateLimit(
  limitPerMinute: number,
  failuresPerMinute: number,
  now: () => number = Date.now,
): OAuthClientRateLimit {
  const counts = new MinuteCounts(now)
  const failures = (req: IncomingMessage) => `failed ${addressBlock(clientOf(req).address)}`
  return {
    admit: (req, clientId) => {
      if (counts.get(failures(req)) >= failuresPerMinute)
        throw new RateLimitedError(
          counts.secondsLeft(),
          'rate_limited',
          `More than ${failuresPerMinute} failed client authentications from this address in this minute`,
        )
      if (counts.get(`client ${clientId}`) >= limitPerMinute)
        throw new RateLimitedError(
          counts.secondsLeft(),
          'rate_limited',
          `More than ${limitPerMinute} requests of this client in this minute`,
        )
    },
    counted: (clientId) => void counts.add(`client ${clientId}`),
    failed: (req) => void counts.add(failures(req)),
  }
}
