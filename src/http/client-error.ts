// Requests Node's HTTP parser refuses before any route sees them (a request line and headers over
// 16 KiB, bytes that are not HTTP, a client too slow to send its headers) get a problem+json answer
// like every other error, instead of Node's bare status line.
import { randomUUID } from 'node:crypto'
import type { Duplex } from 'node:stream'

const ANSWERS: Record<string, [status: number, reason: string, code: string, detail: string]> = {
  HPE_HEADER_OVERFLOW: [431, 'Request Header Fields Too Large', 'payload_too_large', 'The request line and headers are over 16 KiB'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'Request Timeout', 'request_timeout', 'The request did not arrive in time'],
}
const MALFORMED: [number, string, string, string] = [400, 'Bad Request', 'invalid_parameter', 'The request is not well-formed HTTP']

export function answerClientError(error: Error & { code?: string }, socket: Duplex): void {
  // A connection the client already closed, or one whose answer has started: nothing more to say.
  const answering = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage
  if (error.code === 'ECONNRESET' || !socket.writable || answering?.headersSent) {
    socket.destroy()
    return
  }
  const [status, reason, code, detail] = ANSWERS[error.code ?? ''] ?? MALFORMED
  const requestId = randomUUID()
  const body = JSON.stringify({ type: `/problems/${code}`, title: reason, status, code, detail, request_id: requestId })
  socket.end(
    `HTTP/1.1 ${status} ${reason}\r\nContent-Type: application/problem+json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
      `X-Request-Id: ${requestId}\r\nConnection: close\r\n\r\n${body}`,
  )
}
