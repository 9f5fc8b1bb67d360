// A route is declared once, with its typebox schemas: the same definition validates requests,
// runs the handler in the caller's transaction and feeds /api/openapi.json.
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { TSchema } from 'typebox'
import { Compile } from 'typebox/compile'
import type { Config } from '../config.ts'
import type { DatabasePool, DatabaseTransactionConnection } from '../db/pool.ts'
import type { Logger } from '../log.ts'
import type { Caller } from '../auth/authenticate.ts'
import { ValidationError, type FieldProblem } from '../errors.ts'

export type HttpMethod = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'

export type Services = {
  config: Config
  pool: DatabasePool
  logger: Logger
  /** Filled by the worker runner when it runs in this process; routes use it to add jobs. */
  [key: string]: unknown
}

export type RouteContext<Body = any> = {
  req: IncomingMessage
  res: ServerResponse
  requestId: string
  params: Record<string, string>
  query: Record<string, string | string[]>
  body: Body
  services: Services
  /** The request transaction, running as crm_api with the caller's context (auth routes only). */
  db: DatabaseTransactionConnection
  caller: Caller
}

/**
 * A response body that is already JSON text (rendered by PostgreSQL): sent as it is, not parsed
 * and stringified again.
 */
export class JsonText {
  readonly text: string
  constructor(text: string) {
    this.text = text
  }
}

export type RouteResult = { status?: number; body?: unknown; headers?: Record<string, string | undefined> } | void

export type AuthMode =
  /** bearer token or session cookie; the handler runs as crm_api in the caller's transaction */
  | 'required'
  /** no caller; the handler gets the pool (token endpoints, health) */
  | 'none'

export type RouteDefinition = {
  method: HttpMethod
  path: string
  summary: string
  tag: string
  auth: AuthMode
  /** JSON body schema (validated; unknown fields refused when the schema says so). */
  body?: TSchema
  /** Body handling: 'json' (default when body is set), 'raw' (the handler reads the stream itself). */
  bodyKind?: 'json' | 'raw'
  /** Success status and schema for the OpenAPI document. */
  status?: number
  response?: TSchema
  /** Extra documented query parameters, by name. */
  queryParameters?: Record<string, { description: string; schema: Record<string, unknown> }>
  /** Statuses this route may answer besides success, for the OpenAPI document. */
  errors?: number[]
  example?: { request?: unknown; response?: unknown }
  /**
   * The handler is a read that sends exactly one query: authentication travels inside that
   * statement, on a connection already running as crm_api, with no BEGIN/COMMIT (one round trip).
   * Such a handler must not read `caller` before its query.
   */
  singleStatement?: boolean
  /** The handler writes the response itself (streams); the framework must not. */
  streams?: boolean
  handler: (context: RouteContext) => Promise<RouteResult>
}

const validators = new WeakMap<TSchema, ReturnType<typeof Compile>>()

/** Validates a JSON value against a schema and turns failures into one 422 with a pointer per problem. */
export function validateBody<T>(schema: TSchema, value: unknown): T {
  let validator = validators.get(schema)
  if (!validator) {
    validator = Compile(schema)
    validators.set(schema, validator)
  }
  if (validator.Check(value)) return value as T
  const errors: FieldProblem[] = []
  for (const error of validator.Errors(value)) {
    if (error.keyword === 'boolean') continue // the additionalProperties twin of the entry below
    if (error.keyword === 'additionalProperties') {
      for (const name of (error.params as { additionalProperties: string[] }).additionalProperties) {
        errors.push({ pointer: `${error.instancePath}/${name}`, code: 'unknown_field', message: 'is not a known field' })
      }
      continue
    }
    if (error.keyword === 'required') {
      for (const name of (error.params as { requiredProperties?: string[] }).requiredProperties ?? []) {
        errors.push({ pointer: `${error.instancePath}/${name}`, code: 'required', message: 'is required' })
      }
      continue
    }
    errors.push({ pointer: error.instancePath || '/', code: error.keyword, message: error.message })
  }
  const first = errors[0]
  throw new ValidationError(first ? `${first.pointer.slice(1) || 'body'} ${first.message}` : 'The body is invalid', errors.slice(0, 50))
}

export function defineRoutes(...definitions: (RouteDefinition | RouteDefinition[])[]): RouteDefinition[] {
  return definitions.flat()
}

/** One partial update served under both PATCH and PUT (API.md: PUT is a partial update too). */
export function patchAndPut(definition: Omit<RouteDefinition, 'method'>): RouteDefinition[] {
  return [{ ...definition, method: 'PATCH' }, { ...definition, method: 'PUT' }]
}
