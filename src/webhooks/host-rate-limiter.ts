// Caps the webhook attempts per destination host per second, across every workspace and
// subscription this worker process sends for (WEBHOOK_HOST_RATE_PER_SECOND), so that open sign-up
// cannot turn the sender into a flood reflector: a thousand free workspaces subscribing the same
// victim reach it at the cap, not a thousand times the per-subscription concurrency. An attempt
// over the cap is not dropped: its batch stops and hands the rest back to the job queue, which
// sends it later (src/webhooks/batch-sender.ts).
//
// A token bucket per host, holding at most a tenth of a second's tokens, so any one-second window
// sees at most rate × 1.1 (+1) attempts to a host. Why in the process and not in the database: a
// shared counter would cost a write per attempt on one hot row per host. The price: the cap is per
// worker process (N worker processes allow N × the rate).
/** Where the limiter reads the time and waits: the process's clock, or a test's simulated one. */
export type LimiterClock = { now: () => number; sleep: (ms: number) => Promise<void> }

const PROCESS_CLOCK: LimiterClock = {
  now: () => performance.now(),
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
}

export class HostRateLimiter {
  readonly ratePerSecond: number
  readonly #capacity: number
  readonly #buckets = new Map<string, { tokens: number; at: number }>()
  readonly #clock: LimiterClock

  constructor(ratePerSecond: number, clock: LimiterClock = PROCESS_CLOCK) {
    this.ratePerSecond = ratePerSecond
    this.#capacity = Math.max(1, Math.ceil(ratePerSecond / 10))
    this.#clock = clock
  }

  /**
   * Takes a token for `host`, waiting for it when it comes within maxWaitMs (tokens are handed out
   * in the order asked); false, and nothing taken, when it would come later.
   */
  async take(host: string, maxWaitMs: number): Promise<boolean> {
    const now = this.#clock.now()
    const bucket = this.#buckets.get(host) ?? { tokens: this.#capacity, at: now }
    bucket.tokens = Math.min(this.#capacity, bucket.tokens + ((now - bucket.at) * this.ratePerSecond) / 1000)
    bucket.at = now
    const waitMs = bucket.tokens >= 1 ? 0 : ((1 - bucket.tokens) * 1000) / this.ratePerSecond
    if (waitMs > maxWaitMs) {
      this.#buckets.set(host, bucket)
      return false
    }
    // Taken now, even when it arrives later: the debt keeps later callers behind this one.
    bucket.tokens -= 1
    this.#buckets.set(host, bucket)
    if (waitMs > 0) await this.#clock.sleep(waitMs)
    this.#forgetFull()
    return true
  }

  /** Buckets that refilled completely say nothing the default does not: dropped, so the map stays small. */
  #forgetFull(): void {
    if (this.#buckets.size < 10_000) return
    const now = this.#clock.now()
    for (const [host, bucket] of this.#buckets) {
      if (bucket.tokens + ((now - bucket.at) * this.ratePerSecond) / 1000 >= this.#capacity) this.#buckets.delete(host)
    }
  }
}

/** The host a webhook URL names (lower-case, without the port): the unit the cap counts. */
export function webhookHost(url: string): string {
  try {
    return new URL(url).hostname
  } catch {
    return url
  }
}
