// The UI runs the API's own route handlers in its request transaction, so a form and its API route
// share validation, the address guard, plan gates and SQL: the screen cannot drift from the API.
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Caller } from '../auth/caller.ts'
import type { DatabaseTransactionConnection } from '../db/pool.ts'
import type { ReceivedFile } from '../http/body.ts'
import { type HttpMethod, JsonText, type RouteDefinition, requireRouteScope, type Services, validateBody } from '../http/route.ts'
import { takeRouteSlots } from '../http/workspace-slots.ts'

export type ApiCall = <T = any>(
  method: HttpMethod,
  path: string,
  options?: { params?: Record<string, string>; body?: unknown; query?: string; headers?: Record<string, string>; file?: ReceivedFile },
) => Promise<T>

export function apiCaller(
  definitions: RouteDefinition[],
  services: Services,
  db: DatabaseTransactionConnection,
  caller: Caller,
  req: IncomingMessage,
  res: ServerResponse,
  requestId: string,
): ApiCall {
  return async (method, path, options = {}) => {
    const definition = definitions.find((candidate) => candidate.method === method && candidate.path === path)
    if (!definition) throw new Error(`ui: no API route ${method} ${path}`)
    requireRouteScope(definition, caller)
    const body = definition.body ? validateBody(definition.body, options.body ?? {}) : undefined
    // Handlers that read the query string parse req.url: give them one of their own.
    // Request headers a form stands for (If-Match with the version the page showed) join the page's own.
    const request = Object.create(req, {
      url: { value: `${path}${options.query ? `?${options.query}` : ''}` },
      headers: { value: { ...req.headers, ...options.headers } },
    }) as IncomingMessage
    // The route's slots, as its router takes them: an export from a page counts like one from the API.
    const releases = takeRouteSlots(services.routeSlots, definition, caller.workspaceId)
    const result = await definition
      .handler({
        req: request,
        res,
        requestId,
        params: options.params ?? {},
        query: {},
        body,
        bodyFile: options.file,
        services,
        db,
        caller,
      })
      .finally(() => {
        for (const release of releases) release()
      })
    // A body already rendered as JSON text (record lists) is read back for the page's templates.
    const answer = result?.body
    return (answer instanceof JsonText ? JSON.parse(answer.text) : (answer ?? undefined)) as never
  }
}
