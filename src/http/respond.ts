// Writing an answer: a JSON body (or JSON text PostgreSQL rendered, sent as it is), and the one
// place an error becomes its problem+json answer, logged when it is the server's fault.
import type { IncomingMessage, ServerResponse } from 'node:http'
import { ClientWentAwayError } from '../errors.ts'
import type { Logger } from '../log.ts'
import { type ApiError, problemBody, toApiError } from './problem.ts'
import { JsonText } from './route.ts'

/** What the log line of a failed request names (set on the request by the app). */
type LoggedRequest = IncomingMessage & { requestId: string; path: string }

export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string | undefined> = {},
  contentType = 'application/json; charset=utf-8',
): void {
  if (res.headersSent) return
  const text = body === undefined ? '' : body instanceof JsonText ? body.text : JSON.stringify(body)
  res.statusCode = status
  for (const [name, value] of Object.entries(headers)) if (value !== undefined) res.setHeader(name, value)
  if (status !== 204 && status !== 304) {
    res.setHeader('Content-Type', contentType)
    res.setHeader('Content-Length', Buffer.byteLength(text))
    res.end(text)
  } else {
    res.end()
  }
}

export function sendProblem(res: ServerResponse, error: ApiError, requestId: string): void {
  if (res.headersSent) {
    // A stream already started: the only honest signal left is to cut the connection.
    res.destroy(error)
    return
  }
  for (const name of res.getHeaderNames()) if (!name.startsWith('ratelimit-') && name !== 'x-request-id') res.removeHeader(name)
  sendJson(res, error.status, problemBody(error, requestId), error.headers ?? {}, 'application/problem+json')
}

/** Answers any error of a request: a client gone is logged and its socket closed; a 5xx is logged with its cause. */
export function errorAnswerer(logger: Logger): (error: unknown, req: IncomingMessage, res: ServerResponse) => void {
  return (error, req, res) => {
    const request = req as LoggedRequest
    if (error instanceof ClientWentAwayError) {
      logger.info('client went away', { request_id: request.requestId, method: req.method, path: request.path, reason: error.message })
      res.destroy()
      return
    }
    const apiError = toApiError(error)
    if (apiError.status >= 500) {
      const cause = apiError.cause ?? error
      logger.error('request failed', {
        request_id: request.requestId,
        method: req.method,
        path: request.path,
        error: cause instanceof Error ? `${cause.name}: ${cause.message}` : String(cause),
        stack: cause instanceof Error && apiError.status === 500 ? cause.stack : undefined,
      })
    }
    sendProblem(res, apiError, request.requestId)
  }
}
