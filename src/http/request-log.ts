// Every request's id (the client's X-Request-Id when it is sane, else a new one, echoed back), its
// client address (TRUST_PROXY decides whether X-Forwarded-* count) and one log line when its
// answer is sent.
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Logger } from '../log.ts'
import { identifyClient } from './client-address.ts'

const SANE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

type LoggedRequest = IncomingMessage & { requestId: string; path: string; callerId?: string }

/** The middleware that gives each request its id and its log line. */
export function requestLog(
  logger: Logger,
  trustProxy: Parameters<typeof identifyClient>[1],
): (req: IncomingMessage, res: ServerResponse, next: () => void) => void {
  return (req, res, next) => {
    const request = req as LoggedRequest
    const started = performance.now()
    const given = req.headers['x-request-id']
    request.requestId = typeof given === 'string' && SANE_REQUEST_ID.test(given) ? given : randomUUID()
    res.setHeader('X-Request-Id', request.requestId)
    identifyClient(req, trustProxy)
    res.on('finish', () => {
      logger.info('request', {
        method: req.method,
        path: request.path,
        status: res.statusCode,
        ms: Math.round((performance.now() - started) * 10) / 10,
        request_id: request.requestId,
        user_id: request.callerId,
      })
    })
    next()
  }
}
