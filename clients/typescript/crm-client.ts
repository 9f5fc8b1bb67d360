// The CRM API's client as a package: no dependency beyond Node 20's fetch and crypto, compiled to
// JavaScript and .d.ts (tsconfig.build.json). Resources per record type, pages and an async
// iterator over every page, problem details as CrmApiError, retries of 429, 503 and network
// errors with the same Idempotency-Key, a timeout, and webhook verification (webhooks.ts).
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
export type CallOptions = { idempotencyKey?: string; ifMatch?: string; signal?: AbortSignal }

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

export type RecordResource<R, C, U> = {
  create(body: C, options?: CallOptions): Promise<R>
  get(id: string, options?: CallOptions): Promise<R>
  update(id: string, body: U, options?: CallOptions): Promise<R>
  delete(id: string, options?: CallOptions): Promise<void>
  list(options?: ListOptions<R>): Promise<Page<R>>
  all(options?: Omit<ListOptions<R>, 'cursor'>): AsyncGenerator<R, void, undefined>
  search(q: string, options?: { limit?: number; cursor?: string }): Promise<Page<R>>
}

export type CrmClient = {
  contacts: RecordResource<Contact, ContactCreate, ContactUpdate>
  companies: RecordResource<Company, CompanyCreate, CompanyUpdate>
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
    list(options?: { after?: string; types?: (EventName | `${string}.*`)[]; limit?: number; wait?: number }): Promise<Page<WebhookEvent>>
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
      const signal = call.signal ? AbortSignal.any([call.signal, AbortSignal.timeout(timeoutMs)]) : AbortSignal.timeout(timeoutMs)
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

  function records<R, C, U>(path: string): RecordResource<R, C, U> {
    const listQuery = (list: ListOptions<R> = {}) => ({
      filter: list.filter,
      sort: Array.isArray(list.sort) ? list.sort.join(',') : list.sort,
      limit: list.limit,
      cursor: list.cursor,
    })
    const resource: RecordResource<R, C, U> = {
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
    }
    return resource
  }

  const subscriptions = '/api/webhook-subscriptions'
  return {
    contacts: records<Contact, ContactCreate, ContactUpdate>('/api/contacts'),
    companies: records<Company, CompanyCreate, CompanyUpdate>('/api/companies'),
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
    events: {
      list: (feed = {}) => request<Page<WebhookEvent>>('GET', '/api/events', { query: feed }),
    },
    request,
  }
}
