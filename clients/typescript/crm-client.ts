// The CRM API's client as a package: no dependency beyond Node 20's fetch and crypto, compiled to
// JavaScript and .d.ts (tsconfig.build.json). Resources per record type, pages and an async
// iterator over every page, batch calls, the events feed followed by long polling, problem details
// as CrmApiError, retries of 429, 503 and network errors with the same Idempotency-Key, a timeout,
// and webhook verification (webhooks.ts).
import type { components } from './schema.ts'

export { verifyWebhook, WebhookVerificationError } from './webhooks.ts'

type Schemas = components['schemas']
export type Contact = Schemas['Contact']
export type ContactCreate = Schemas['ContactCreate']
export type ContactUpdate = Schemas['ContactUpdate']
export type Company = Schemas['Company']
export type CompanyCreate = Schemas['CompanyCreate']
export type CompanyUpdate = Schemas['CompanyUpdate']
export type Deal = Schemas['Deal']
export type DealCreate = Schemas['DealCreate']
export type DealUpdate = Schemas['DealUpdate']
export type WebhookEvent = Schemas['WebhookEvent']
export type WebhookSubscription = Schemas['WebhookSubscription']
export type WebhookSubscriptionCreate = Schemas['WebhookSubscriptionCreate']
export type WebhookSubscriptionUpdate = Schemas['WebhookSubscriptionUpdate']
export type WebhookDelivery = Schemas['WebhookDelivery']
export type Problem = Schemas['Problem']
export type EventName = WebhookEvent['event']

/** The codes of docs/api.md section 2 (a string outside them is still accepted: a newer server's). */
export type ErrorCode =
  | 'invalid_json'
  | 'invalid_parameter'
  | 'token_missing'
  | 'token_invalid'
  | 'token_expired'
  | 'token_revoked'
  | 'user_suspended'
  | 'api_access_disabled'
  | 'invalid_credentials'
  | 'invalid_2fa_code'
  | 'challenge_expired'
  | 'plan_required'
  | 'forbidden'
  | 'insufficient_scope'
  | 'reauthentication_required'
  | 'not_found'
  | 'workspace_not_found'
  | 'request_timeout'
  | 'duplicate'
  | 'idempotency_conflict'
  | 'role_in_use'
  | 'member_owns_records'
  | 'delivery_not_finished'
  | 'import_already_started'
  | 'import_file_removed'
  | 'conflict'
  | 'precondition_failed'
  | 'payload_too_large'
  | 'unsupported_media_type'
  | 'validation_failed'
  | 'url_not_allowed'
  | 'seat_limit_reached'
  | 'rate_limited'
  | 'too_many_attempts'
  | 'internal_error'
  | 'unavailable'
  | 'network_error'
  | 'timeout'
  | (string & {})

/** An answer that is not 2xx (its problem details), a network failure or a timeout. */
export class CrmApiError extends Error {
  readonly status: number
  readonly code: ErrorCode
  readonly problem: Problem | undefined
  constructor(status: number, code: ErrorCode, message: string, problem?: Problem, cause?: unknown) {
    super(message, { cause })
    this.name = 'CrmApiError'
    this.status = status
    this.code = code
    this.problem = problem
  }
}

type Operators<V> = { eq?: V; ne?: V; gt?: V; gte?: V; lt?: V; lte?: V; in?: V[]; contains?: V }
/** `{ email: 'a@b.c' }` for equality, `{ amount: { gte: '1000' } }` for an operator. */
export type Filter<R> = { [F in keyof R]?: R[F] | string | null | Operators<NonNullable<R[F]> | string> }
/** A field, or a field with `-` for descending. */
export type SortField<R> = Extract<keyof R, string> | `-${Extract<keyof R, string>}`
export type ListOptions<R> = { filter?: Filter<R>; sort?: SortField<R> | SortField<R>[]; limit?: number; cursor?: string }
export type Page<T> = { data: T[]; next_cursor: string | null }
export type CallOptions = {
  idempotencyKey?: string
  ifMatch?: string
  signal?: AbortSignal
  /** This call's limit per attempt in milliseconds, instead of the client's timeoutMs. */
  timeoutMs?: number
}

/**
 * One input's result (docs/api.md section 5a), in input order: narrow on `status` for `data`
 * (`200`, `201`; each its own member, so `status === 200 || status === 201` narrows) or `problem` (what the single route would answer; `424` for the items of a failed
 * atomic batch that did not fail themselves).
 */
export type BatchItem<R> =
  | { index: number; status: 200; data: R; etag?: string }
  | { index: number; status: 201; data: R; etag?: string }
  | { index: number; status: 204 }
  | { index: number; status: 403 | 404 | 409 | 412 | 422 | 424; problem: Problem }
export type BatchResult<R> = { results: BatchItem<R>[]; counts: { succeeded: number; failed: number } }
/** Every batch route but read: `atomic: true` writes all or nothing (else 422 batch_failed, thrown). */
type BatchWrite = { atomic?: boolean }

/** `crm.contacts.batch` and the like: at most 100 inputs a call, one request, one transaction. */
export type BatchResource<R, C, U, M extends string> = {
  create(body: { inputs: C[] } & BatchWrite, options?: CallOptions): Promise<BatchResult<R>>
  /** `fields` keeps those (and `id`) in each item's data, typed so. */
  read<F extends Extract<keyof R, string> = Extract<keyof R, string>>(
    body: { ids: string[]; fields?: F[] },
    options?: CallOptions,
  ): Promise<BatchResult<Pick<R, Extract<F | 'id', keyof R>>>>
  update(body: { inputs: (U & { id: string; if_match?: string })[] } & BatchWrite, options?: CallOptions): Promise<BatchResult<R>>
  /** An update where a visible record has the `match_on` value (default `id`), else a create. */
  upsert(body: { inputs: (C & { id?: string })[]; match_on?: M } & BatchWrite, options?: CallOptions): Promise<BatchResult<R>>
  delete(body: { ids: string[] } & BatchWrite, options?: CallOptions): Promise<BatchResult<never>>
}

export type EventPattern = EventName | `${string}.*` | '*'
export type EventsListOptions = { after?: string; types?: EventPattern[]; limit?: number; wait?: number }
/** The events, one at a time, long-polling for more; `cursor`, read after handling an event, resumes after it. */
export type EventStream = AsyncGenerator<WebhookEvent, void, undefined> & { readonly cursor: string | undefined }

export type ClientOptions = {
  /** The service's origin, e.g. https://crm.example.com. */
  baseUrl: string
  /** A crm_... token, or an OAuth access token. */
  token: string
  /** The workspace's slug (X-Tenant-Slug), when the user has more than one. */
  workspace?: string
  /** Attempts after the first on 429, 503 and network errors (default 3). */
  retries?: number
  /** One attempt's limit in milliseconds (default 30000). */
  timeoutMs?: number
  /** Caps one wait between attempts, in seconds, whatever Retry-After says (default 30). */
  maxWaitSeconds?: number
  fetch?: typeof fetch
}

export type RecordResource<R, C, U, M extends string = 'id'> = {
  create(body: C, options?: CallOptions): Promise<R>
  get(id: string, options?: CallOptions): Promise<R>
  update(id: string, body: U, options?: CallOptions): Promise<R>
  delete(id: string, options?: CallOptions): Promise<void>
  list(options?: ListOptions<R>): Promise<Page<R>>
  all(options?: Omit<ListOptions<R>, 'cursor'>): AsyncGenerator<R, void, undefined>
  search(q: string, options?: { limit?: number; cursor?: string }): Promise<Page<R>>
  batch: BatchResource<R, C, U, M>
}

export type CrmClient = {
  contacts: RecordResource<Contact, ContactCreate, ContactUpdate, 'id' | 'email'>
  companies: RecordResource<Company, CompanyCreate, CompanyUpdate, 'id' | 'domain'>
  deals: RecordResource<Deal, DealCreate, DealUpdate>
  webhookSubscriptions: {
    create(body: WebhookSubscriptionCreate): Promise<WebhookSubscription & { secret: string }>
    get(id: string): Promise<WebhookSubscription>
    update(id: string, body: WebhookSubscriptionUpdate): Promise<WebhookSubscription>
    delete(id: string): Promise<void>
    list(options?: { limit?: number; cursor?: string }): Promise<Page<WebhookSubscription>>
    test(id: string, event?: EventName): Promise<WebhookDelivery>
  }
  events: {
    /** One page of the events feed (docs/api.md section 8a); pass next_cursor back as `after`. */
    list(options?: EventsListOptions, call?: Pick<CallOptions, 'signal'>): Promise<Page<WebhookEvent> & { next_cursor: string }>
    /**
     * Every event from `after` (or the oldest kept) on, then each new one as it commits: long polls
     * with `wait` (default 25 seconds) and never ends by itself; `break` or `signal` stops it. A
     * `410 cursor_expired` is thrown.
     */
    follow(options?: Omit<EventsListOptions, 'wait'> & { wait?: number; signal?: AbortSignal }): EventStream
  }
  /** Any route: the parsed JSON answer. */
  request<T>(method: string, path: string, options?: { query?: Record<string, unknown>; body?: unknown } & CallOptions): Promise<T>
}

/** The contract's query grammar: filter[field]=v, filter[field][op]=v, a list as one comma-separated value. */
function queryString(query: Record<string, unknown>): string {
  const params = new URLSearchParams()
  const add = (name: string, value: unknown): void => {
    if (value === undefined) return
    if (value === null) params.append(name, 'null')
    else if (Array.isArray(value)) params.append(name, value.join(','))
    else if (typeof value === 'object') for (const [key, inner] of Object.entries(value)) add(`${name}[${key}]`, inner)
    else params.append(name, String(value))
  }
  for (const [name, value] of Object.entries(query)) add(name, value)
  const text = params.toString()
  return text ? `?${text}` : ''
}

const RETRIED_STATUSES = new Set([429, 503])
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

export function createClient(options: ClientOptions): CrmClient {
  const base = options.baseUrl.replace(/\/$/, '')
  const send = options.fetch ?? globalThis.fetch
  const retries = options.retries ?? 3
  const timeoutMs = options.timeoutMs ?? 30_000
  const maxWait = options.maxWaitSeconds ?? 30

  async function request<T>(
    method: string,
    path: string,
    call: { query?: Record<string, unknown>; body?: unknown } & CallOptions = {},
  ): Promise<T> {
    const headers: Record<string, string> = { authorization: `Bearer ${options.token}`, accept: 'application/json' }
    if (options.workspace) headers['x-tenant-slug'] = options.workspace
    if (call.ifMatch) headers['if-match'] = call.ifMatch
    // Every POST carries a key, kept across retries, so a create that timed out is never made twice.
    if (method === 'POST') headers['idempotency-key'] = call.idempotencyKey ?? crypto.randomUUID()
    if (call.body !== undefined) headers['content-type'] = 'application/json'
    const url = `${base}${path}${queryString(call.query ?? {})}`
    for (let attempt = 0; ; attempt++) {
      let response: Response
      const limit = AbortSignal.timeout(call.timeoutMs ?? timeoutMs)
      const signal = call.signal ? AbortSignal.any([call.signal, limit]) : limit
      try {
        response = await send(url, { method, headers, body: call.body === undefined ? undefined : JSON.stringify(call.body), signal })
      } catch (error) {
        if (call.signal?.aborted) throw error
        const timedOut = error instanceof Error && error.name === 'TimeoutError'
        if (attempt < retries) {
          await sleep(Math.min(maxWait, 2 ** attempt) * 1000)
          continue
        }
        throw new CrmApiError(
          0,
          timedOut ? 'timeout' : 'network_error',
          `${method} ${path}: ${timedOut ? 'timed out' : 'network error'}`,
          undefined,
          error,
        )
      }
      if (RETRIED_STATUSES.has(response.status) && attempt < retries) {
        await response.body?.cancel()
        const seconds = Math.min(maxWait, Math.max(1, Number(response.headers.get('retry-after')) || 2 ** attempt))
        await sleep(seconds * 1000)
        continue
      }
      if (response.status === 204) return undefined as T
      const text = await response.text()
      const parsed: unknown = text ? JSON.parse(text) : undefined
      if (response.ok) return parsed as T
      const problem = parsed as Problem | undefined
      const message = problem?.detail ?? problem?.title ?? `${method} ${path} answered ${response.status}`
      throw new CrmApiError(response.status, problem?.code ?? 'http_error', message, problem)
    }
  }

  function batch<R, C, U, M extends string>(path: string): BatchResource<R, C, U, M> {
    const call =
      (operation: string) =>
      (body: unknown, options?: CallOptions): Promise<never> =>
        request('POST', `${path}/batch/${operation}`, { ...options, body })
    return { create: call('create'), read: call('read'), update: call('update'), upsert: call('upsert'), delete: call('delete') }
  }

  function records<R, C, U, M extends string = 'id'>(path: string): RecordResource<R, C, U, M> {
    const listQuery = (list: ListOptions<R> = {}) => ({
      filter: list.filter,
      sort: Array.isArray(list.sort) ? list.sort.join(',') : list.sort,
      limit: list.limit,
      cursor: list.cursor,
    })
    const resource: RecordResource<R, C, U, M> = {
      create: async (body, call) => (await request<{ data: R }>('POST', path, { ...call, body })).data,
      get: async (id, call) => (await request<{ data: R }>('GET', `${path}/${encodeURIComponent(id)}`, call)).data,
      update: async (id, body, call) => (await request<{ data: R }>('PATCH', `${path}/${encodeURIComponent(id)}`, { ...call, body })).data,
      delete: async (id, call) => {
        await request('DELETE', `${path}/${encodeURIComponent(id)}`, call)
      },
      list: (list) => request<Page<R>>('GET', path, { query: listQuery(list) }),
      async *all(list = {}) {
        let cursor: string | undefined
        do {
          const page = await resource.list({ ...list, cursor })
          yield* page.data
          cursor = page.next_cursor ?? undefined
        } while (cursor !== undefined)
      },
      search: (q, search = {}) => request<Page<R>>('GET', `${path}/search`, { query: { q, ...search } }),
      batch: batch<R, C, U, M>(path),
    }
    return resource
  }

  const listEvents: CrmClient['events']['list'] = (feed = {}, call = {}) =>
    // A long poll may hold the answer `wait` seconds: the attempt's limit covers it.
    request('GET', '/api/events', { query: feed, signal: call.signal, timeoutMs: timeoutMs + (feed.wait ?? 0) * 1000 })

  function followEvents({ signal, wait = 25, ...feed }: Parameters<CrmClient['events']['follow']>[0] = {}): EventStream {
    let cursor = feed.after
    async function* events(): AsyncGenerator<WebhookEvent, void, undefined> {
      while (!signal?.aborted) {
        let page: Page<WebhookEvent> & { next_cursor: string }
        try {
          page = await listEvents({ ...feed, after: cursor, wait }, { signal })
        } catch (error) {
          if (signal?.aborted) return
          throw error
        }
        // The page's cursor from its last event on: read after handling an event, it resumes after
        // that event (after one earlier in the page, it repeats the page's rest: at least once).
        if (page.data.length === 0) cursor = page.next_cursor
        for (const [index, event] of page.data.entries()) {
          if (index === page.data.length - 1) cursor = page.next_cursor
          yield event
        }
      }
    }
    return Object.defineProperty(events(), 'cursor', { get: () => cursor }) as EventStream
  }

  const subscriptions = '/api/webhook-subscriptions'
  return {
    contacts: records<Contact, ContactCreate, ContactUpdate, 'id' | 'email'>('/api/contacts'),
    companies: records<Company, CompanyCreate, CompanyUpdate, 'id' | 'domain'>('/api/companies'),
    deals: records<Deal, DealCreate, DealUpdate>('/api/deals'),
    webhookSubscriptions: {
      create: async (body) => (await request<{ data: WebhookSubscription & { secret: string } }>('POST', subscriptions, { body })).data,
      get: async (id) => (await request<{ data: WebhookSubscription }>('GET', `${subscriptions}/${id}`)).data,
      update: async (id, body) => (await request<{ data: WebhookSubscription }>('PATCH', `${subscriptions}/${id}`, { body })).data,
      delete: async (id) => {
        await request('DELETE', `${subscriptions}/${id}`)
      },
      list: (list = {}) => request<Page<WebhookSubscription>>('GET', subscriptions, { query: list }),
      test: async (id, event) =>
        (await request<{ data: WebhookDelivery }>('POST', `${subscriptions}/${id}/test`, { body: event ? { event } : {} })).data,
    },
    events: { list: listEvents, follow: followEvents },
    request,
  }
}
