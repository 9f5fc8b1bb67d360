// Caps the attempts in flight per subscription in this worker process, so one slow endpoint can
// hold at most `limit` of the worker's job slots and every other subscription keeps flowing.
// A job that finds its subscription at the cap waits a few milliseconds for a slot (a fast
// endpoint frees one almost at once, and re-adding the job would cost a write); if none frees, it
// re-adds itself a little later, keeping its delivery generation, and completes.
//
// Why not a graphile-worker queue per subscription: a named queue runs its jobs one at a time,
// which caps a busy endpoint at 1 / round-trip time (about 300/s against a 3 ms receiver), and
// high-cardinality queue names slow job fetching. Why not a counter row in the database: two more
// writes per attempt on one hot row, and slots leak when a worker is killed. The price of this
// choice: the cap is per process (N worker processes allow N x limit in flight).
export class SubscriptionLimiter {
  readonly limit: number
  readonly #inFlight = new Map<string, number>()
  readonly #waiting = new Map<string, { grant: () => void }[]>()

  constructor(limit: number) {
    this.limit = limit
  }

  tryAcquire(subscriptionId: string): boolean {
    const current = this.#inFlight.get(subscriptionId) ?? 0
    if (current >= this.limit) return false
    this.#inFlight.set(subscriptionId, current + 1)
    return true
  }

  /** Waits up to maxWaitMs for a slot, first come first served; false when none freed. */
  acquire(subscriptionId: string, maxWaitMs: number): Promise<boolean> {
    if (this.tryAcquire(subscriptionId)) return Promise.resolve(true)
    return new Promise((resolve) => {
      const waiters = this.#waiting.get(subscriptionId) ?? []
      const waiter = {
        grant: () => {
          clearTimeout(timer)
          resolve(true)
        },
      }
      const timer = setTimeout(() => {
        const list = this.#waiting.get(subscriptionId)
        const at = list?.indexOf(waiter) ?? -1
        if (list && at !== -1) list.splice(at, 1)
        if (list?.length === 0) this.#waiting.delete(subscriptionId)
        resolve(false)
      }, maxWaitMs)
      waiters.push(waiter)
      this.#waiting.set(subscriptionId, waiters)
    })
  }

  release(subscriptionId: string): void {
    const waiters = this.#waiting.get(subscriptionId)
    if (waiters !== undefined && waiters.length > 0) {
      // The slot passes straight to the next waiter: the count stays as it is.
      const next = waiters.shift()!
      if (waiters.length === 0) this.#waiting.delete(subscriptionId)
      next.grant()
      return
    }
    const current = this.#inFlight.get(subscriptionId) ?? 0
    if (current <= 1) this.#inFlight.delete(subscriptionId)
    else this.#inFlight.set(subscriptionId, current - 1)
  }

  inFlight(subscriptionId: string): number {
    return this.#inFlight.get(subscriptionId) ?? 0
  }
}
