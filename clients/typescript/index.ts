// The CRM API's TypeScript client: openapi-fetch over the types generated from /api/openapi.json
// (schema.ts, `make client`), plus what the contract asks of every caller and the document cannot
// say: a bearer token and workspace on every request, an Idempotency-Key on creates, waiting out
// 429 with Retry-After, problem details as typed errors, and paging over next_cursor.
import createClient, { type Client } from 'openapi-fetch'
import type { components, paths } from './schema.ts'

export type { components, operations, paths } from './schema.ts'

export type Problem = components['schemas']['Problem']
export type CrmClient = Client<paths>

export type CrmClientOptions = {
  /** The service's origin, e.g. https://crm.example.com (paths start with /api). */
  baseUrl: string
  /** A crm_... token from POST /api/token, or an OAuth access token. */
  token?: string
  /** X-Tenant-Slug: the workspace, when the user has more than one. */
  workspace?: string
  /** How many times a 429 is waited out and the request sent again (default 3). */
  retries?: number
  /** Caps one wait, in seconds, whatever Retry-After says (default 60). */
  maxWaitSeconds?: number
  fetch?: (request: Request) => Promise<Response>
}

/** An answer that is not 2xx, as the API describes it (RFC 9457 problem details, docs/api.md section 2). */
export class ApiError extends Error {
  readonly status: number
  readonly code: string
  readonly problem: Problem

  constructor(problem: Problem) {
    super(problem.detail ? `${problem.title}: ${problem.detail}` : problem.title)
    this.name = 'ApiError'
    this.status = problem.status
    this.code = problem.code
    this.problem = problem
  }
}

// The creates that honour Idempotency-Key (docs/api.md section 5).
const IDEMPOTENT_CREATE = /^\/api\/(contacts|companies|deals)$/

export function createCrmClient(options: CrmClientOptions): CrmClient {
  const send = options.fetch ?? ((request: Request) => globalThis.fetch(request))
  const retries = options.retries ?? 3
  const maxWait = options.maxWaitSeconds ?? 60
  const client = createClient<paths>({
    baseUrl: options.baseUrl.replace(/\/$/, ''),
    querySerializer: serializeQuery,
    // A 429 is sent again after Retry-After, with the same Idempotency-Key, so a create is never
    // made twice however often it waits.
    fetch: async (request) => {
      for (let attempt = 0; ; attempt++) {
        const response = await send(request.clone())
        if (response.status !== 429 || attempt >= retries) return response
        await response.body?.cancel()
        const seconds = Math.min(maxWait, Math.max(1, Number(response.headers.get('retry-after')) || 1))
        await new Promise((resolve) => setTimeout(resolve, seconds * 1000))
      }
    },
  })
  client.use({
    onRequest({ request }) {
      if (options.token) request.headers.set('authorization', `Bearer ${options.token}`)
      if (options.workspace) request.headers.set('x-tenant-slug', options.workspace)
      if (request.method === 'POST' && IDEMPOTENT_CREATE.test(new URL(request.url).pathname) && !request.headers.has('idempotency-key')) {
        request.headers.set('idempotency-key', crypto.randomUUID())
      }
      return request
    },
  })
  return client
}

/**
 * The contract's query grammar (docs/api.md section 5): `filter[field]=v`, `filter[field][op]=v`, a list
 * (`in`) as one comma-separated value. openapi-fetch's own serializer stops at one level of nesting.
 */
export function serializeQuery(query: Record<string, unknown>): string {
  const params = new URLSearchParams()
  const add = (name: string, value: unknown): void => {
    if (value === undefined || value === null) return
    if (Array.isArray(value)) params.append(name, value.join(','))
    else if (typeof value === 'object') for (const [key, inner] of Object.entries(value)) add(`${name}[${key}]`, inner)
    else params.append(name, String(value))
  }
  for (const [name, value] of Object.entries(query)) add(name, value)
  return params.toString()
}

type Result<T> = { data?: T; error?: unknown; response: Response }

/** The answer's data, or its problem thrown as an ApiError. */
export async function unwrap<T>(pending: Promise<Result<T>>): Promise<T> {
  const { data, error, response } = await pending
  if (response.ok) return data as T
  throw new ApiError(isProblem(error) ? error : fallbackProblem(response, error))
}

/** Every item of a list, page after page, following next_cursor until it is null. */
export async function* paginate<Item>(
  page: (cursor: string | undefined) => Promise<Result<{ data: Item[]; next_cursor?: string | null }>>,
): AsyncGenerator<Item, void, undefined> {
  let cursor: string | undefined
  do {
    const { data, next_cursor } = await unwrap(page(cursor))
    yield* data
    cursor = next_cursor ?? undefined
  } while (cursor !== undefined)
}

// The upload and import answers have no schema in /api/openapi.json yet: their shape per docs/api.md
// section 6, the fields a caller needs.
export type ImportUpload = {
  id: string
  status: 'uploaded'
  row_count: number
  columns: string[]
  suggested_mapping: Record<string, string | null>
}
export type ImportJob = {
  id: string
  status: 'queued' | 'processing' | 'completed' | 'failed'
  counts: { total: number; created: number; updated: number; skipped: number; failed: number; companies_created: number }
  errors: { row: number; column: string | null; field: string | null; message: string }[]
}

/** Step 1 of an import: the file as a raw text/csv body (the document describes no body for it). */
export async function uploadCsv(
  client: CrmClient,
  type: 'contacts' | 'companies' | 'deals',
  csv: string | Uint8Array,
): Promise<ImportUpload> {
  const path = `/api/${type}/import/upload` as '/api/contacts/import/upload'
  const answer = await unwrap(
    client.POST(path, { body: csv, bodySerializer: (body: string | Uint8Array) => body, headers: { 'content-type': 'text/csv' } } as never),
  )
  return (answer as unknown as { data: ImportUpload }).data
}

function isProblem(value: unknown): value is Problem {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as Problem).code === 'string' &&
    typeof (value as Problem).status === 'number'
  )
}

// A non-2xx answer that is not problem+json (a proxy's page, say) still becomes an ApiError.
function fallbackProblem(response: Response, body: unknown): Problem {
  return {
    type: 'about:blank',
    title: response.statusText || `HTTP ${response.status}`,
    status: response.status,
    code: 'http_error',
    detail: typeof body === 'string' ? body.slice(0, 200) : undefined,
    request_id: response.headers.get('x-request-id') ?? '',
  }
}
