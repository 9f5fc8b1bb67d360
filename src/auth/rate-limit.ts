// The per-user rate limit counted in the API process and settled in PostgreSQL in batches
// (crm.settle_request_counts, sql/definitions/20_tenancy_and_access.sql). A request is admitted when the
// user's total, as the last settlement answered it, plus this process's admitted but unsettled
// requests stays under the limit: no round trip and no promise in the common case. The counts go
// to the database every intervalMs, and at once when a user's unsettled count reaches the batch;
// a request that finds its user's batch full waits for that settlement. A request that
// crm.authenticate counted in the database is admitted against the total it answered plus this
// process's unsettled requests too (admitCounted), and kept in the process's view until a
// settlement's snapshot has seen its transaction end. With N processes the total admitted per user and
// window is at most limit + (N - 1) × batch (the argument, and what full authentications running
// at the same moment add, is in docs/decisions.md, "The rate limit counted in the process").
import { AsyncLocalStorage } from 'node:async_hooks'
import { randomInt } from 'node:crypto'
import Type from 'typebox'
import { defaultRateLimitBatch } from '../config.ts'
import { type DatabasePool, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { RateLimitedError, UnavailableError } from '../errors.ts'

/** What the RateLimit-* headers say: the limit, what is left of it, and the seconds to the window's end. */
export type RateQuota = { limit: number; remaining: number; resetSeconds: number }

/**
 * Which transactions had ended when a total was read: the snapshot it was read with
 * (pg_snapshot's text, `xmin:xmax:xip,…`). A request's count committed in a transaction the
 * snapshot saw end is in the total; one still open then is not.
 */
export type TotalsSnapshot = { sawEnd(transaction: bigint): boolean }

/** Each user's total, and the snapshot the totals were read with when known. */
export type SettledTotals = ReadonlyMap<string, number> & { readonly snapshot?: TotalsSnapshot }

/**
 * Adds this process's counts (0 or more) for the users in the clock minute starting at windowStart
 * and answers each user's total in that window, over every process and backend. Settlements of one
 * user must be serialised (each total includes every earlier settlement's counts): the overshoot
 * bound rests on it. crm.settle_request_counts does both.
 */
export type SettleRequestCounts = (windowStart: Date, userIds: readonly string[], counts: readonly number[]) => Promise<SettledTotals>

/** pg_snapshot's text form as a TotalsSnapshot. */
export function parseSnapshot(text: string): TotalsSnapshot {
  const match = /^(\d+):(\d+):([\d,]*)$/.exec(text)
  if (!match) throw new Error(`rate limit: not a pg_snapshot: ${JSON.stringify(text)}`)
  const xmin = BigInt(match[1])
  const xmax = BigInt(match[2])
  const inProgress = new Set(match[3] === '' ? [] : match[3].split(',').map(BigInt))
  return { sawEnd: (transaction) => transaction < xmin || (transaction < xmax && !inProgress.has(transaction)) }
}

export type RequestRateLimitOptions = {
  /** Requests per user per clock minute. */
  limit: number
  /** Unsettled requests a process admits per user before a request waits for their settlement (default 1 % of the limit). */
  batch?: number
  /** How often the counts are settled, in milliseconds (default 250). */
  intervalMs?: number
  settle: SettleRequestCounts
  /** The clock, in epoch milliseconds (tests inject their own). */
  now?: () => number
  /** Told about every settlement that failed (its counts stay and go with the next one) and about counts dropped unsettled. */
  onError?: (error: unknown) => void
}

export type RequestRateLimit = {
  /**
   * Admits one request of the user, or refuses it with RateLimitedError (429 rate_limited). Answers
   * synchronously, and throws synchronously, unless the user's batch is full: then the request
   * waits for the settlement and the promise answers or rejects (UnavailableError when the
   * settlement fails).
   */
  admit(userId: string): RateQuota | Promise<RateQuota>
  /** A total PostgreSQL counted itself (crm.authenticate counts its request in the database): the user's view rises to it. */
  observe(userId: string, total: number, resetSeconds: number): RateQuota
  /**
   * A request crm.authenticate admitted and counted in the database, `total` (this request
   * included) being what it answered: admitted only when that total, or the process's own view with
   * this request, plus this process's unsettled requests stays within the limit, else refused with
   * RateLimitedError, and the user's view rises to the total (as observe). The database's total
   * sees no process's unsettled requests. A settlement in flight may or may not be in the total:
   * the answer waits for it (then it is in the view), so nothing is counted twice. `countedIn` is
   * the transaction holding the request's count: until a settlement's snapshot has seen it end,
   * that settlement's total may lack the request, and the view adds it.
   */
  admitCounted(userId: string, total: number, resetSeconds: number, countedIn?: bigint | null): RateQuota | Promise<RateQuota>
  /**
   * Takes back one admission of the user whose request is then counted by crm.authenticate after
   * all (its cached identity was stale), so that it counts once. When a settlement already carried
   * it, the next settlement carries one less.
   */
  release(userId: string): void
  /** Settles every count this process holds; rejects when a settlement fails (the counts stay). */
  flush(): Promise<void>
  /** Ends the timer (settlements by amount and flush still work). */
  stop(): void
}

const MINUTE_MS = 60_000

/** The 429 of a user past the limit, whoever counted it (this process, or crm.authenticate). */
export function rateLimitedError(limit: number, resetSeconds: number): RateLimitedError {
  return new RateLimitedError(resetSeconds, 'rate_limited', `More than ${limit} requests in this minute`, {
    limit,
    remaining: 0,
    resetSeconds,
  })
}

/** One user in one window: the total the last settlement answered, and this process's unsettled requests. */
type UserCount = {
  seen: number
  /**
   * Admitted and not yet acknowledged by a settlement, those in flight included. Below zero when
   * admissions were released after a settlement carried them: the next settlements carry that
   * many fewer.
   */
  pending: number
  /** The part of pending a settlement in flight carries. */
  sending: number
  /**
   * Transactions holding the counts of requests admitted by admitCounted that no settlement's
   * snapshot has yet seen end: a total read while one is open lacks its request.
   */
  open?: bigint[]
  /** The snapshot of the settlement whose total is `seen`; undefined when seen came from elsewhere. */
  seenWith?: TotalsSnapshot
}

type Window = { start: number; end: number; users: Map<string, UserCount> }

const windowAt = (time: number): Window => {
  const start = Math.floor(time / MINUTE_MS) * MINUTE_MS
  return { start, end: start + MINUTE_MS, users: new Map() }
}

/** One process's limiter: create it once per process (its timer is unref'd; flush, then stop, on shutdown). */
export function createRequestRateLimit(options: RequestRateLimitOptions): RequestRateLimit {
  const { limit, settle } = options
  const batch = options.batch ?? defaultRateLimitBatch(limit)
  const intervalMs = options.intervalMs ?? 250
  const now = options.now ?? Date.now
  const onError = options.onError ?? (() => {})
  if (!Number.isInteger(limit) || limit < 1) throw new RangeError(`rate limit: limit must be a whole number from 1, got ${limit}`)
  if (!Number.isInteger(batch) || batch < 1 || batch > limit) {
    throw new RangeError(`rate limit: batch must be a whole number from 1 to the limit (${limit}), got ${batch}`)
  }
  if (!Number.isInteger(intervalMs) || intervalMs < 1)
    throw new RangeError(`rate limit: intervalMs must be a positive whole number, got ${intervalMs}`)

  let current = windowAt(now())
  /** Windows that ended while some of their users' counts were unsettled; each goes once they are. */
  const ended: Window[] = []
  let inFlight: Promise<void> | null = null
  /** Some count was admitted since the last settlement started (or a settlement failed). */
  let unsent = false
  /** A user's batch filled while a settlement was in flight: the next one starts as soon as it returns. */
  let wanted = false

  /** Moves to the window of `time`; the window that ended keeps only users with unsettled counts. */
  const windowOf = (time: number): Window => {
    if (time < current.end) return current
    const previous = current
    current = windowAt(time)
    for (const [userId, count] of previous.users) if (count.pending <= 0) previous.users.delete(userId)
    if (previous.users.size > 0) ended.push(previous)
    // The database takes counts for the window that just ended, no older one: the requests of
    // older windows decide nothing any more, so what is left of them is dropped, and said.
    while (ended.length > 0 && ended[0].start < current.start - MINUTE_MS) {
      const stale = ended.shift() as Window
      let dropped = 0
      for (const count of stale.users.values()) dropped += count.pending
      onError(
        new Error(
          `rate limit: ${dropped} request counts of the window ${new Date(stale.start).toISOString()} could not be settled in time`,
        ),
      )
    }
    return current
  }

  const resetSecondsAt = (time: number) => Math.min(60, Math.max(1, Math.ceil((current.end - time) / 1000)))
  const quotaOf = (count: UserCount, time: number): RateQuota => ({
    limit,
    remaining: Math.max(0, Math.min(limit, limit - count.seen - count.pending)),
    resetSeconds: resetSecondsAt(time),
  })
  const refusal = (time: number) => rateLimitedError(limit, resetSecondsAt(time))
  const countOf = (window: Window, userId: string): UserCount => {
    let count = window.users.get(userId)
    if (count === undefined) {
      count = { seen: 0, pending: 0, sending: 0 }
      window.users.set(userId, count)
    }
    return count
  }

  /** One settlement: a call per window with unsent counts (the one that ended first), one at a time. */
  const settleAll = async (): Promise<void> => {
    windowOf(now())
    unsent = false
    for (const window of [...ended, current]) {
      const userIds: string[] = []
      const counts: number[] = []
      const entries: UserCount[] = []
      for (const [userId, count] of window.users) {
        const toSend = count.pending - count.sending
        if (toSend <= 0) continue
        count.sending += toSend
        userIds.push(userId)
        counts.push(toSend)
        entries.push(count)
      }
      if (userIds.length === 0) continue
      let totals: SettledTotals
      try {
        totals = await settle(new Date(window.start), userIds, counts)
      } catch (error) {
        for (let i = 0; i < entries.length; i++) entries[i].sending -= counts[i]
        unsent = true
        onError(error)
        throw error
      }
      for (let i = 0; i < entries.length; i++) {
        const count = entries[i]
        count.sending -= counts[i]
        count.pending -= counts[i]
        const total = totals.get(userIds[i])
        if (total === undefined) continue
        // A request this process admitted whose transaction the snapshot had not seen end (an
        // export still streaming, or a request between its authentication and its commit) is not
        // in the total: the view keeps it.
        const { snapshot } = totals
        if (count.open && snapshot) count.open = count.open.filter((transaction) => !snapshot.sawEnd(transaction))
        const known = total + (count.open?.length ?? 0)
        if (known > count.seen) {
          count.seen = known
          count.seenWith = snapshot
        }
      }
      const endedAt = ended.indexOf(window)
      if (endedAt >= 0) {
        for (const [userId, count] of window.users) if (count.pending <= 0) window.users.delete(userId)
        if (window.users.size === 0) ended.splice(endedAt, 1)
      }
    }
  }

  /** The settlement in flight, or a new one. */
  const settlement = (): Promise<void> => {
    if (inFlight === null) {
      inFlight = settleAll().finally(() => {
        inFlight = null
        if (wanted) {
          wanted = false
          settlement().catch(() => {})
        }
      })
    }
    return inFlight
  }

  const settleSoon = () => {
    if (inFlight === null) settlement().catch(() => {})
    else wanted = true
  }

  const admitAfterSettlement = async (userId: string): Promise<RateQuota> => {
    for (;;) {
      try {
        await settlement()
      } catch (error) {
        throw new UnavailableError(error, 'The request count could not be settled right now; retry shortly')
      }
      const time = now()
      const count = countOf(windowOf(time), userId)
      if (count.seen + count.pending >= limit) throw refusal(time)
      if (count.pending < batch) {
        count.pending++
        unsent = true
        if (count.pending === batch) settleSoon()
        return quotaOf(count, time)
      }
    }
  }

  /** The user's count when the database's window is this process's current one; null otherwise. */
  const countInDatabaseWindow = (userId: string, time: number, resetSeconds: number): UserCount | null => {
    const window = windowOf(time)
    // The database's window is the minute that ends resetSeconds from now (to within a second).
    if (Math.round((time + resetSeconds * 1000) / MINUTE_MS) * MINUTE_MS !== window.end) return null
    return countOf(window, userId)
  }

  const decideCounted = (userId: string, count: UserCount, total: number, answeredAt: number, countedIn?: bigint | null): RateQuota => {
    const time = now()
    // The window ended while waiting: the request belongs to the one that ended, and decided nothing there.
    if (windowOf(time).start !== Math.floor(answeredAt / MINUTE_MS) * MINUTE_MS) return quotaOf(countOf(current, userId), time)
    // `total` holds this request and what was settled when crm.authenticate read; `seen + 1` holds
    // it and every total a settlement answered since (their requests are then no longer pending),
    // unless that settlement's snapshot saw this request's transaction end: then `seen` holds it.
    // Neither holds `pending`: no settlement that carries those had answered when the total was read.
    const inSeen = countedIn != null && count.seenWith?.sawEnd(countedIn) === true
    const known = Math.max(total, count.seen + (inSeen ? 0 : 1))
    if (known + count.pending > limit) throw refusal(time)
    // The view holds this request from now on, also when a settlement's total that lacks it was larger.
    count.seen = known
    count.seenWith = undefined
    if (countedIn != null && !inSeen) (count.open ??= []).push(countedIn)
    return quotaOf(count, time)
  }

  const timer = setInterval(() => {
    // Also moves to the next window when no request does, so ended windows are let go.
    windowOf(now())
    if (unsent && inFlight === null) settlement().catch(() => {})
  }, intervalMs)
  timer.unref()

  return {
    admit(userId) {
      const time = now()
      const count = countOf(time < current.end ? current : windowOf(time), userId)
      // Totals only grow within a window, so a refusal here is final for the window.
      if (count.seen + count.pending >= limit) throw refusal(time)
      if (count.pending >= batch) return admitAfterSettlement(userId)
      count.pending++
      unsent = true
      if (count.pending === batch) settleSoon()
      return quotaOf(count, time)
    },

    observe(userId, total, resetSeconds) {
      const time = now()
      const count = countInDatabaseWindow(userId, time, resetSeconds)
      if (count === null) return { limit, remaining: Math.max(0, limit - total), resetSeconds }
      if (total > count.seen) count.seen = total
      return quotaOf(count, time)
    },

    admitCounted(userId, total, resetSeconds, countedIn) {
      const answeredAt = now()
      const count = countInDatabaseWindow(userId, answeredAt, resetSeconds)
      if (count === null) return { limit, remaining: Math.max(0, limit - total), resetSeconds }
      if (count.sending > 0 && inFlight !== null) {
        // Whatever settlement starts after this one carries requests the total cannot include.
        return inFlight.catch(() => {}).then(() => decideCounted(userId, count, total, answeredAt, countedIn))
      }
      return decideCounted(userId, count, total, answeredAt, countedIn)
    },

    release(userId) {
      const count = current.users.get(userId)
      if (count !== undefined) count.pending--
    },

    async flush() {
      for (;;) {
        if (inFlight !== null) {
          await inFlight.catch(() => {})
          continue
        }
        windowOf(now())
        const holding = [...ended, current].some((window) => {
          for (const count of window.users.values()) if (count.pending > 0) return true
          return false
        })
        if (!holding) return
        await settlement()
      }
    },

    stop() {
      clearInterval(timer)
    },
  }
}

const SettledRow = rowType(Type.Object({ user_id: Type.String(), total: Type.Integer(), snapshot: Type.String() }))

/** A counter id for crm.settle_request_counts: negative, so it never meets a backend pid. */
export function randomCounterId(): number {
  return -randomInt(1, 2 ** 31)
}

/**
 * Settlements through crm.settle_request_counts, each its own statement on the pool (never inside
 * a request transaction: the function holds its users' locks until commit), under this process's
 * counter id. The pool must log in as the runtime role. Requests that wait for a settlement must
 * not hold the connections it needs: admit before taking a connection, or give the settlements a
 * pool of their own (one connection is enough, they run one at a time).
 */
export function createSettleRequestCounts(
  pool: DatabasePool,
  source: number = randomCounterId(),
): SettleRequestCounts & { readonly source: number } {
  if (!Number.isInteger(source) || source >= 0 || source < -(2 ** 31)) {
    throw new RangeError(`rate limit: the counter id must be a negative 32-bit integer, got ${source}`)
  }
  // A settlement starts in the context of the request that filled a batch; slonik would take a
  // query there for one of that request's transaction (and refuse it): it runs in the context the
  // settler was made in.
  const outside = AsyncLocalStorage.snapshot()
  const settle = async (windowStart: Date, userIds: readonly string[], counts: readonly number[]) => {
    const rows = await outside(() =>
      pool.any(sql.type(SettledRow)`
      select s.user_id, s.total, s.snapshot::text as snapshot
        from crm.settle_request_counts(${source}, ${windowStart.toISOString()}, ${sql.array([...userIds], 'uuid')}, ${sql.array([...counts], 'int4')}) s`),
    )
    const totals = new Map(rows.map((row) => [row.user_id, row.total]))
    return rows.length === 0 ? totals : Object.assign(totals, { snapshot: parseSnapshot(rows[0].snapshot) })
  }
  return Object.assign(settle, { source })
}
