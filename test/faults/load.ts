// Mixed load for the reliability tests (faults, soak, scale): creates with an Idempotency-Key that
// are retried with the same key on connection errors and 503s, updates, reads, and (optionally)
// CSV imports, spread over one or more API processes. It remembers what the service confirmed, so
// a test can check afterwards that nothing confirmed was lost and nothing was written twice.
import { randomUUID } from 'node:crypto'

export type Outcome = { status: number; ms: number; error: string | null; body: any; headers: Headers | null }

export type KindStats = { count: number; statuses: Record<string, number>; latencies: number[] }

export type LoadOptions = {
  /** API base URLs; requests go round-robin. */
  urls: string[]
  token: string
  concurrency: number
  /** Weights of each action (creates, updates, reads, imports); imports need `importEveryMs`. */
  mix?: { create: number; update: number; read: number }
  /** One loop uploads and starts a CSV import of `importRows` contacts this often (soak). */
  importEveryMs?: number
  importRows?: number
  /** Per-request client deadline: a request that takes longer counts as a hang. */
  requestTimeoutMs?: number
  /** How long a create keeps retrying with its key before giving up. */
  createRetryForMs?: number
  /** Marks the records of this run (last_name prefix). */
  tag?: string
}

export class Load {
  readonly options: Required<Omit<LoadOptions, 'importEveryMs'>> & { importEveryMs: number }
  /** Idempotency-Key → id of the record the service confirmed with a 2xx. */
  readonly confirmed = new Map<string, string>()
  /** Keys whose create never got a 2xx within createRetryForMs. */
  readonly abandoned: string[] = []
  /** Every key sent at least once. */
  readonly keys = new Set<string>()
  /** Updates confirmed with a 2xx: record id and the job_title it set. */
  readonly updates: { id: string; value: string }[] = []
  /** Imports started (202): id and the emails in the file. */
  readonly imports: { id: string; emails: string[] }[] = []
  readonly stats = new Map<string, KindStats>()
  /** Answers that must never happen: 500s, and any 5xx other than 503 unavailable. */
  readonly unexpected: string[] = []
  /** Client-side timeouts (a request that hung). */
  hangs = 0
  retriedCreates = 0
  private next = 0
  private counter = 0
  private stopping = false
  private loops: Promise<void>[] = []

  constructor(options: LoadOptions) {
    this.options = {
      mix: { create: 4, update: 3, read: 3 },
      importRows: 25,
      requestTimeoutMs: 20_000,
      createRetryForMs: 60_000,
      tag: `load-${randomUUID().slice(0, 8)}`,
      ...options,
      importEveryMs: options.importEveryMs ?? 0,
    }
  }

  private url(): string {
    const urls = this.options.urls
    return urls[this.next++ % urls.length]
  }

  async request(
    kind: string,
    method: string,
    path: string,
    init: { body?: unknown; raw?: Buffer; headers?: Record<string, string> } = {},
  ): Promise<Outcome> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.options.token}`, ...init.headers }
    let body: string | Buffer | undefined = init.raw
    if (init.body !== undefined) {
      body = JSON.stringify(init.body)
      headers['content-type'] = 'application/json'
    }
    const started = performance.now()
    let outcome: Outcome
    try {
      const response = await fetch(this.url() + path, {
        method,
        headers,
        body: body as BodyInit | undefined,
        signal: AbortSignal.timeout(this.options.requestTimeoutMs),
      })
      const text = await response.text()
      let parsed: any = null
      try {
        parsed = text ? JSON.parse(text) : null
      } catch {}
      outcome = { status: response.status, ms: performance.now() - started, error: null, body: parsed, headers: response.headers }
    } catch (error) {
      const name = (error as Error).name
      const cause = (error as { cause?: { code?: string } }).cause
      const code = name === 'TimeoutError' || name === 'AbortError' ? 'timeout' : (cause?.code ?? (error as Error).message)
      if (code === 'timeout') this.hangs++
      outcome = { status: 0, ms: performance.now() - started, error: code, body: null, headers: null }
    }
    const stats = this.stats.get(kind) ?? { count: 0, statuses: {}, latencies: [] }
    this.stats.set(kind, stats)
    stats.count++
    const label = outcome.error ? `error:${outcome.error}` : String(outcome.status)
    stats.statuses[label] = (stats.statuses[label] ?? 0) + 1
    if (!outcome.error) stats.latencies.push(outcome.ms)
    if (outcome.status >= 500 && !(outcome.status === 503 && outcome.body?.code === 'unavailable' && outcome.headers?.get('retry-after'))) {
      this.unexpected.push(`${method} ${path} → ${outcome.status} ${JSON.stringify(outcome.body)?.slice(0, 300)}`)
    }
    return outcome
  }

  /** A create retried with the same key until it gets a 2xx (connection errors, 503, hangs). */
  async create(): Promise<void> {
    const key = `${this.options.tag}-${++this.counter}-${randomUUID().slice(0, 8)}`
    this.keys.add(key)
    const body = { first_name: 'Load', last_name: key }
    const deadline = Date.now() + this.options.createRetryForMs
    for (let attempt = 0; ; attempt++) {
      if (attempt > 0) this.retriedCreates++
      const outcome = await this.request('create', 'POST', '/api/contacts', { body, headers: { 'idempotency-key': key } })
      if (outcome.status === 201 || outcome.status === 200) {
        const previous = this.confirmed.get(key)
        if (previous && previous !== outcome.body.data.id)
          this.unexpected.push(`key ${key} answered two ids: ${previous} and ${outcome.body.data.id}`)
        this.confirmed.set(key, outcome.body.data.id)
        return
      }
      const retryable = outcome.error !== null || outcome.status === 503
      if (!retryable) {
        this.unexpected.push(`create ${key} → ${outcome.status} ${JSON.stringify(outcome.body)?.slice(0, 300)}`)
        return
      }
      if (Date.now() > deadline) {
        this.abandoned.push(key)
        return
      }
      await new Promise((resolve) => setTimeout(resolve, 100 + Math.random() * 200))
    }
  }

  private pick(): string | null {
    if (this.confirmed.size === 0) return null
    const ids = [...this.confirmed.values()]
    return ids[Math.floor(Math.random() * ids.length)]
  }

  async update(): Promise<void> {
    const id = this.pick()
    if (!id) return this.read()
    const value = `t-${++this.counter}`
    const outcome = await this.request('update', 'PATCH', `/api/contacts/${id}`, { body: { job_title: value } })
    if (outcome.status === 200) this.updates.push({ id, value })
    else if (outcome.error === null && outcome.status !== 503)
      this.unexpected.push(`update ${id} → ${outcome.status} ${JSON.stringify(outcome.body)?.slice(0, 300)}`)
  }

  async read(): Promise<void> {
    const id = this.pick()
    const outcome =
      id && Math.random() < 0.5
        ? await this.request('read', 'GET', `/api/contacts/${id}`)
        : await this.request('read', 'GET', `/api/contacts?limit=20&sort=-created_at`)
    if (outcome.error === null && outcome.status !== 200 && outcome.status !== 503)
      this.unexpected.push(`read → ${outcome.status} ${JSON.stringify(outcome.body)?.slice(0, 300)}`)
  }

  /** Upload a CSV of new contacts and start its import (the worker lands it). */
  async importOnce(): Promise<void> {
    const n = ++this.counter
    const emails = Array.from({ length: this.options.importRows }, (_, i) => `imp-${this.options.tag}-${n}-${i}@example.com`)
    const csv =
      ['First Name,Last Name,Email', ...emails.map((email, i) => `Imported,imp-${this.options.tag}-${n}-${i},${email}`)].join('\n') + '\n'
    const uploaded = await this.request('import-upload', 'POST', '/api/contacts/import/upload', {
      raw: Buffer.from(csv),
      headers: { 'content-type': 'text/csv' },
    })
    if (uploaded.status !== 201) {
      if (uploaded.error === null)
        this.unexpected.push(`import upload → ${uploaded.status} ${JSON.stringify(uploaded.body)?.slice(0, 300)}`)
      return
    }
    const started = await this.request('import-start', 'POST', `/api/contacts/import/${uploaded.body.data.id}`, {
      body: { mode: 'create' },
    })
    if (started.status === 202) this.imports.push({ id: uploaded.body.data.id, emails })
    else if (started.error === null) this.unexpected.push(`import start → ${started.status} ${JSON.stringify(started.body)?.slice(0, 300)}`)
  }

  start(): void {
    const { create, update, read } = this.options.mix
    const total = create + update + read
    for (let i = 0; i < this.options.concurrency; i++) {
      this.loops.push(
        (async () => {
          let lastImport = Date.now()
          while (!this.stopping) {
            if (i === 0 && this.options.importEveryMs > 0 && Date.now() - lastImport >= this.options.importEveryMs) {
              lastImport = Date.now()
              await this.importOnce()
              continue
            }
            const roll = Math.random() * total
            if (roll < create) await this.create()
            else if (roll < create + update) await this.update()
            else await this.read()
          }
        })(),
      )
    }
  }

  /** Stops starting new actions and waits for those in flight (creates finish their retries). */
  async stop(): Promise<void> {
    this.stopping = true
    await Promise.all(this.loops)
  }

  /** Requests answered (any status) and latency percentiles over every answered request. */
  summary(): {
    requests: number
    answered: number
    p50: number
    p99: number
    byKind: Record<string, { count: number; p50: number; p99: number; statuses: Record<string, number> }>
  } {
    const all: number[] = []
    const byKind: Record<string, { count: number; p50: number; p99: number; statuses: Record<string, number> }> = {}
    let requests = 0
    for (const [kind, stats] of this.stats) {
      requests += stats.count
      all.push(...stats.latencies)
      byKind[kind] = {
        count: stats.count,
        p50: percentile(stats.latencies, 50),
        p99: percentile(stats.latencies, 99),
        statuses: stats.statuses,
      }
    }
    return { requests, answered: all.length, p50: percentile(all, 50), p99: percentile(all, 99), byKind }
  }
}

export function percentile(values: number[], p: number): number {
  if (values.length === 0) return 0
  const sorted = [...values].sort((a, b) => a - b)
  const index = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  return Math.round(sorted[index] * 10) / 10
}
