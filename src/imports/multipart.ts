// The CSV upload accepts the file either as the raw body or as the part named `file` of a
// multipart/form-data body (RFC 7578), which is what an HTML form or `curl -F file=@x.csv` sends.
// @fastify/busboy parses the multipart body while it arrives; only the file part is kept:
// - the first part named `file` wins; other parts are read past and dropped;
// - the part's own Content-Type is ignored (browsers send application/vnd.ms-excel for .csv);
// - the file name is reduced to its last path segment (old browsers send a full Windows path);
//   quotes in it may arrive backslash-escaped (curl) or as %22 (browsers, per the HTML spec);
// - the whole body counts against the limit, whatever part the bytes belong to;
// - a body of more than MAX_PARTS parts is refused as soon as the next part starts: 50 MiB of tiny
//   parts took 50 s of the parser and 80 MiB of heap, and no form sends more than a few fields. A
//   part's headers are bounded by the parser (80 KiB, 2,000 lines, the rest dropped).
import { once } from 'node:events'
import { Busboy, type BusboyInstance } from '@fastify/busboy'

export type UploadedFile = { fileName: string | null; bytes: Buffer }

export type UploadErrorCode =
  | 'unsupported_media_type'
  | 'payload_too_large'
  | 'missing_boundary'
  | 'malformed_multipart'
  | 'missing_file_part'
  | 'too_many_parts'

export class UploadError extends Error {
  readonly code: UploadErrorCode
  constructor(code: UploadErrorCode, message: string) {
    super(message)
    this.name = 'UploadError'
    this.code = code
  }
}

/** The request as far as an upload needs it: two headers and the body's chunks. */
export type UploadRequest = {
  headers: { 'content-type'?: string; 'content-length'?: string }
  body: AsyncIterable<Uint8Array>
}

export const FILE_PART_NAME = 'file'
/** The most parts a multipart/form-data upload may have: the file and a few form fields. */
export const MAX_PARTS = 20
const RAW_CSV_MEDIA_TYPES = new Set(['text/csv', 'application/csv', 'text/plain'])
const UTF8_CHARSETS = new Set(['utf-8', 'utf8', 'us-ascii'])
// RFC 2046 section 5.1.1.
const MAX_BOUNDARY_LENGTH = 70

type BodyOutcome =
  | { kind: 'file'; file: UploadedFile }
  | { kind: 'too_large' }
  | { kind: 'no_file_part' }
  | { kind: 'too_many_parts' }
  | { kind: 'malformed'; reason: string }

/**
 * What the headers say the body is: a multipart form or a raw UTF-8 CSV file. Throws UploadError
 * for anything else, so a wrong upload is refused before its body is read.
 */
export function uploadKindOf(headers: UploadRequest['headers']): 'multipart' | 'raw' {
  const contentType = headers['content-type'] ?? ''
  const mediaType = contentType.split(';')[0].trim().toLowerCase()
  if (mediaType === 'multipart/form-data') {
    const boundary = headerParameter(contentType, 'boundary')
    if (!boundary || boundary.length > MAX_BOUNDARY_LENGTH)
      throw new UploadError('missing_boundary', 'The multipart/form-data Content-Type has no valid boundary parameter')
    return 'multipart'
  }
  if (RAW_CSV_MEDIA_TYPES.has(mediaType)) {
    const charset = headerParameter(contentType, 'charset')?.toLowerCase()
    // A declared non-UTF-8 charset is refused up front: the bytes might still decode as UTF-8
    // and be imported garbled.
    if (charset !== undefined && !UTF8_CHARSETS.has(charset)) {
      throw new UploadError('unsupported_media_type', `Only UTF-8 CSV files are accepted (got charset=${charset})`)
    }
    return 'raw'
  }
  throw new UploadError(
    'unsupported_media_type',
    `Send the CSV file as multipart/form-data (a part named "${FILE_PART_NAME}") or as a text/csv body (got ${mediaType || 'no Content-Type'})`,
  )
}

/** Reads the uploaded file from the request body, up to `limit` bytes of body. Throws UploadError. */
export async function uploadFromRequest({ headers, body }: UploadRequest, limit: number): Promise<UploadedFile> {
  const declaredLength = Number(headers['content-length'])
  let outcome: BodyOutcome
  // A body declared larger than the limit is refused before a byte of it is read.
  if (Number.isFinite(declaredLength) && declaredLength > limit) outcome = { kind: 'too_large' }
  else if (uploadKindOf(headers) === 'multipart') outcome = await readFilePart(headers['content-type'] ?? '', body, limit)
  else outcome = await readWholeBody(body, limit)
  switch (outcome.kind) {
    case 'file':
      return outcome.file
    case 'too_large':
      throw new UploadError('payload_too_large', `The body is larger than ${limit} bytes`)
    case 'no_file_part':
      throw new UploadError('missing_file_part', `The multipart/form-data body has no part named "${FILE_PART_NAME}"`)
    case 'malformed':
      throw new UploadError('malformed_multipart', `The multipart/form-data body is malformed: ${outcome.reason}`)
    case 'too_many_parts':
      throw new UploadError(
        'too_many_parts',
        `The multipart/form-data body has more than ${MAX_PARTS} parts; send the file (part "${FILE_PART_NAME}") and at most a few fields`,
      )
  }
}

/** A parameter of a Content-Type header (`; name=value` or `; name="value"`), by its name in any case. */
function headerParameter(header: string, name: string): string | undefined {
  const match = new RegExp(`;\\s*${name}\\s*=\\s*(?:"([^"]*)"|([^;\\s]*))`, 'i').exec(header)
  return match ? (match[1] ?? match[2]) : undefined
}

async function readWholeBody(body: AsyncIterable<Uint8Array>, limit: number): Promise<BodyOutcome> {
  const chunks: Uint8Array[] = []
  let size = 0
  for await (const chunk of body) {
    size += chunk.length
    if (size > limit) return { kind: 'too_large' }
    chunks.push(chunk)
  }
  return { kind: 'file', file: { fileName: null, bytes: Buffer.concat(chunks, size) } }
}

/** Feeds the body to the parser as it arrives; only the file part's bytes are kept. */
async function readFilePart(contentType: string, body: AsyncIterable<Uint8Array>, limit: number): Promise<BodyOutcome> {
  let parser: BusboyInstance
  try {
    // Every part is a file stream to the parser, so no other part is buffered as a form field.
    parser = Busboy({ headers: { 'content-type': contentType }, isPartAFile: () => true, limits: { parts: MAX_PARTS } })
  } catch (error) {
    // The parser reads the Content-Type on its own terms (a boundary inside a quoted parameter is not one).
    return { kind: 'malformed', reason: reasonOf(error) }
  }
  let parseFailure: string | undefined
  let tooManyParts = false
  parser.on('error', (error) => {
    parseFailure ??= reasonOf(error)
  })
  // The parser would read past the rest of the parts one by one; reading stops instead.
  parser.on('partsLimit', () => {
    tooManyParts = true
  })
  let filePart: { name: string | undefined; chunks: Buffer[] } | undefined
  parser.on('file', (partName, stream, fileName) => {
    // A part cut short errors here and on the parser; the parser's error is the one reported.
    stream.on('error', () => {})
    if (partName !== FILE_PART_NAME || filePart) {
      stream.resume()
      return
    }
    const part = { name: fileName, chunks: [] as Buffer[] }
    filePart = part
    stream.on('data', (chunk: Buffer) => part.chunks.push(chunk))
  })
  const finished = new Promise<void>((resolve) => {
    parser.once('finish', resolve)
    parser.once('error', () => resolve())
  })

  let size = 0
  for await (const chunk of body) {
    size += chunk.length
    if (size > limit) return { kind: 'too_large' }
    if (!parser.write(chunk) && !parseFailure && !tooManyParts) await Promise.race([once(parser, 'drain').catch(() => {}), finished])
    if (tooManyParts) return { kind: 'too_many_parts' }
    if (parseFailure) break
  }
  if (!parseFailure) {
    parser.end()
    await finished
  }
  if (tooManyParts) return { kind: 'too_many_parts' }
  if (parseFailure) return { kind: 'malformed', reason: parseFailure }
  if (!filePart) return { kind: 'no_file_part' }
  return { kind: 'file', file: { fileName: fileNameOf(filePart.name), bytes: Buffer.concat(filePart.chunks) } }
}

function reasonOf(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).toLowerCase()
}

// The parser has unquoted the name and cut it to its last path segment; browsers percent-encode
// quotes and line breaks in it (the HTML spec's multipart/form-data encoding).
function fileNameOf(name: string | undefined): string | null {
  const decoded = name?.replace(/%22/g, '"').replace(/%0D/gi, '\r').replace(/%0A/gi, '\n')
  return decoded ? decoded : null
}
