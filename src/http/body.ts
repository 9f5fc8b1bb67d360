// Request bodies are read as bytes with a hard limit (the socket is not drained past it), then
// parsed. JSON must be an object; anything else is a 4xx problem, never a 500.
import type { IncomingMessage } from 'node:http'
import { InvalidJsonError, PayloadTooLargeError, UnsupportedMediaTypeError } from '../errors.ts'

export const JSON_BODY_LIMIT = 1024 * 1024
export const CSV_BODY_LIMIT = 50 * 1024 * 1024

export async function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers['content-length'])
  if (Number.isFinite(declared) && declared > limit) throw new PayloadTooLargeError(limit)
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of req) {
    size += (chunk as Buffer).length
    if (size > limit) {
      req.pause()
      throw new PayloadTooLargeError(limit)
    }
    chunks.push(chunk as Buffer)
  }
  return Buffer.concat(chunks, size)
}

export function mediaType(req: IncomingMessage): string {
  return (req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase()
}

export async function readJsonObject(req: IncomingMessage): Promise<Record<string, unknown>> {
  const type = mediaType(req)
  const bytes = await readBody(req, JSON_BODY_LIMIT)
  if (bytes.length === 0 && type === '') return {}
  if (type !== 'application/json' && !type.endsWith('+json')) {
    throw new UnsupportedMediaTypeError(`Send JSON with Content-Type: application/json (got ${type || 'none'})`)
  }
  let text: string
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes)
  } catch {
    throw new InvalidJsonError('The body is not valid UTF-8')
  }
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch (error) {
    throw new InvalidJsonError((error as Error).message)
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new InvalidJsonError('The body must be a JSON object')
  return value as Record<string, unknown>
}
