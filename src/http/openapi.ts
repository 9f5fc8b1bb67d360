// /api/openapi.json is built from the route definitions themselves (the typebox schemas that
// validate requests), so the document cannot drift from what the API accepts and answers.
import { readFileSync } from 'node:fs'
import type { TSchema } from 'typebox'
import { SCOPE_DESCRIPTIONS, satisfyingScopes, type TokenScope } from '../auth/scopes.ts'
import type { RouteDefinition } from './route.ts'

type JsonObject = Record<string, unknown>

const VERSION = (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version

const STATUS_TEXT: Record<number, string> = {
  200: 'OK',
  201: 'Created',
  202: 'Accepted',
  204: 'No content',
  304: 'Not modified',
  400: 'A query parameter is malformed or names an unknown field (invalid_parameter), or the body is not JSON (invalid_json)',
  401: 'No, bad, expired or revoked credentials',
  402: 'The workspace plan does not include this feature',
  403: "The record is visible but the action is not allowed, an admin-only route (forbidden), or the token's scopes do not cover the route (insufficient_scope)",
  404: 'No such record, or not visible to this user',
  408: 'The client stopped sending its body (no byte for 10 s) or sent it too slowly',
  409: 'A unique value is taken (duplicate), or an Idempotency-Key was reused with a different request',
  410: 'The events feed cursor is older than the events kept (cursor_expired)',
  412: 'If-Match does not match the current ETag',
  413: 'The body is over its limit',
  415: 'Wrong Content-Type',
  422: 'The body fails validation',
  429: 'Too many requests (see Retry-After)',
  503: 'The database cannot be reached, or the server receives as many bodies at once as it takes (see Retry-After)',
}

const PROBLEM_SCHEMA = {
  type: 'object',
  description: 'RFC 9457 problem details',
  required: ['type', 'title', 'status', 'code', 'request_id'],
  properties: {
    type: { type: 'string', examples: ['/problems/validation_failed'] },
    title: { type: 'string' },
    status: { type: 'integer' },
    code: { type: 'string', description: 'A code from docs/api.md section 2' },
    detail: { type: 'string' },
    errors: {
      type: 'array',
      items: {
        type: 'object',
        required: ['pointer', 'code', 'message'],
        properties: { pointer: { type: 'string' }, code: { type: 'string' }, message: { type: 'string' } },
      },
    },
    request_id: { type: 'string' },
  },
}

/** A typebox schema as plain JSON Schema (typebox keeps its own markers in symbol keys). */
export function plainSchema(schema: TSchema): JsonObject {
  return JSON.parse(JSON.stringify(schema)) as JsonObject
}

function operationId(route: RouteDefinition): string {
  const words = route.path
    .replace(/^\/api\/?/, '')
    .split('/')
    .filter(Boolean)
    .map((part) => (part.startsWith(':') ? `by_${part.slice(1)}` : part.replace(/[^A-Za-z0-9]+/g, '_').replace(/^_+/, '')))
  return [route.method.toLowerCase(), ...words].join('_') || route.method.toLowerCase()
}

const RECORD_COLLECTION = /^\/api\/(contacts|companies|deals)$/
const RECORD_ITEM = /^\/api\/(contacts|companies|deals)\/:id$/

/** Request headers the records routes read, which the route definitions do not declare. */
function headerParameters(route: RouteDefinition): JsonObject[] {
  if (route.method === 'POST' && RECORD_COLLECTION.test(route.path)) {
    return [
      {
        name: 'Idempotency-Key',
        in: 'header',
        required: false,
        description: 'Up to 255 characters; the same POST again within 24 hours gets the first answer (Idempotent-Replayed: true)',
        schema: { type: 'string', maxLength: 255 },
      },
    ]
  }
  if ((route.method === 'PUT' || route.method === 'PATCH') && RECORD_ITEM.test(route.path)) {
    return [
      {
        name: 'If-Match',
        in: 'header',
        required: false,
        description: 'The ETag of the version you read; 412 when the record changed since',
        schema: { type: 'string' },
      },
    ]
  }
  if (route.method === 'GET' && RECORD_ITEM.test(route.path)) {
    return [
      {
        name: 'If-None-Match',
        in: 'header',
        required: false,
        description: 'An ETag; 304 when the record still has it',
        schema: { type: 'string' },
      },
    ]
  }
  return []
}

function responseHeaders(route: RouteDefinition, status: number): JsonObject | undefined {
  const headers: JsonObject = {}
  if (status === 201 && RECORD_COLLECTION.test(route.path)) {
    headers.Location = { description: 'The URL of the new record', schema: { type: 'string' } }
    headers['Idempotent-Replayed'] = {
      description: 'true when this is the stored answer to an earlier request with the same Idempotency-Key',
      schema: { type: 'string' },
    }
  }
  if (RECORD_ITEM.test(route.path) || (status === 201 && RECORD_COLLECTION.test(route.path))) {
    if (route.method !== 'DELETE') headers.ETag = { description: 'The version of the record (for If-Match)', schema: { type: 'string' } }
  }
  if (route.method === 'GET' && !RECORD_ITEM.test(route.path) && route.queryParameters?.cursor) {
    headers.Link = { description: '<url>; rel="next" when there is a next page', schema: { type: 'string' } }
  }
  return Object.keys(headers).length > 0 ? headers : undefined
}

/**
 * The scopes any one of which lets a token call the route (a write scope also satisfies its type's
 * read need); empty for a route every token may call. For security requirements (oauth2).
 */
export function routeScopes(route: RouteDefinition): TokenScope[] {
  return route.auth === 'required' ? satisfyingScopes(route.scope ?? 'none') : []
}

/** Every route that reads a body can answer 408 (body.ts's deadlines). */
const readsBody = (route: RouteDefinition) => route.body !== undefined || route.bodyKind === 'file' || route.formBody !== undefined
/** A JSON or file body is received under a receipt (src/http/upload-receipts.ts): 429 per address, 503 per process. */
const receivesUnderReceipt = (route: RouteDefinition) => route.body !== undefined || route.bodyKind === 'file'

/** The routes the document describes: the API, and the OAuth endpoints an app calls. */
const documented = (route: RouteDefinition) =>
  route.path.startsWith('/api/') || route.path.startsWith('/oauth/') || route.path.startsWith('/.well-known/')

function operation(route: RouteDefinition): JsonObject {
  const pathParameters = [...route.path.matchAll(/:([A-Za-z_]+)/g)].map((match) => ({
    name: match[1],
    in: 'path',
    required: true,
    schema: match[1] === 'id' || match[1].endsWith('_id') ? { type: 'string', format: 'uuid' } : { type: 'string' },
  }))
  const queryParameters = Object.entries(route.queryParameters ?? {}).map(([name, parameter]) => ({
    name,
    in: 'query',
    required: name === 'q',
    description: parameter.description,
    schema: parameter.schema,
    ...(parameter.schema.type === 'object' ? { style: 'deepObject', explode: true } : {}),
  }))
  const status = route.status ?? 200
  const success: JsonObject = { description: STATUS_TEXT[status] ?? 'Success' }
  if (status !== 204 && route.response) {
    success.content = {
      'application/json': {
        schema: plainSchema(route.response),
        ...(route.example?.response !== undefined ? { example: route.example.response } : {}),
      },
    }
  }
  const headers = responseHeaders(route, status)
  if (headers) success.headers = headers
  const responses: JsonObject = { [String(status)]: success }
  for (const error of route.errors ?? []) {
    // The OAuth endpoints answer their own refusals as RFC 6749 JSON; anything the framework
    // refuses before them (429, 408) is still problem details.
    responses[String(error)] =
      route.errorBody && (error === 400 || error === 401)
        ? { description: STATUS_TEXT[error] ?? 'Error', content: { 'application/json': { schema: plainSchema(route.errorBody) } } }
        : { $ref: `#/components/responses/Problem${error}` }
  }
  if (route.auth === 'required' && !responses['401']) responses['401'] = { $ref: '#/components/responses/Problem401' }
  if (routeScopes(route).length > 0 && !responses['403']) responses['403'] = { $ref: '#/components/responses/Problem403' }
  if (readsBody(route) && !responses['408']) responses['408'] = { $ref: '#/components/responses/Problem408' }
  if (receivesUnderReceipt(route)) {
    responses['429'] ??= { $ref: '#/components/responses/Problem429' }
    responses['503'] ??= { $ref: '#/components/responses/Problem503' }
  }
  responses['500'] = { $ref: '#/components/responses/Problem500' }

  const result: JsonObject = {
    operationId: operationId(route),
    summary: route.summary,
    tags: [route.tag],
    parameters: [...pathParameters, ...queryParameters, ...headerParameters(route)],
    responses,
    security: route.auth === 'required' ? [{ bearerAuth: [] }, { oauth2: routeScopes(route) }] : [],
  }
  if (route.formBody) {
    result.requestBody = {
      required: true,
      content: { 'application/x-www-form-urlencoded': { schema: plainSchema(route.formBody) } },
    }
  }
  // The scope a scoped token needs (docs/api.md section 4a): one name, or a list of which any one will do.
  if (route.auth === 'required') result['x-required-scope'] = route.scope === 'none' || route.scope === undefined ? null : route.scope
  // Which credentials may call a route that touches credentials (docs/decisions.md, "Credentials never widen").
  if (route.credentials) result['x-credentials'] = route.credentials
  if (route.body && route.bodyKind !== 'file') {
    result.requestBody = {
      required: true,
      content: {
        'application/json': {
          schema: plainSchema(route.body),
          ...(route.example?.request !== undefined ? { example: route.example.request } : {}),
        },
      },
    }
  }
  return result
}

export function buildOpenApiDocument(routes: RouteDefinition[], options: { serverUrl?: string } = {}): JsonObject {
  const paths: Record<string, JsonObject> = {}
  const statuses = new Set<number>([401, 500])
  for (const route of routes) {
    if (!documented(route)) continue
    const path = route.path.replace(/:([A-Za-z_]+)/g, '{$1}')
    paths[path] ??= {}
    paths[path][route.method.toLowerCase()] = operation(route)
    for (const error of route.errors ?? []) statuses.add(error)
    if (routeScopes(route).length > 0) statuses.add(403)
    if (readsBody(route)) statuses.add(408)
    if (receivesUnderReceipt(route)) for (const status of [429, 503]) statuses.add(status)
  }
  const problemResponses = Object.fromEntries(
    [...statuses].sort().map((status) => [
      `Problem${status}`,
      {
        description: STATUS_TEXT[status] ?? (status === 500 ? 'A bug: only request_id is reported' : 'Error'),
        content: { 'application/problem+json': { schema: { $ref: '#/components/schemas/Problem' } } },
      },
    ]),
  )
  const tags = [...new Set(routes.filter(documented).map((route) => route.tag))].sort().map((name) => ({ name }))
  return {
    openapi: '3.1.0',
    info: {
      title: 'CRM API',
      version: VERSION,
      description:
        'Multi-tenant CRM: contacts, companies, deals, associations, search, import/export and signed webhooks. Errors are RFC 9457 problem details.',
    },
    servers: [{ url: options.serverUrl ?? '/' }],
    tags,
    paths,
    components: {
      securitySchemes: {
        bearerAuth: { type: 'http', scheme: 'bearer', description: 'crm_... API token from POST /api/token' },
        oauth2: {
          type: 'oauth2',
          description:
            'Third-party apps (docs/api.md section 4a): authorization code with PKCE S256 for every client; access tokens live one hour, refresh tokens (offline_access) rotate at every use. Metadata: /.well-known/oauth-authorization-server.',
          flows: {
            authorizationCode: {
              authorizationUrl: `${options.serverUrl?.replace(/\/$/, '') ?? ''}/oauth/authorize`,
              tokenUrl: `${options.serverUrl?.replace(/\/$/, '') ?? ''}/oauth/token`,
              refreshUrl: `${options.serverUrl?.replace(/\/$/, '') ?? ''}/oauth/token`,
              scopes: SCOPE_DESCRIPTIONS,
            },
          },
        },
      },
      schemas: { Problem: PROBLEM_SCHEMA },
      responses: problemResponses,
    },
  }
}
