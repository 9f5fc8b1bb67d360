// Request bodies are read as bytes with a hard limit (the socket is not drained past it), then
// parsed. JSON must be an object; anything else is a 4xx problem, never a 500.
//
// Every body is read against two deadlines (docs/api.md sections 2 and 9), so a client that sends
// slowly holds a socket for a bounded time and never a database connection:
// - idle: no byte for `idleTimeoutMs` (BODY_IDLE_TIMEOUT_MS, 10 s) answers 408;
// - rate: after a head start of `idleTimeoutMs`, the body must keep an average of
//   MIN_BODY_BYTES_PER_SECOND (64 KiB/s, half a megabit), so a 1 MiB JSON body has at most 26 s and
//   a 50 MiB upload at most 13 min 30 s; a trickle of one byte a second is cut after the head start.
import { createWriteStream } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import type { IncomingMessage } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { DEFAULT_BODY_IDLE_TIMEOUT_MS } from '../config.ts'
import { ClientWentAwayError, InvalidJsonError, PayloadTooLargeError, RequestTimeoutError, UnsupportedMediaTypeError } from '../errors.ts'

export const JSON_BODY_LIMIT = 1024 * 1024
export const CSV_BODY_LIMIT = 50 * 1024 * 1024
export const MIN_BODY_BYTES_PER_SECOND = 64 * 1024
/**
 * Objects and arrays nest at most this deep in a JSON body: deeper is 400 invalid_json before the
 * body is parsed, so no walk over a request value (validation, the handlers) meets more levels
 * than this. No request schema nests past 4.
 */
export const MAX_JSON_DEPTH = 64

/** The longest a body of `size` bytes may take under the rate deadline. */
export function bodyDeadlineMs(size: number, idleTimeoutMs: number): number {
  return idleTimeoutMs + (size * 1000) / MIN_BODY_BYTES_PER_SECOND
}

/**
 * The body's chunks as they arrive, up to `limit` bytes, under the idle and rate deadlines: throws
 * PayloadTooLargeError past the limit and RequestTimeoutError when a deadline passes. On either,
 * the request is paused, not drained; the answer closes the connection.
 */
export async function* bodyChunks(
  req: IncomingMessage,
  limit: number,
  idleTimeoutMs = DEFAULT_BODY_IDLE_TIMEOUT_MS,
): AsyncGenerator<Buffer, void, undefined> {
  const declared = Number(req.headers['content-length'])
  if (Number.isFinite(declared) && declared > limit) throw new PayloadTooLargeError(limit)
  const chunks = req[Symbol.asyncIterator]() as AsyncIterator<Buffer>
  const started = performance.now()
  let size = 0
  while (true) {
    const untilDeadline = started + bodyDeadlineMs(size, idleTimeoutMs) - performance.now()
    const idle = idleTimeoutMs <= untilDeadline
    let timer: NodeJS.Timeout | undefined
    const expired = new Promise<'expired'>((resolve) => {
      timer = setTimeout(() => resolve('expired'), Math.max(0, Math.min(idleTimeoutMs, untilDeadline)))
    })
    const next = await Promise.race([chunks.next(), expired])
      .catch((error: unknown) => {
        throw req.destroyed ? new ClientWentAwayError(error) : error
      })
      .finally(() => clearTimeout(timer))
    if (next === 'expired') {
      req.pause()
      throw new RequestTimeoutError(
        idle
          ? `No byte of the body arrived for ${idleTimeoutMs / 1000} s`
          : `The body arrived slower than ${MIN_BODY_BYTES_PER_SECOND / 1024} KiB/s after the first ${idleTimeoutMs / 1000} s`,
      )
    }
    if (next.done) return
    size += next.value.length
    if (size > limit) {
      req.pause()
      throw new PayloadTooLargeError(limit)
    }
    yield next.value
  }
}

export async function readBody(req: IncomingMessage, limit: number, idleTimeoutMs = DEFAULT_BODY_IDLE_TIMEOUT_MS): Promise<Buffer> {
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of bodyChunks(req, limit, idleTimeoutMs)) {
    size += chunk.length
    chunks.push(chunk)
  }
  return Buffer.concat(chunks, size)
}

export function mediaType(req: IncomingMessage): string {
  return (req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase()
}

export async function readJsonObject(req: IncomingMessage, idleTimeoutMs = DEFAULT_BODY_IDLE_TIMEOUT_MS): Promise<Record<string, unknown>> {
  const type = mediaType(req)
  const bytes = await readBody(req, JSON_BODY_LIMIT, idleTimeoutMs)
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
  if (jsonNestsDeeperThan(text, MAX_JSON_DEPTH)) {
    throw new InvalidJsonError(`The body nests objects and arrays deeper than ${MAX_JSON_DEPTH} levels`)
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

/**
 * Whether JSON text opens more than `max` objects and arrays inside one another, read in one pass
 * over the text without parsing it (brackets inside strings do not count). Text that is not JSON
 * may answer either way; JSON.parse refuses it next.
 */
export function jsonNestsDeeperThan(text: string, max: number): boolean {
  let depth = 0
  let inString = false
  for (let index = 0; index < text.length; index++) {
    const code = text.charCodeAt(index)
    if (inString) {
      if (code === 0x5c)
        index++ // a backslash escapes the next character
      else if (code === 0x22) inString = false
    } else if (code === 0x22) inString = true
    else if (code === 0x7b || code === 0x5b) {
      if (++depth > max) return true
    } else if (code === 0x7d || code === 0x5d) depth--
  }
  return false
}

/** The name every upload's temporary directory under os.tmpdir() starts with. */
export const UPLOAD_DIRECTORY_PREFIX = 'crm-upload-'

/** A body received whole into a private temporary file; `remove` deletes it and its directory. */
export type ReceivedFile = { path: string; size: number; remove: () => Promise<void> }

/**
 * Receives the whole body into a file under os.tmpdir(), under the limit and the deadlines, so a
 * slow upload spends a socket and disk, not memory or a database connection. The file is removed
 * when receiving fails; otherwise the caller removes it.
 */
export async function receiveBodyFile(
  req: IncomingMessage,
  limit: number,
  idleTimeoutMs: number,
  // An upload receipt's byte count (src/http/upload-receipts.ts), which throws past its cap.
  receipt?: { reserve: (bytes: number) => void },
): Promise<ReceivedFile> {
  const directory = await mkdtemp(join(tmpdir(), UPLOAD_DIRECTORY_PREFIX))
  const path = join(directory, 'body')
  const remove = () => rm(directory, { recursive: true, force: true })
  let size = 0
  const counted = async function* () {
    for await (const chunk of bodyChunks(req, limit, idleTimeoutMs)) {
      // Counted against the process's cap on temporary files before it is written.
      receipt?.reserve(chunk.length)
      size += chunk.length
      yield chunk
    }
  }
  try {
    await pipeline(Readable.from(counted()), createWriteStream(path, { mode: 0o600 }))
  } catch (error) {
    await remove()
    throw error
  }
  return { path, size, remove }
}
