// One API process's rate limiter, alone in its own OS process, for test/auth/rate-limit*.test.ts.
// Started with child_process.fork; its clock stays at RATE_LIMIT_TEST_NOW (epoch ms, one minute
// for the whole test); argv[2] says what it does:
//   load <runtime url> <limit> <batch> <loops>   settles through the real database; on each
//       { user } message it fires admissions for that user from <loops> concurrent loops until
//       each is refused, flushes, and answers { admitted, refused, errors, source }
//   crash <runtime url> <batch> <user> <n>       admits n requests of the user one after another
//       (no timer settles: only full batches do), answers { admitted, source } and waits to be killed
//   idle                                         (spawned, no IPC) admits one request with a settle
//       that needs no database, never stops the limiter, and must end by itself
import { createRequestRateLimit, createSettleRequestCounts, type RequestRateLimit } from '../../src/auth/rate-limit.ts'
import { createDatabasePool } from '../../src/db/pool.ts'
import { RateLimitedError } from '../../src/errors.ts'

const [mode, ...args] = process.argv.slice(2)
const send = (message: unknown) => process.send?.(message)
const nextTurn = () => new Promise((resolve) => setImmediate(resolve))

if (mode === 'load') {
  const [url, limit, batch, loops] = [args[0], Number(args[1]), Number(args[2]), Number(args[3])]
  const pool = await createDatabasePool(url, { maxPoolSize: 2 })
  const settle = createSettleRequestCounts(pool)
  const settleErrors: string[] = []
  const frozen = Number(process.env.RATE_LIMIT_TEST_NOW)
  const limiter = createRequestRateLimit({
    limit,
    batch,
    intervalMs: 250,
    settle,
    now: () => frozen,
    onError: (error) => settleErrors.push(String(error)),
  })
  process.on('message', async (message: { user?: string; done?: boolean }) => {
    if (message.done) {
      limiter.stop()
      await pool.end()
      process.disconnect()
      return
    }
    const user = message.user as string
    let admitted = 0
    let refused = 0
    const errors: string[] = []
    await Promise.all(
      Array.from({ length: loops }, async () => {
        for (;;) {
          try {
            const quota = limiter.admit(user)
            if (quota instanceof Promise) await quota
            admitted++
          } catch (error) {
            if (error instanceof RateLimitedError) refused++
            else errors.push(String(error))
            return
          }
          // A request's own work: other loops (and the settlements) run meanwhile.
          await nextTurn()
        }
      }),
    )
    await limiter.flush()
    send({ admitted, refused, errors: [...errors, ...settleErrors], source: settle.source })
  })
  send({ ready: true })
} else if (mode === 'crash') {
  const [url, batch, user, n] = [args[0], Number(args[1]), args[2], Number(args[3])]
  const pool = await createDatabasePool(url, { maxPoolSize: 1 })
  const settle = createSettleRequestCounts(pool)
  const frozen = Number(process.env.RATE_LIMIT_TEST_NOW)
  const limiter: RequestRateLimit = createRequestRateLimit({ limit: 1_000_000, batch, intervalMs: 3_600_000, settle, now: () => frozen })
  let admitted = 0
  for (let i = 0; i < n; i++) {
    const quota = limiter.admit(user)
    if (quota instanceof Promise) await quota
    admitted++
  }
  send({ admitted, source: settle.source })
  // Kept alive by the IPC channel (a message listener refs it) until the parent kills it.
  process.on('message', () => {})
} else if (mode === 'idle') {
  const limiter = createRequestRateLimit({ limit: 10, batch: 5, intervalMs: 10, settle: async () => new Map() })
  limiter.admit('00000000-0000-4000-8000-000000000001')
  console.log('admitted one, timer left running')
} else {
  throw new Error(`rate-limit-child: unknown mode ${mode}`)
}
