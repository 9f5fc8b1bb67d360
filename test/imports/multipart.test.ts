import t from 'tap'
import { extractUploadedFile, parseHeaderValue, uploadFromRequest, UploadError } from '../../src/imports/multipart.ts'

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

function uploadError(run: () => unknown): UploadError {
  try {
    run()
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
  const upload = extractUploadedFile(CONTENT_TYPE, body)
  t.equal(upload.fileName, 'contacts.csv')
  t.equal(upload.bytes.toString('utf8'), CSV_WITH_CRLF)
})

t.test('binary content and a content ending in CRLF survive', async (t) => {
  const content = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('a,b\r\n1,2\r\n\r\n'), Buffer.from([0x00, 0xff, 0x2d, 0x2d])])
  const upload = extractUploadedFile(CONTENT_TYPE, multipartBody([{ disposition: 'form-data; name="file"; filename="x.csv"', content }]))
  t.same(upload.bytes, content)
})

t.test('file names', async (t) => {
  const nameOf = (disposition: string) => extractUploadedFile(CONTENT_TYPE, multipartBody([{ disposition, content: 'a\r\n' }])).fileName
  t.equal(nameOf('form-data; name="file"; filename="say \\"hi\\".csv"'), 'say "hi".csv', 'backslash-escaped quotes (curl)')
  t.equal(nameOf('form-data; name="file"; filename="say %22hi%22.csv"'), 'say "hi".csv', 'percent-encoded quotes (browsers)')
  t.equal(nameOf('form-data; name="file"; filename="a;b=c.csv"'), 'a;b=c.csv', '; and = inside quotes')
  t.equal(nameOf('form-data; name="file"; filename="C:\\Users\\ann\\Desktop\\leads.csv"'), 'leads.csv', 'a full Windows path')
  t.equal(nameOf('form-data; name="file"; filename="../../etc/passwd"'), 'passwd', 'no directories')
  t.equal(nameOf('form-data; name="file"; filename="Société.csv"'), 'Société.csv', 'UTF-8 as browsers send it')
  t.equal(nameOf('form-data; name="file"; filename="fallback.csv"; filename*=UTF-8\'\'na%C3%AFve%20list.csv'), 'naïve list.csv', 'RFC 5987 filename*')
  t.equal(nameOf('form-data; name="file"; filename="fallback.csv"; filename*=ISO-8859-1\'\'x.csv'), 'fallback.csv', 'filename* in another charset')
  t.equal(nameOf('form-data; name="file"; filename="fallback.csv"; filename*=UTF-8\'\'%E0%A4%A.csv'), 'fallback.csv', 'broken filename*')
  t.equal(nameOf('form-data; name=file; filename=plain.csv'), 'plain.csv', 'unquoted tokens')
  t.equal(nameOf('form-data; name="file"'), null, 'no file name')
  t.equal(nameOf('form-data; name="file"; filename=""'), null, 'an empty file name')
})

t.test('header names and values are matched leniently', async (t) => {
  const body = Buffer.from(
    `preamble text\r\n--${BOUNDARY}  \r\ncontent-disposition:form-data;name="file";filename="x.csv"\r\nX-Other: 1\r\n\r\nhello\r\n--${BOUNDARY}--`,
  )
  const upload = extractUploadedFile(`Multipart/Form-Data; charset=utf-8; BOUNDARY="${BOUNDARY}"`, body)
  t.equal(upload.bytes.toString(), 'hello')
  t.equal(upload.fileName, 'x.csv')
})

t.test('the first file part wins and an empty one is returned as empty', async (t) => {
  const body = multipartBody([
    { disposition: 'form-data; name="file"; filename=""', contentType: 'application/octet-stream', content: '' },
    { disposition: 'form-data; name="file"; filename="second.csv"', content: 'a\r\n' },
  ])
  const upload = extractUploadedFile(CONTENT_TYPE, body)
  t.equal(upload.fileName, null)
  t.equal(upload.bytes.length, 0)
})

t.test('parts without headers or with another disposition are skipped', async (t) => {
  const body = Buffer.from(
    `--${BOUNDARY}\r\n\r\nno headers\r\n--${BOUNDARY}\r\nContent-Type: text/plain\r\n\r\nno disposition\r\n--${BOUNDARY}\r\nContent-Disposition: attachment; name="file"\r\n\r\nnot form-data\r\n--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"\r\n\r\nthis one\r\n--${BOUNDARY}--\r\n`,
  )
  t.equal(extractUploadedFile(CONTENT_TYPE, body).bytes.toString(), 'this one')
})

t.test('a missing file part', async (t) => {
  const body = multipartBody([{ disposition: 'form-data; name="files"; filename="x.csv"', content: 'a\r\n' }])
  const error = uploadError(() => extractUploadedFile(CONTENT_TYPE, body))
  t.equal(error.code, 'missing_file_part')
  t.equal(error.name, 'UploadError')
  t.match(error.message, /no part named "file"/)
  t.equal(uploadError(() => extractUploadedFile(CONTENT_TYPE, multipartBody([]))).code, 'missing_file_part', 'no parts at all')
})

t.test('a missing or unusable boundary', async (t) => {
  t.equal(uploadError(() => extractUploadedFile('multipart/form-data', Buffer.from(''))).code, 'missing_boundary')
  t.equal(uploadError(() => extractUploadedFile('multipart/form-data; boundary=', Buffer.from(''))).code, 'missing_boundary')
  t.equal(uploadError(() => extractUploadedFile('multipart/form-data; charset; boundary', Buffer.from(''))).code, 'missing_boundary', 'parameters without values')
  t.equal(uploadError(() => extractUploadedFile(`multipart/form-data; boundary=${'x'.repeat(71)}`, Buffer.from(''))).code, 'missing_boundary')
})

t.test('malformed bodies', async (t) => {
  const malformed = (body: string) => uploadError(() => extractUploadedFile(CONTENT_TYPE, Buffer.from(body)))
  t.match(malformed('no boundary anywhere'), { code: 'malformed_multipart', message: /does not contain the boundary/ })
  t.match(malformed(`x--${BOUNDARY}\r\n`), { code: 'malformed_multipart' }, 'a boundary not at the start of a line')
  t.match(malformed(`--${BOUNDARY}\nContent-Disposition: form-data; name="file"\n\nbody\n--${BOUNDARY}--\n`), { message: /does not end with CRLF/ })
  t.match(malformed(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"\r\n`), { message: /no blank line after its headers/ })
  t.match(malformed(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"\r\n\r\ncut off`), { message: /ends before the closing boundary/ })
  t.match(malformed(`--${BOUNDARY}`), { message: /does not end with CRLF/ }, 'a body that stops after the boundary')
})

t.test('uploadFromRequest', async (t) => {
  const csv = Buffer.from('a,b\r\n1,2\r\n')
  for (const contentType of ['text/csv', 'text/csv; charset=utf-8', 'application/csv', 'text/plain; charset="UTF-8"', 'TEXT/CSV; charset=us-ascii']) {
    const upload = uploadFromRequest(contentType, csv)
    t.equal(upload.fileName, null, contentType)
    t.equal(upload.bytes, csv, `${contentType}: the body itself`)
  }
  const body = multipartBody([{ disposition: 'form-data; name="file"; filename="up.csv"', content: 'a\r\n' }])
  t.same(uploadFromRequest(CONTENT_TYPE, body), { fileName: 'up.csv', bytes: Buffer.from('a\r\n') })

  for (const contentType of ['application/json', 'application/vnd.ms-excel', '', undefined]) {
    const error = uploadError(() => uploadFromRequest(contentType, csv))
    t.equal(error.code, 'unsupported_media_type', String(contentType))
  }
  t.match(uploadError(() => uploadFromRequest(undefined, csv)).message, /got no Content-Type/)
  t.match(uploadError(() => uploadFromRequest('text/csv; charset=windows-1252', csv)), { code: 'unsupported_media_type', message: /charset=windows-1252/ })
  t.equal(uploadError(() => uploadFromRequest('multipart/form-data', body)).code, 'missing_boundary')
})

t.test('parseHeaderValue', async (t) => {
  const { mediaType, parameters } = parseHeaderValue(' form-data ; name="a\\\\b" ; Filename = "x\\"y" ; name=second ; junk ; empty=')
  t.equal(mediaType, 'form-data')
  t.equal(parameters.get('name'), 'a\\b', 'the first value of a repeated parameter wins')
  t.equal(parameters.get('filename'), 'x"y')
  t.equal(parameters.get('empty'), '')
  t.same(parseHeaderValue('text/csv').parameters.size, 0)
  t.equal(parseHeaderValue('x; a="unterminated').parameters.get('a'), 'unterminated')
})
