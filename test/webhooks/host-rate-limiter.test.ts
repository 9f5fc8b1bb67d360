// The per-host token bucket on a simulated clock: whatever the pattern of callers (bursts, pauses,
// several hosts, short and long waits), no host is granted more than the rate plus the bucket's
// burst in any one-second window, a caller refused had a wait longer than it accepts, and a host's
// grants never hold another host back. Timing on the real clock is left to
// test/webhooks/host-rate.test.ts, which checks the end to end spread and that nothing is dropped.
import fc from 'fast-check'
import t from 'tap'
import { HostRateLimiter } from '../../src/webhooks/host-rate-limiter.ts'

const call = fc.record({
  gapMs: fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 20 }), fc.integer({ min: 0, max: 3000 })),
  host: fc.constantFrom('a.example', 'b.example', 'c.example'),
  maxWaitMs: fc.oneof(fc.constant(Number.POSITIVE_INFINITY), fc.integer({ min: 0, max: 2000 })),
})

t.test('no host gets more than rate + burst grants in any one-second window', async (t) => {
  await fc.assert(
    fc.asyncProperty(fc.integer({ min: 1, max: 60 }), fc.array(call, { minLength: 1, maxLength: 300 }), async (rate, calls) => {
      let now = 0
      let slept = 0
      const limiter = new HostRateLimiter(rate, {
        now: () => now,
        sleep: async (ms) => {
          slept = ms
        },
      })
      const grants = new Map<string, number[]>()
      for (const { gapMs, host, maxWaitMs } of calls) {
        now += gapMs
        slept = 0
        const granted = await limiter.take(host, maxWaitMs)
        if (!granted) continue
        if (slept > maxWaitMs) return false
        grants.set(host, [...(grants.get(host) ?? []), now + slept])
      }
      const burst = Math.max(1, Math.ceil(rate / 10))
      for (const times of grants.values()) {
        times.sort((a, b) => a - b)
        for (let i = 0, j = 0; i < times.length; i++) {
          while (times[j] < times[i] - 999.999) j++
          if (i - j + 1 > rate + burst) return false
        }
      }
      return true
    }),
    { numRuns: 300 },
  )
  t.pass('held for 300 random patterns of callers')
})

t.test('a caller that would wait longer than it accepts is refused and takes nothing', async (t) => {
  const now = 0
  const limiter = new HostRateLimiter(10, { now: () => now, sleep: async () => {} })
  t.equal(await limiter.take('a.example', 0), true, 'the bucket starts with its burst of one token')
  t.equal(await limiter.take('a.example', 50), false, 'the next token is 100 ms away: refused at 50')
  t.equal(await limiter.take('a.example', 100), true, 'and granted at 100: the refusal took nothing')
  t.equal(await limiter.take('b.example', 0), true, 'another host has its own bucket')
})
