// The rate limiter of one API process (src/auth/rate-limit.ts) with an injected clock and a settle
// that stands in for the database: what is answered at once and what waits, batches, windows,
// failures, and the timer that must not keep a process alive.
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { createRequestRateLimit, parseSnapshot, type RateQuota, type SettleRequestCounts } from '../../src/auth/rate-limit.ts'
import { RateLimitedError, UnavailableError } from '../../src/errors.ts'

const MINUTE = 60_000
const T0 = Date.UTC(2026, 0, 15, 12, 0, 0)
const [ALICE, BOB] = ['00000000-0000-4000-8000-00000000000a', '00000000-0000-4000-8000-00000000000b']

type Call = { windowStart: number; counts: Record<string, number>; answer: (fail?: Error) => void }

/**
 * A settle like crm.settle_request_counts over an in-memory table, answered when the test says:
 * `others` holds what other processes settled, by window and user.
 */
function fakeDatabase() {
  const table = new Map<string, number>()
  const others = new Map<string, number>()
  const key = (windowStart: number, user: string) => `${windowStart} ${user}`
  const calls: Call[] = []
  const waiting: Call[] = []
  let onCall: (() => void) | null = null
  let auto = false
  const settle: SettleRequestCounts = (windowStart, userIds, counts) =>
    new Promise((resolve, reject) => {
      const call: Call = {
        windowStart: windowStart.getTime(),
        counts: Object.fromEntries(userIds.map((user, i) => [user, counts[i]])),
        answer: (fail) => {
          waiting.splice(waiting.indexOf(call), 1)
          if (fail) return reject(fail)
          const totals = new Map<string, number>()
          userIds.forEach((user, i) => {
            const k = key(call.windowStart, user)
            table.set(k, (table.get(k) ?? 0) + counts[i])
            totals.set(user, (table.get(k) ?? 0) + (others.get(k) ?? 0))
          })
          resolve(totals)
        },
      }
      calls.push(call)
      waiting.push(call)
      onCall?.()
      if (auto) queueMicrotask(() => call.answer())
    })
  return {
    settle,
    calls,
    /** The settlement in flight (at most one). */
    inFlight: () => {
      if (waiting.length > 1) throw new Error('more than one settlement in flight')
      return waiting[0] as Call | undefined
    },
    nextCall: () => new Promise<void>((resolve) => (onCall = resolve)),
    /** From now on every settlement is answered as soon as it is made (the one in flight too). */
    answerAll: () => {
      auto = true
      waiting[0]?.answer()
    },
    settled: (windowStart: number, user: string) => table.get(key(windowStart, user)) ?? 0,
    setOthers: (windowStart: number, user: string, n: number) => others.set(key(windowStart, user), n),
  }
}

function setup(options: { limit?: number; batch?: number; intervalMs?: number } = {}) {
  const db = fakeDatabase()
  let time = T0 + 10_000
  const errors: unknown[] = []
  const limiter = createRequestRateLimit({
    limit: options.limit ?? 10,
    batch: options.batch ?? 3,
    intervalMs: options.intervalMs ?? 3_600_000,
    settle: db.settle,
    now: () => time,
    onError: (error) => errors.push(error),
  })
  return {
    db,
    limiter,
    errors,
    setTime: (to: number) => {
      time = to
    },
  }
}

const waits = (answer: RateQuota | Promise<RateQuota>): Promise<RateQuota> => {
  if (!(answer instanceof Promise)) throw new Error('expected the request to wait')
  return answer
}

const synchronous = (answer: RateQuota | Promise<RateQuota>): RateQuota => {
  if (answer instanceof Promise) throw new Error('expected an answer without waiting')
  return answer
}

t.test('admissions answer at once until the batch is full; the batch settles at once; the next request waits for it', async (t) => {
  const { db, limiter } = setup({ limit: 10, batch: 3 })
  t.teardown(() => limiter.stop())
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 9, resetSeconds: 50 })
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 8, resetSeconds: 50 })
  t.equal(db.calls.length, 0, 'nothing settled below the batch')
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 7, resetSeconds: 50 })
  t.same(
    db.calls.map((call) => call.counts),
    [{ [ALICE]: 3 }],
    'the full batch starts a settlement',
  )
  const waiting = limiter.admit(ALICE)
  t.ok(waiting instanceof Promise, 'the fourth request waits')
  t.same(synchronous(limiter.admit(BOB)), { limit: 10, remaining: 9, resetSeconds: 50 }, 'another user does not')
  db.setOthers(T0, ALICE, 2)
  db.inFlight()?.answer()
  t.same(await waiting, { limit: 10, remaining: 4, resetSeconds: 50 }, 'decided with the total (3 + 2 elsewhere) and itself')
  t.same(limiter.observe(ALICE, 0, 50), { limit: 10, remaining: 4, resetSeconds: 50 }, 'a lower total changes nothing')
})

t.test('refused once the settled total and the unsettled count reach the limit, with the quota and the message', async (t) => {
  const { db, limiter } = setup({ limit: 10, batch: 3 })
  t.teardown(() => limiter.stop())
  db.setOthers(T0, ALICE, 6)
  for (let i = 0; i < 3; i++) synchronous(limiter.admit(ALICE))
  const fourth = limiter.admit(ALICE)
  db.inFlight()?.answer()
  t.same(await fourth, { limit: 10, remaining: 0, resetSeconds: 50 }, 'the total is 9: the tenth request passes')
  let refusal: unknown
  try {
    limiter.admit(ALICE)
  } catch (error) {
    refusal = error
  }
  t.ok(refusal instanceof RateLimitedError, 'refused synchronously, without a round trip')
  t.match(refusal, {
    code: 'rate_limited',
    message: 'More than 10 requests in this minute',
    retryAfterSeconds: 50,
    quota: { limit: 10, remaining: 0, resetSeconds: 50 },
  })
  t.equal(db.calls.length, 1)
  db.answerAll()
  await limiter.flush()
  t.equal(db.settled(T0, ALICE), 4, 'every admitted request settled once')
})

t.test('a request waiting on a full batch is refused when the settlement shows the limit reached', async (t) => {
  const { db, limiter } = setup({ limit: 10, batch: 3 })
  t.teardown(() => limiter.stop())
  db.setOthers(T0, ALICE, 8)
  for (let i = 0; i < 3; i++) synchronous(limiter.admit(ALICE))
  const waiting = [waits(limiter.admit(ALICE)), waits(limiter.admit(ALICE))]
  db.inFlight()?.answer()
  await t.rejects(waiting[0], RateLimitedError)
  await t.rejects(waiting[1], RateLimitedError)
})

t.test('one settlement carries every user with unsettled counts; at most one is in flight', async (t) => {
  const { db, limiter } = setup({ limit: 100, batch: 2 })
  t.teardown(() => limiter.stop())
  synchronous(limiter.admit(BOB))
  synchronous(limiter.admit(ALICE))
  synchronous(limiter.admit(ALICE))
  t.same(db.calls.at(-1)?.counts, { [BOB]: 1, [ALICE]: 2 })
  synchronous(limiter.admit(BOB))
  t.equal(db.calls.length, 1, "Bob's full batch waits for the settlement in flight")
  const next = db.nextCall()
  db.inFlight()?.answer()
  await next
  t.same(db.calls.at(-1)?.counts, { [BOB]: 1 }, 'and goes as soon as it returns')
  db.answerAll()
  await limiter.flush()
  t.equal(db.settled(T0, BOB), 2)
  t.equal(db.settled(T0, ALICE), 2)
})

t.test('a failed settlement keeps its counts for the next; the requests waiting on it get 503', async (t) => {
  const { db, limiter, errors } = setup({ limit: 100, batch: 3 })
  t.teardown(() => limiter.stop())
  for (let i = 0; i < 3; i++) synchronous(limiter.admit(ALICE))
  const waiting = waits(limiter.admit(ALICE))
  const down = new Error('connection terminated')
  db.inFlight()?.answer(down)
  await t.rejects(waiting, UnavailableError, 'the waiting request: unavailable')
  t.same(errors, [down], 'reported once')
  t.equal(db.settled(T0, ALICE), 0)
  const flushed = limiter.flush()
  t.same(db.inFlight()?.counts, { [ALICE]: 3 }, 'the same counts again')
  db.inFlight()?.answer()
  await flushed
  t.equal(db.settled(T0, ALICE), 3, 'counted once: none lost, none twice')
  t.same(synchronous(limiter.admit(ALICE)), { limit: 100, remaining: 96, resetSeconds: 50 })
  const failing = limiter.flush()
  db.inFlight()?.answer(new Error('again'))
  await t.rejects(failing, /again/, 'flush says when it could not settle')
  const retried = limiter.flush()
  db.inFlight()?.answer()
  await retried
  t.equal(db.settled(T0, ALICE), 4)
})

t.test('unsettled requests never exceed the batch, whatever the database does', async (t) => {
  // What a process holds and has not settled is all a crash can lose: at most one batch per user.
  const { db, limiter } = setup({ limit: 1000, batch: 5 })
  t.teardown(() => limiter.stop())
  const answers = Array.from({ length: 20 }, () => limiter.admit(ALICE))
  t.equal(answers.filter((answer) => !(answer instanceof Promise)).length, 5, 'five admitted at once')
  t.same(
    db.calls.map((call) => call.counts),
    [{ [ALICE]: 5 }],
    'fifteen wait for the settlement that never answers',
  )
  db.answerAll()
  for (const answer of answers) if (answer instanceof Promise) await answer
  await limiter.flush()
  t.equal(db.settled(T0, ALICE), 20, 'once it answers, the rest pass in batches and everything settles')
})

t.test('at the minute, the old window settles into its own window and is let go', async (t) => {
  const { db, limiter, setTime } = setup({ limit: 10, batch: 5 })
  t.teardown(() => limiter.stop())
  setTime(T0 + 59_500)
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 9, resetSeconds: 1 }, 'resetSeconds is at least 1')
  synchronous(limiter.admit(ALICE))
  setTime(T0 + MINUTE + 200)
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 9, resetSeconds: 60 }, 'a new window, counted afresh')
  const flushed = limiter.flush()
  t.same(db.inFlight() && { windowStart: db.inFlight()?.windowStart, counts: db.inFlight()?.counts }, {
    windowStart: T0,
    counts: { [ALICE]: 2 },
  })
  db.inFlight()?.answer()
  await db.nextCall()
  t.same({ windowStart: db.inFlight()?.windowStart, counts: db.inFlight()?.counts }, { windowStart: T0 + MINUTE, counts: { [ALICE]: 1 } })
  db.inFlight()?.answer()
  await flushed
  t.equal(db.settled(T0, ALICE), 2)
  t.equal(db.settled(T0 + MINUTE, ALICE), 1)
  const calls = db.calls.length
  await limiter.flush()
  t.equal(db.calls.length, calls, 'nothing of the old window is left to settle')
})

t.test('a window that ended is settled while the next runs, and dropped (said) when it is too old to settle', async (t) => {
  const { db, limiter, setTime, errors } = setup({ limit: 10, batch: 5 })
  t.teardown(() => limiter.stop())
  synchronous(limiter.admit(ALICE))
  synchronous(limiter.admit(BOB))
  const first = limiter.flush()
  db.inFlight()?.answer(new Error('down'))
  await t.rejects(first)
  setTime(T0 + 2 * MINUTE + 1)
  synchronous(limiter.admit(ALICE))
  t.equal(errors.length, 2, 'the failure, then the drop')
  t.match(String(errors[1]), /2 request counts of the window 2026-01-15T12:00:00.000Z could not be settled in time/)
  const flushed = limiter.flush()
  t.same(
    { windowStart: db.inFlight()?.windowStart, counts: db.inFlight()?.counts },
    { windowStart: T0 + 2 * MINUTE, counts: { [ALICE]: 1 } },
  )
  db.inFlight()?.answer()
  await flushed
  t.equal(db.calls.length, 2, 'the stale window was not sent')
})

t.test('observe raises the view to a total the database counted itself', async (t) => {
  const { db, limiter, setTime } = setup({ limit: 10, batch: 3 })
  t.teardown(() => limiter.stop())
  synchronous(limiter.admit(ALICE))
  t.same(limiter.observe(ALICE, 7, 50), { limit: 10, remaining: 2, resetSeconds: 50 }, '7 counted in the database, 1 here unsettled')
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 1, resetSeconds: 50 })
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 0, resetSeconds: 50 }, 'the tenth')
  t.throws(() => limiter.admit(ALICE), RateLimitedError, 'the eleventh is refused')
  t.equal(db.calls.length, 1, 'the full batch went to be settled')
  // The database's clock already in the next minute (60 s left there, 1 s here): not this window.
  setTime(T0 + 59_500)
  t.same(limiter.observe(BOB, 9, 60), { limit: 10, remaining: 1, resetSeconds: 60 }, "another window's total is only answered")
  t.same(synchronous(limiter.admit(BOB)), { limit: 10, remaining: 9, resetSeconds: 1 }, 'and not taken for this one')
})

t.test('a request the database counted is admitted against the unsettled requests too', async (t) => {
  const { db, limiter } = setup({ limit: 10, batch: 3 })
  t.teardown(() => limiter.stop())
  synchronous(limiter.admit(ALICE))
  synchronous(limiter.admit(ALICE))
  // The database counted 7 (this request among them) and cannot see the 2 unsettled here.
  t.same(synchronous(limiter.admitCounted(ALICE, 7, 50)), { limit: 10, remaining: 1, resetSeconds: 50 }, '7 + 2 of 10')
  t.same(synchronous(limiter.admitCounted(ALICE, 8, 50)), { limit: 10, remaining: 0, resetSeconds: 50 }, 'the tenth')
  t.throws(() => limiter.admitCounted(ALICE, 9, 50), RateLimitedError, 'the eleventh is refused, though the database counted 9')
  t.equal(db.calls.length, 0)
})

t.test('a settlement in flight when the database answered: decided after it, counted once', async (t) => {
  const { db, limiter } = setup({ limit: 10, batch: 3 })
  t.teardown(() => limiter.stop())
  for (let i = 0; i < 3; i++) synchronous(limiter.admit(ALICE))
  t.same(db.inFlight()?.counts, { [ALICE]: 3 }, 'the full batch is being settled')
  // Whether the database's 10 holds those 3 depends on when each committed: wait for the settlement.
  const decided = waits(limiter.admitCounted(ALICE, 10, 50))
  db.inFlight()?.answer()
  t.same(await decided, { limit: 10, remaining: 0, resetSeconds: 50 }, 'the tenth: the 3 in the total, not counted again')
  t.throws(() => limiter.admit(ALICE), RateLimitedError)
})

t.test('a request the database counted before a larger settled total: the view holds both', async (t) => {
  const { db, limiter } = setup({ limit: 10, batch: 3 })
  t.teardown(() => limiter.stop())
  for (let i = 0; i < 3; i++) synchronous(limiter.admit(ALICE))
  // Read before the settlement committed: the database's 2 lacks its 3, the settlement's 3 lacks this request.
  const decided = waits(limiter.admitCounted(ALICE, 2, 50))
  db.inFlight()?.answer()
  t.same(await decided, { limit: 10, remaining: 6, resetSeconds: 50 }, '3 settled, 1 counted before them, and this one')
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 5, resetSeconds: 50 })
})

t.test('a settlement whose snapshot had not seen a counted request’s transaction end: the view keeps that request', async (t) => {
  // crm.settle_request_counts answers the snapshot its totals were read with; transaction 7 holds
  // the count of a request crm.authenticate counted and the process admitted.
  const answers: { total: number; snapshot: string }[] = []
  const limiter = createRequestRateLimit({
    limit: 10,
    batch: 2,
    intervalMs: 3_600_000,
    now: () => T0 + 10_000,
    settle: async (_windowStart, userIds) => {
      const answer = answers.shift() as { total: number; snapshot: string }
      return Object.assign(new Map([[userIds[0], answer.total]]), { snapshot: parseSnapshot(answer.snapshot) })
    },
  })
  t.teardown(() => limiter.stop())
  t.same(synchronous(limiter.admitCounted(ALICE, 1, 50, 7n)), { limit: 10, remaining: 9, resetSeconds: 50 })
  // Read while 7 was open: the 2 settled, without the request 7 holds.
  answers.push({ total: 2, snapshot: '7:8:7' })
  synchronous(limiter.admit(ALICE))
  synchronous(limiter.admit(ALICE))
  await limiter.flush()
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 6, resetSeconds: 50 }, '2 settled, the open one, and this one')
  // Read after 7 committed: the total holds it, and it is not added twice.
  answers.push({ total: 5, snapshot: '9:9:' })
  synchronous(limiter.admit(ALICE))
  await limiter.flush()
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 4, resetSeconds: 50 }, '5 settled, and this one')
  // A request whose transaction (8) committed before that snapshot (a single statement commits
  // before its answer), counted as the 4th when it read: the 5 holds it, so it is not added again.
  t.same(
    synchronous(limiter.admitCounted(ALICE, 4, 50, 8n)),
    { limit: 10, remaining: 4, resetSeconds: 50 },
    '5 settled, and the one unsettled',
  )
})

t.test('pg_snapshot text: which transactions it saw end', async (t) => {
  const snapshot = parseSnapshot('100:105:100,103')
  t.same(
    [99n, 100n, 101n, 103n, 104n, 105n, 200n].map((transaction) => snapshot.sawEnd(transaction)),
    [true, false, true, false, true, false, false],
  )
  t.throws(() => parseSnapshot('not one'), /not a pg_snapshot/)
})

t.test('a released admission counts once, before or after a settlement carried it', async (t) => {
  const { db, limiter } = setup({ limit: 10, batch: 3 })
  t.teardown(() => limiter.stop())
  synchronous(limiter.admit(ALICE))
  limiter.release(ALICE)
  t.same(synchronous(limiter.admit(ALICE)), { limit: 10, remaining: 9, resetSeconds: 50 }, 'taken back before it was settled')
  synchronous(limiter.admit(ALICE))
  synchronous(limiter.admit(ALICE))
  t.same(db.inFlight()?.counts, { [ALICE]: 3 })
  limiter.release(ALICE)
  db.inFlight()?.answer()
  await limiter.flush()
  t.same(
    synchronous(limiter.admit(ALICE)),
    { limit: 10, remaining: 7, resetSeconds: 50 },
    'taken back after: 3 settled, 1 of them released',
  )
  for (let i = 0; i < 3; i++) synchronous(limiter.admit(ALICE))
  db.answerAll()
  await limiter.flush()
  t.equal(db.settled(T0, ALICE), 6, 'the next settlement carried one less')
})

t.test('the timer settles what is below the batch', async (t) => {
  const db = fakeDatabase()
  const limiter = createRequestRateLimit({ limit: 600, intervalMs: 10, settle: db.settle })
  t.teardown(() => limiter.stop())
  const called = db.nextCall()
  synchronous(limiter.admit(ALICE))
  // The limiter's timer is unref'd: something else keeps this process up while it waits.
  const keepAlive = setInterval(() => {}, 1000)
  await called
  clearInterval(keepAlive)
  t.same(db.inFlight()?.counts, { [ALICE]: 1 }, 'one request, settled by time')
  db.inFlight()?.answer()
})

t.test('the defaults and what is refused', async (t) => {
  const settle: SettleRequestCounts = async () => new Map()
  t.throws(() => createRequestRateLimit({ limit: 0, settle }), RangeError)
  t.throws(() => createRequestRateLimit({ limit: 10, batch: 11, settle }), RangeError)
  t.throws(() => createRequestRateLimit({ limit: 10, batch: 0, settle }), RangeError)
  t.throws(() => createRequestRateLimit({ limit: 10, intervalMs: 0, settle }), RangeError)
  // 600 a minute: a batch of 6 (1 %)
  const db = fakeDatabase()
  const limiter = createRequestRateLimit({ limit: 600, settle: db.settle })
  t.teardown(() => limiter.stop())
  for (let i = 0; i < 5; i++) synchronous(limiter.admit(ALICE))
  t.equal(db.calls.length, 0)
  synchronous(limiter.admit(ALICE))
  t.same(db.calls.at(-1)?.counts, { [ALICE]: 6 })
  db.inFlight()?.answer()
})

t.test('the timer keeps no process alive', async (t) => {
  const child = spawn(process.execPath, [fileURLToPath(new URL('../helpers/rate-limit-child.ts', import.meta.url)), 'idle'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  let output = ''
  child.stdout.on('data', (chunk: Buffer) => {
    output += chunk.toString()
  })
  const code = await new Promise((resolve) => child.once('exit', resolve))
  t.equal(code, 0, 'the process ended by itself')
  t.match(output, /admitted one, timer left running/)
})
