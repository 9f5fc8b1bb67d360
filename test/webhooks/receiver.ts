// A real HTTP receiver on loopback for webhook tests: records every request (headers and raw
// bytes) and answers as the test says.
import { createServer, type IncomingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'

type Teardown = { teardown: (fn: () => unknown) => void }

export type Received = { path: string; headers: IncomingHttpHeaders; raw: Buffer; body: any; at: number }
export type Answer = {
  status?: number
  delayMs?: number
  /** Answers only once this settles: the test decides how long a delivery stays in flight. */
  hold?: Promise<unknown>
  body?: string
}

export type Receiver = {
  url: string
  received: Received[]
  /** Decides the answer per request; default 200. */
  answer: (request: Received) => Answer
  waitFor: (predicate: (received: Received[]) => boolean, timeoutMs?: number) => Promise<Received[]>
}

export async function startReceiver(t: Teardown): Promise<Receiver> {
  const receiver: Receiver = {
    url: '',
    received: [],
    answer: () => ({ status: 200 }),
    waitFor: async (predicate, timeoutMs = 15_000) => {
      const deadline = Date.now() + timeoutMs
      while (!predicate(receiver.received)) {
        if (Date.now() > deadline)
          throw new Error(`receiver: condition not met within ${timeoutMs} ms (${receiver.received.length} requests so far)`)
        await new Promise((resolve) => setTimeout(resolve, 20))
      }
      return receiver.received
    },
  }
  const server = createServer(async (req, res) => {
    const chunks: Buffer[] = []
    for await (const chunk of req) chunks.push(chunk as Buffer)
    const raw = Buffer.concat(chunks)
    let body: unknown = null
    try {
      body = JSON.parse(raw.toString('utf8'))
    } catch {}
    const request: Received = { path: req.url ?? '/', headers: req.headers, raw, body, at: Date.now() }
    receiver.received.push(request)
    const answer = receiver.answer(request)
    if (answer.delayMs) await new Promise((resolve) => setTimeout(resolve, answer.delayMs))
    if (answer.hold) await answer.hold
    res.statusCode = answer.status ?? 200
    res.end(answer.body ?? 'ok')
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  receiver.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  t.teardown(() => {
    server.closeAllConnections()
    return new Promise<void>((resolve) => server.close(() => resolve()))
  })
  return receiver
}

export const WEBHOOK_TEST_ENV = {
  WEBHOOK_ALLOW_HTTP: 'true',
  WEBHOOK_ALLOWED_CIDRS: '127.0.0.0/8',
  WEBHOOK_RETRY_SCHEDULE: '50ms,50ms,50ms,50ms,50ms,50ms',
  // Every test receiver is one loopback host: the per-host cap has its own test (host-rate.test.ts).
  WEBHOOK_HOST_RATE_PER_SECOND: '100000',
  // Tests poll state every 25 ms while they wait (waitUntil): on a loaded machine a wait can pass
  // the default 600 requests a minute. The rate limit has its own tests (test/auth/rate-limit*.test.ts).
  RATE_LIMIT_PER_MINUTE: '100000',
  LOG_LEVEL: 'warn',
}

export async function waitUntil<T>(fn: () => Promise<T | null | undefined | false>, timeoutMs = 15_000, what = 'condition'): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await fn()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`${what} not met within ${timeoutMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
}
