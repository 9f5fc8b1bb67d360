// The per-address limit of the unauthenticated routes (API.md section 3): sign-in, two-factor,
// sign-up and invitation acceptance, in the API and the UI. Counted in this process, in fixed
// one-minute windows aligned to the clock, so with N API processes an address gets at most
// N × the limit a minute: a bound on guessing, not an exact quota (the per-email and per-user
// counts in PostgreSQL are the exact ones).
import type { IncomingMessage } from 'node:http'
import { RateLimitedError } from '../errors.ts'
import { clientOf } from './client-address.ts'

export type AddressRateLimit = (req: IncomingMessage) => void

export function createAddressRateLimit(limitPerMinute: number, now: () => number = Date.now): AddressRateLimit {
  let windowMinute = -1
  const counts = new Map<string, number>()
  return (req) => {
    const time = now()
    const minute = Math.floor(time / 60_000)
    if (minute !== windowMinute) {
      // Every count belongs to the window that just ended.
      counts.clear()
      windowMinute = minute
    }
    const address = clientOf(req).address
    const count = (counts.get(address) ?? 0) + 1
    counts.set(address, count)
    if (count > limitPerMinute) {
      throw new RateLimitedError(
        Math.max(1, Math.ceil(((minute + 1) * 60_000 - time) / 1000)),
        'rate_limited',
        `More than ${limitPerMinute} attempts from this address in this minute`,
      )
    }
  }
}
