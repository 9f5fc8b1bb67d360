// The CSV upload accepts the file either as the raw body or as the part named `file` of a
// multipart/form-data body (RFC 7578), which is what an HTML form or `curl -F file=@x.csv` sends.
// Only that one part is wanted, so this is a small extractor rather than a general parser:
// - the first part named `file` wins; other parts are skipped;
// - the part's own Content-Type is ignored (browsers send application/vnd.ms-excel for .csv);
// - the file name is reduced to its last path segment (old browsers send a full Windows path);
//   quotes in it may arrive backslash-escaped (curl) or as %22 (browsers, per the HTML spec);
//   `filename*=UTF-8''...` (RFC 5987) is preferred when present;
// - delimiters must use CRLF as the RFC requires; anything else is `malformed_multipart`.

export type UploadedFile = { fileName: string | null; bytes: Buffer }

export type UploadErrorCode = 'unsupported_media_type' | 'missing_boundary' | 'malformed_multipart' | 'missing_file_part'

export class UploadError extends Error {
  readonly code: UploadErrorCode
  constructor(code: UploadErrorCode, message: string) {
    super(message)
    this.name = 'UploadError'
    this.code = code
  }
}

export const FILE_PART_NAME = 'file'
const RAW_CSV_MEDIA_TYPES = new Set(['text/csv', 'application/csv', 'text/plain'])
const UTF8_CHARSETS = new Set(['utf-8', 'utf8', 'us-ascii'])
const CRLF = Buffer.from('\r\n')
const HEADER_END = Buffer.from('\r\n\r\n')

export function uploadFromRequest(contentType: string | undefined, body: Buffer): UploadedFile {
  const { mediaType, parameters } = parseHeaderValue(contentType ?? '')
  if (mediaType === 'multipart/form-data') return extractUploadedFile(contentType!, body)
  if (RAW_CSV_MEDIA_TYPES.has(mediaType)) {
    const charset = parameters.get('charset')?.toLowerCase()
    // A declared non-UTF-8 charset is refused up front: the bytes might still decode as UTF-8
    // and be imported garbled.
    if (charset !== undefined && !UTF8_CHARSETS.has(charset)) {
      throw new UploadError('unsupported_media_type', `Only UTF-8 CSV files are accepted (got charset=${charset})`)
    }
    return { fileName: null, bytes: body }
  }
  throw new UploadError(
    'unsupported_media_type',
    `Send the CSV file as multipart/form-data (a part named "${FILE_PART_NAME}") or as a text/csv body (got ${mediaType || 'no Content-Type'})`,
  )
}

export function extractUploadedFile(contentType: string, body: Buffer): UploadedFile {
  const boundary = parseHeaderValue(contentType).parameters.get('boundary')
  if (!boundary || boundary.length > 70) throw new UploadError('missing_boundary', 'The multipart/form-data Content-Type has no valid boundary parameter')
  const delimiter = Buffer.from(`--${boundary}`)
  const partSeparator = Buffer.concat([CRLF, delimiter])

  let position = firstDelimiter(body, delimiter)
  if (position === -1) throw malformed(`the body does not contain the boundary "${boundary}"`)
  position += delimiter.length
  for (;;) {
    if (body.subarray(position, position + 2).toString('latin1') === '--') break
    position = skipTransportPadding(body, position)
    if (!body.subarray(position, position + 2).equals(CRLF)) throw malformed('a boundary line does not end with CRLF')
    const headersStart = position + 2
    let headers = ''
    let contentStart = headersStart + 2
    // A part with no headers at all has its blank line right after the boundary line.
    if (!body.subarray(headersStart, headersStart + 2).equals(CRLF)) {
      const headersEnd = body.indexOf(HEADER_END, headersStart)
      if (headersEnd === -1) throw malformed('a part has no blank line after its headers')
      headers = body.subarray(headersStart, headersEnd).toString('utf8')
      contentStart = headersEnd + HEADER_END.length
    }
    const contentEnd = body.indexOf(partSeparator, contentStart)
    if (contentEnd === -1) throw malformed('the body ends before the closing boundary')
    const disposition = partDisposition(headers)
    if (disposition?.name === FILE_PART_NAME) return { fileName: disposition.fileName, bytes: body.subarray(contentStart, contentEnd) }
    position = contentEnd + partSeparator.length
  }
  throw new UploadError('missing_file_part', `The multipart/form-data body has no part named "${FILE_PART_NAME}"`)
}

function malformed(reason: string): UploadError {
  return new UploadError('malformed_multipart', `The multipart/form-data body is malformed: ${reason}`)
}

// The first delimiter may open the body or follow a preamble, where it must start a line.
function firstDelimiter(body: Buffer, delimiter: Buffer): number {
  if (body.subarray(0, delimiter.length).equals(delimiter)) return 0
  const afterCrlf = body.indexOf(Buffer.concat([CRLF, delimiter]))
  return afterCrlf === -1 ? -1 : afterCrlf + 2
}

function skipTransportPadding(body: Buffer, position: number): number {
  while (body[position] === 0x20 || body[position] === 0x09) position++
  return position
}

function partDisposition(headers: string): { name: string | undefined; fileName: string | null } | null {
  for (const line of headers.split('\r\n')) {
    const colon = line.indexOf(':')
    if (colon === -1 || line.slice(0, colon).trim().toLowerCase() !== 'content-disposition') continue
    const { mediaType, parameters } = parseHeaderValue(line.slice(colon + 1))
    if (mediaType !== 'form-data') return null
    return { name: parameters.get('name'), fileName: fileNameFrom(parameters) }
  }
  return null
}

function fileNameFrom(parameters: Map<string, string>): string | null {
  const extended = parameters.get('filename*')
  let name = extended === undefined ? undefined : decodeExtendedValue(extended)
  name ??= parameters.get('filename')?.replace(/%22/g, '"').replace(/%0D/gi, '\r').replace(/%0A/gi, '\n')
  if (name === undefined) return null
  const baseName = name.slice(Math.max(name.lastIndexOf('/'), name.lastIndexOf('\\')) + 1)
  return baseName === '' ? null : baseName
}

// RFC 5987 ext-value: charset'language'percent-encoded; only UTF-8 is worth supporting.
function decodeExtendedValue(value: string): string | undefined {
  const match = /^utf-8'[^']*'(.*)$/i.exec(value)
  if (!match) return undefined
  try {
    return decodeURIComponent(match[1])
  } catch {
    return undefined
  }
}

/**
 * Splits `type/subtype; key=value; key="quoted \"value\""` into a lower-cased media type and its
 * parameters (names lower-cased, values unquoted). Used for Content-Type and Content-Disposition.
 */
export function parseHeaderValue(header: string): { mediaType: string; parameters: Map<string, string> } {
  const parameters = new Map<string, string>()
  const semicolon = header.indexOf(';')
  const mediaType = (semicolon === -1 ? header : header.slice(0, semicolon)).trim().toLowerCase()
  let index = semicolon === -1 ? header.length : semicolon + 1
  while (index < header.length) {
    const equals = header.indexOf('=', index)
    const nextSemicolon = header.indexOf(';', index)
    if (equals === -1 || (nextSemicolon !== -1 && nextSemicolon < equals)) {
      index = nextSemicolon === -1 ? header.length : nextSemicolon + 1
      continue
    }
    const key = header.slice(index, equals).trim().toLowerCase()
    index = equals + 1
    while (header[index] === ' ' || header[index] === '\t') index++
    let value = ''
    if (header[index] === '"') {
      index++
      while (index < header.length && header[index] !== '"') {
        // Only \" and \\ are escapes: a Windows path from an old browser keeps its backslashes.
        if (header[index] === '\\' && (header[index + 1] === '"' || header[index + 1] === '\\')) index++
        value += header[index]
        index++
      }
      const end = header.indexOf(';', index)
      index = end === -1 ? header.length : end + 1
    } else {
      const end = header.indexOf(';', index)
      value = header.slice(index, end === -1 ? header.length : end).trim()
      index = end === -1 ? header.length : end + 1
    }
    if (key !== '' && !parameters.has(key)) parameters.set(key, value)
  }
  return { mediaType, parameters }
}
