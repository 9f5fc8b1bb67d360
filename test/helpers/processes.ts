// Real `crm serve --no-worker` and `crm worker` child processes for the reliability tests: start
// one, wait until it is ready, kill it with SIGKILL, start it again on the same port. Every line a
// child prints goes to CRM_TEST_LOG_DIR too, so test/run.ts scans it for secrets like the others.
import { type ChildProcess, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { appendFileSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { freePort } from '../../src/db/provision.ts'
import { TEST_APP_SECRET } from './server.ts'

const CLI = fileURLToPath(new URL('../../bin/crm.js', import.meta.url))

type Teardown = { teardown: (fn: () => unknown) => void }

export type CrmKind = 'api' | 'worker' | 'serve'

/**
 * How long a child may take to say it is ready before the test gives up on it: a bound on a
 * failure, not a wait. Started while other test files run (test/run.ts runs several at once) on a
 * busy machine, a child took more than 30 s.
 */
const READY_WITHIN_MS = 120_000

export type CrmProcess = {
  kind: CrmKind
  /** http://127.0.0.1:<port> for an API (the same port across restarts); '' for a worker. */
  url: string
  pid: () => number
  child: () => ChildProcess
  /** The last lines the process printed (stdout and stderr). */
  lines: string[]
  /** Lines (of all its lives) that match. */
  count: (pattern: RegExp) => number
  /** How many log lines at level error the process (all its lives) printed. */
  errorLines: () => string[]
  running: () => boolean
  /** SIGKILL, then wait for the exit. */
  kill9: () => Promise<void>
  /** SIGTERM (drain and stop cleanly), then wait; SIGKILL after `graceMs`. Returns the exit code. */
  stop: (graceMs?: number) => Promise<number | null>
  /** Start again with the same environment (and port), and wait until ready. */
  start: () => Promise<void>
  /** Resident set size of the live process in KiB (from /proc), or null. */
  rssKiB: () => number | null
}

export async function startCrm(
  t: Teardown,
  kind: CrmKind,
  options: { databaseUrl: string; env?: Record<string, string>; readyTimeoutMs?: number; count?: RegExp[] },
): Promise<CrmProcess> {
  const port = kind === 'worker' ? 0 : await freePort()
  const url = kind === 'worker' ? '' : `http://127.0.0.1:${port}`
  const args = kind === 'api' ? ['serve', '--no-worker'] : kind === 'serve' ? ['serve'] : ['worker']
  const env = {
    ...process.env,
    LOG_LEVEL: 'info',
    ...options.env,
    // A worker says it is ready at level info (its info output is a few lines); debug lists every job.
    ...(kind === 'worker' && options.env?.LOG_LEVEL !== 'debug' ? { LOG_LEVEL: 'info' } : {}),
    DATABASE_URL: options.databaseUrl,
    APP_SECRET: TEST_APP_SECRET,
    PORT: String(port),
    HOST: '127.0.0.1',
  }
  const logFile = process.env.CRM_TEST_LOG_DIR
    ? join(process.env.CRM_TEST_LOG_DIR, `${process.pid}-${kind}-${randomBytes(4).toString('hex')}.log`)
    : null
  const lines: string[] = []
  const errors: string[] = []
  let child: ChildProcess | null = null
  let exited: Promise<void> = Promise.resolve()

  let readyLines = 0
  const counters = new Map<RegExp, number>((options.count ?? []).map((pattern) => [pattern, 0]))
  const record = (line: string) => {
    if (!line) return
    for (const [pattern, n] of counters) if (pattern.test(line)) counters.set(pattern, n + 1)
    if (line.includes('CRM worker running')) readyLines++
    lines.push(line)
    if (lines.length > 300) lines.splice(0, lines.length - 300)
    if (line.includes('"level":"error"') || /^(Error|TypeError|node:)/.test(line)) errors.push(line)
    if (logFile) appendFileSync(logFile, line + '\n')
  }
  const pipeLines = (stream: NodeJS.ReadableStream | null) => {
    let rest = ''
    stream?.on('data', (chunk: Buffer) => {
      const parts = (rest + chunk.toString('utf8')).split('\n')
      rest = parts.pop() ?? ''
      for (const part of parts) record(part)
    })
    stream?.on('end', () => record(rest))
  }

  const running = () => child !== null && child.exitCode === null && child.signalCode === null

  const start = async () => {
    if (running()) throw new Error(`${kind} is already running`)
    const readyBefore = readyLines
    const spawned = spawn(process.execPath, [CLI, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] })
    child = spawned
    exited = new Promise<void>((resolve) => spawned.once('exit', () => resolve()))
    pipeLines(spawned.stdout)
    pipeLines(spawned.stderr)
    const deadline = Date.now() + (options.readyTimeoutMs ?? READY_WITHIN_MS)
    for (;;) {
      if (spawned.exitCode !== null || spawned.signalCode !== null) {
        throw new Error(
          `crm ${args.join(' ')} exited (${spawned.exitCode ?? spawned.signalCode}) before it was ready:\n${lines.slice(-20).join('\n')}`,
        )
      }
      if (kind === 'worker' ? readyLines > readyBefore : await healthy(url)) return
      if (Date.now() > deadline)
        throw new Error(
          `crm ${args.join(' ')} not ready within ${options.readyTimeoutMs ?? READY_WITHIN_MS} ms:\n${lines.slice(-20).join('\n')}`,
        )
      await sleep(50)
    }
  }

  const handle: CrmProcess = {
    kind,
    url,
    pid: () => child?.pid ?? 0,
    child: () => child as ChildProcess,
    lines,
    count: (pattern) => counters.get(pattern) ?? 0,
    errorLines: () => errors,
    running,
    kill9: async () => {
      if (!running()) return
      child!.kill('SIGKILL')
      await exited
    },
    stop: async (graceMs = 15_000) => {
      if (!running()) return child?.exitCode ?? null
      const current = child!
      current.kill('SIGTERM')
      const timer = setTimeout(() => current.kill('SIGKILL'), graceMs)
      await exited
      clearTimeout(timer)
      return current.exitCode
    },
    start,
    rssKiB: () => {
      if (!running()) return null
      try {
        const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${child!.pid}/status`, 'utf8'))
        return match ? Number(match[1]) : null
      } catch {
        return null
      }
    },
  }
  t.teardown(() => handle.kill9())
  await start()
  return handle
}

async function healthy(url: string): Promise<boolean> {
  try {
    const response = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2000) })
    await response.arrayBuffer()
    return response.status === 200
  } catch {
    return false
  }
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Polls `fn` until it returns something truthy; throws after `timeoutMs` naming `what`. */
export async function eventually<T>(
  what: string,
  fn: () => Promise<T | null | undefined | false>,
  timeoutMs = 30_000,
  everyMs = 100,
): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await fn().catch(() => null)
    if (value) return value
    if (Date.now() > deadline) throw new Error(`${what}: not met within ${timeoutMs} ms`)
    await sleep(everyMs)
  }
}

/** One query as the owner role on a fresh connection (survives a database restart in between). */
export async function ownerQuery<R extends pg.QueryResultRow = any>(url: string, text: string, values: unknown[] = []): Promise<R[]> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 5000 })
  client.on('error', () => {})
  await client.connect()
  try {
    return (await client.query<R>(text, values)).rows
  } finally {
    await client.end().catch(() => {})
  }
}
