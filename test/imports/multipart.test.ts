import fc from 'fast-check'
import t from 'tap'
import { MAX_PARTS, UploadError, uploadFromRequest } from '../../src/imports/multipart.ts'
import { heapGrowthDuring, MiB } from '../helpers/heap.ts'

const BOUNDARY = '----WebKitFormBoundary7MA4YWxkTrZu0gW'
const CONTENT_TYPE = `multipart/form-data; boundary=${BOUNDARY}`

type Part = { disposition: string; contentType?: string; content: string | Buffer }

function multipartBody(parts: Part[], { boundary = BOUNDARY, preamble = '', epilogue = '' } = {}): Buffer {
  const chunks: Buffer[] = [Buffer.from(preamble ? `${preamble}\r\n` : '')]
  for (const part of parts) {
    let head = `--${boundary}\r\nContent-Disposition: ${part.disposition}\r\n`
    if (part.contentType) head += `Content-Type: ${part.contentType}\r\n`
    chunks.push(Buffer.from(`${head}\r\n`), Buffer.from(part.content), Buffer.from('\r\n'))
  }
  chunks.push(Buffer.from(`--${boundary}--\r\n${epilogue}`))
  return Buffer.concat(chunks)
}

type UploadOptions = { chunkSize?: number; limit?: number; contentLength?: string }

/** The body arrives in chunks of `chunkSize` bytes (7 by default), so delimiters straddle chunks. */
async function* chunked(bytes: Buffer, chunkSize: number): AsyncGenerator<Buffer> {
  for (let start = 0; start < bytes.length; start += chunkSize) yield bytes.subarray(start, start + chunkSize)
}

function upload(
  contentType: string | undefined,
  body: Buffer | string,
  { chunkSize = 7, limit = 1024 * 1024, contentLength }: UploadOptions = {},
) {
  const headers = { 'content-type': contentType, 'content-length': contentLength }
  return uploadFromRequest({ headers, body: chunked(Buffer.from(body), chunkSize) }, limit)
}

const extract = (body: Buffer | string, options?: UploadOptions) => upload(CONTENT_TYPE, body, options)

async function uploadError(run: () => Promise<unknown>): Promise<UploadError> {
  try {
    await run()
  } catch (error) {
    if (error instanceof UploadError) return error
    throw error
  }
  throw new Error('no error thrown')
}

const CSV_WITH_CRLF = 'First Name,Notes\r\nAnn,"two\r\nlines"\r\n'

t.test('the part named file is extracted byte for byte, CRLFs included', async (t) => {
  const body = multipartBody([
    { disposition: 'form-data; name="type"', content: 'contacts' },
    { disposition: 'form-data; name="file"; filename="contacts.csv"', contentType: 'text/csv', content: CSV_WITH_CRLF },
    { disposition: 'form-data; name="after"', content: 'ignored' },
  ])
  for (const chunkSize of [1, 7, body.length]) {
    const upload = await extract(body, { chunkSize })
    t.equal(upload.fileName, 'contacts.csv', `chunks of ${chunkSize} bytes`)
    t.equal(upload.bytes.toString('utf8'), CSV_WITH_CRLF, `chunks of ${chunkSize} bytes`)
  }
})

t.test('a file larger than the parser buffers arrives whole (backpressure)', async (t) => {
  const content = Buffer.alloc(1024 * 1024)
  for (let i = 0; i < content.length; i++) content[i] = (i * 7919) % 251
  const body = multipartBody([{ disposition: 'form-data; name="file"; filename="big.csv"', content }])
  const upload = await extract(body, { chunkSize: 64 * 1024, limit: 2 * 1024 * 1024 })
  t.ok(upload.bytes.equals(content))
})

t.test('binary content and a content ending in CRLF survive', async (t) => {
  const content = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('a,b\r\n1,2\r\n\r\n'), Buffer.from([0x00, 0xff, 0x2d, 0x2d])])
  const upload = await extract(multipartBody([{ disposition: 'form-data; name="file"; filename="x.csv"', content }]))
  t.same(upload.bytes, content)
})

t.test('file names', async (t) => {
  const nameOf = async (disposition: string) => (await extract(multipartBody([{ disposition, content: 'a\r\n' }]))).fileName
  t.equal(await nameOf('form-data; name="file"; filename="say \\"hi\\".csv"'), 'say "hi".csv', 'backslash-escaped quotes (curl)')
  t.equal(await nameOf('form-data; name="file"; filename="say %22hi%22.csv"'), 'say "hi".csv', 'percent-encoded quotes (browsers)')
  t.equal(await nameOf('form-data; name="file"; filename="a;b=c.csv"'), 'a;b=c.csv', '; and = inside quotes')
  t.equal(await nameOf('form-data; name="file"; filename="C:\\Users\\ann\\Desktop\\leads.csv"'), 'leads.csv', 'a full Windows path')
  t.equal(await nameOf('form-data; name="file"; filename="../../etc/passwd"'), 'passwd', 'no directories')
  t.equal(await nameOf('form-data; name="file"; filename="Société.csv"'), 'Société.csv', 'UTF-8 as browsers send it')
  t.equal(await nameOf('form-data; name="file"; filename*=UTF-8\'\'na%C3%AFve%20list.csv'), 'naïve list.csv', 'RFC 5987 filename*')
  t.equal(await nameOf('form-data; name=file; filename=plain.csv'), 'plain.csv', 'unquoted tokens')
  t.equal(await nameOf('form-data; name="file"'), null, 'no file name')
  t.equal(await nameOf('form-data; name="file"; filename=""'), null, 'an empty file name')
})

t.test('header names and values are matched leniently', async (t) => {
  const body = `preamble text\r\n--${BOUNDARY}\r\ncontent-disposition:form-data;name="file";filename="x.csv"\r\nX-Other: 1\r\n\r\nhello\r\n--${BOUNDARY}--`
  const lenient = await upload(`Multipart/Form-Data; charset=utf-8; BOUNDARY="${BOUNDARY}"`, body)
  t.equal(lenient.bytes.toString(), 'hello')
  t.equal(lenient.fileName, 'x.csv')
})

t.test('the first file part wins and an empty one is returned as empty', async (t) => {
  const body = multipartBody([
    { disposition: 'form-data; name="file"; filename=""', contentType: 'application/octet-stream', content: '' },
    { disposition: 'form-data; name="file"; filename="second.csv"', content: 'a\r\n' },
  ])
  const upload = await extract(body)
  t.equal(upload.fileName, null)
  t.equal(upload.bytes.length, 0)
})

t.test('parts without headers or with another disposition are skipped', async (t) => {
  const body = `--${BOUNDARY}\r\n\r\nno headers\r\n--${BOUNDARY}\r\nContent-Type: text/plain\r\n\r\nno disposition\r\n--${BOUNDARY}\r\nContent-Disposition: attachment; name="file"\r\n\r\nnot form-data\r\n--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"\r\n\r\nthis one\r\n--${BOUNDARY}--\r\n`
  t.equal((await extract(body)).bytes.toString(), 'this one')
})

t.test('a missing file part', async (t) => {
  const body = multipartBody([{ disposition: 'form-data; name="files"; filename="x.csv"', content: 'a\r\n' }])
  const error = await uploadError(() => extract(body))
  t.equal(error.code, 'missing_file_part')
  t.equal(error.name, 'UploadError')
  t.match(error.message, /no part named "file"/)
  t.equal((await uploadError(() => extract(multipartBody([])))).code, 'missing_file_part', 'no parts at all')
})

t.test('a missing or unusable boundary', async (t) => {
  t.equal((await uploadError(() => upload('multipart/form-data', ''))).code, 'missing_boundary')
  t.equal((await uploadError(() => upload('multipart/form-data; boundary=', ''))).code, 'missing_boundary')
  t.equal(
    (await uploadError(() => upload('multipart/form-data; charset; boundary', ''))).code,
    'missing_boundary',
    'parameters without values',
  )
  t.equal((await uploadError(() => upload(`multipart/form-data; boundary=${'x'.repeat(71)}`, ''))).code, 'missing_boundary')
})

t.test('a boundary the parser does not see in the Content-Type', async (t) => {
  const error = await uploadError(() => upload('multipart/form-data; note="x; boundary=y"', '--y\r\n\r\n--y--'))
  t.match(error, { code: 'malformed_multipart', message: /boundary not found/ })
})

t.test('any damage to a body ends in a file or an UploadError, never another error or a hang', async () => {
  const valid = multipartBody([
    { disposition: 'form-data; name="type"', content: 'contacts' },
    { disposition: 'form-data; name="file"; filename="x.csv"', contentType: 'text/csv', content: CSV_WITH_CRLF },
  ])
  const damage = fc.oneof(
    fc.record({ at: fc.nat(valid.length - 1), byte: fc.integer({ min: 0, max: 255 }) }).map(({ at, byte }) => {
      const copy = Buffer.from(valid)
      copy[at] = byte
      return copy
    }),
    fc.nat(valid.length).map((end) => valid.subarray(0, end)),
    fc.uint8Array({ maxLength: 200 }).map((bytes) => Buffer.concat([valid.subarray(0, 60), Buffer.from(bytes)])),
  )
  await fc.assert(
    fc.asyncProperty(damage, fc.integer({ min: 1, max: 64 }), async (body, chunkSize) => {
      try {
        await extract(body, { chunkSize })
      } catch (error) {
        if (!(error instanceof UploadError)) throw error
      }
    }),
    { numRuns: 500 },
  )
})

t.test('malformed bodies', async (t) => {
  const malformed = (body: string) => uploadError(() => extract(body))
  const bodies = {
    'no boundary anywhere': 'no boundary anywhere',
    'an empty body': '',
    'a boundary not at the start of a line': `x--${BOUNDARY}\r\n`,
    'delimiters ending in LF only': `--${BOUNDARY}\nContent-Disposition: form-data; name="file"\n\nbody\n--${BOUNDARY}--\n`,
    'no blank line after the headers': `--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"\r\n`,
    'no closing boundary': `--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"\r\n\r\ncut off`,
    'a body that stops after the boundary': `--${BOUNDARY}`,
  }
  for (const [label, body] of Object.entries(bodies)) {
    t.match(
      await malformed(body),
      { code: 'malformed_multipart', message: /^The multipart\/form-data body is malformed: unexpected end/ },
      label,
    )
  }
})

t.test('the body limit counts every byte of the body, and reading stops at it', async (t) => {
  const file = 'a,b\r\n1,2\r\n'
  const body = multipartBody([
    { disposition: 'form-data; name="file"; filename="x.csv"', content: file },
    { disposition: 'form-data; name="padding"', content: 'x'.repeat(1000) },
  ])
  t.equal((await extract(body, { limit: body.length })).bytes.toString(), file, 'a body of exactly the limit')
  const tooLarge = await uploadError(() => extract(body, { limit: body.length - 1 }))
  t.match(
    tooLarge,
    { code: 'payload_too_large', message: `The body is larger than ${body.length - 1} bytes` },
    'the bytes past the limit are in another part',
  )
  t.equal((await uploadError(() => upload('text/csv', file, { limit: file.length - 1 }))).code, 'payload_too_large', 'a raw body')

  let chunksRead = 0
  async function* endless() {
    for (;;) {
      chunksRead++
      yield Buffer.alloc(1000, 0x61)
    }
  }
  const endlessFile = uploadFromRequest({ headers: { 'content-type': CONTENT_TYPE }, body: endless() }, 10_000)
  t.equal((await uploadError(() => endlessFile)).code, 'payload_too_large')
  t.equal(chunksRead, 11, 'no chunk is read past the one that crosses the limit')

  const unread = (): AsyncIterable<Buffer> => ({
    [Symbol.asyncIterator]: () => {
      throw new Error('the body was read')
    },
  })
  for (const contentType of ['text/csv', CONTENT_TYPE]) {
    const declared = uploadFromRequest({ headers: { 'content-type': contentType, 'content-length': '10001' }, body: unread() }, 10_000)
    t.equal(
      (await uploadError(() => declared)).code,
      'payload_too_large',
      `${contentType}: a declared Content-Length over the limit is refused unread`,
    )
  }
})

t.test('uploadFromRequest', async (t) => {
  const csv = 'a,b\r\n1,2\r\n'
  for (const contentType of [
    'text/csv',
    'text/csv; charset=utf-8',
    'application/csv',
    'text/plain; charset="UTF-8"',
    'TEXT/CSV; charset=us-ascii',
  ]) {
    const raw = await upload(contentType, csv)
    t.equal(raw.fileName, null, contentType)
    t.equal(raw.bytes.toString(), csv, `${contentType}: the body itself`)
  }
  const body = multipartBody([{ disposition: 'form-data; name="file"; filename="up.csv"', content: 'a\r\n' }])
  t.same(await extract(body), { fileName: 'up.csv', bytes: Buffer.from('a\r\n') })

  for (const contentType of ['application/json', 'application/vnd.ms-excel', '', undefined]) {
    const error = await uploadError(() => upload(contentType, csv))
    t.equal(error.code, 'unsupported_media_type', String(contentType))
  }
  t.match((await uploadError(() => upload(undefined, csv))).message, /got no Content-Type/)
  t.match(await uploadError(() => upload('text/csv; charset=windows-1252', csv)), {
    code: 'unsupported_media_type',
    message: /charset=windows-1252/,
  })
  t.equal((await uploadError(() => upload('multipart/form-data', body))).code, 'missing_boundary')
})

t.test('a body of more parts than the cap is refused at the part past it, and reading stops there', async (t) => {
  const field = (index: number): Part => ({ disposition: `form-data; name="f${index}"`, content: 'v' })
  const filePart: Part = { disposition: 'form-data; name="file"; filename="x.csv"', content: 'a,b\r\n' }
  const fields = (count: number) => Array.from({ length: count }, (_, index) => field(index))
  t.equal((await extract(multipartBody([...fields(MAX_PARTS - 1), filePart]))).bytes.toString(), 'a,b\r\n', 'the cap itself')
  t.match(await uploadError(() => extract(multipartBody([...fields(MAX_PARTS), filePart]))), {
    code: 'too_many_parts',
    message: `The multipart/form-data body has more than ${MAX_PARTS} parts; send the file (part "file") and at most a few fields`,
  })

  // 50 MiB of tiny parts: the parser once read every one of them (50 s, 80 MiB of heap).
  const tiny = multipartBody([field(0)]).subarray(0, -`--${BOUNDARY}--\r\n`.length)
  const manyParts = Buffer.alloc(Math.floor((50 * MiB) / tiny.length) * tiny.length).fill(tiny)
  let chunksRead = 0
  async function* counted(bytes: Buffer) {
    for (let start = 0; start < bytes.length; start += 64 * 1024) {
      chunksRead++
      yield bytes.subarray(start, start + 64 * 1024)
    }
  }
  const { result, growthBytes } = await heapGrowthDuring(() =>
    uploadError(() => uploadFromRequest({ headers: { 'content-type': CONTENT_TYPE }, body: counted(manyParts) }, 50 * MiB)),
  )
  t.equal(result.code, 'too_many_parts')
  t.equal(chunksRead, 1, 'no chunk is read past the one holding the part past the cap')
  t.ok(growthBytes < 100 * MiB, `the heap grew by ${(growthBytes / MiB).toFixed(1)} MiB`)
})

t.test('50 MiB of one part header, of header lines or of preamble keep the heap bounded', async (t) => {
  const fileHead = `--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="x.csv"\r\n`
  const tail = `\r\na,b\r\n--${BOUNDARY}--\r\n`
  const fill = (pattern: string) => Buffer.alloc(50 * MiB - 500, pattern)
  const bodies = {
    'one header line': Buffer.concat([Buffer.from(`${fileHead}X-Pad: `), fill('a'), Buffer.from(`\r\n${tail}`)]),
    'header lines': Buffer.concat([Buffer.from(fileHead), fill('X: y\r\n'), Buffer.from(tail)]),
    preamble: Buffer.concat([fill('preamble\r\n'), Buffer.from(`\r\n${fileHead}${tail}`)]),
  }
  for (const [name, body] of Object.entries(bodies)) {
    const { result, growthBytes } = await heapGrowthDuring(() =>
      uploadFromRequest({ headers: { 'content-type': CONTENT_TYPE }, body: chunked(body, 64 * 1024) }, 50 * MiB).then(
        (file) => file.bytes.toString(),
        (error: unknown) => (error as UploadError).code,
      ),
    )
    t.equal(result, 'a,b', `${name}: the file part is read (the header past the parser's bound is dropped)`)
    t.ok(growthBytes < 100 * MiB, `${name}: the heap grew by ${(growthBytes / MiB).toFixed(1)} MiB`)
  }
})
