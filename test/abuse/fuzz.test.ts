// Property-based abuse: arbitrary filter, sort, cursor, search and JSON inputs against the real
// server. Whatever the input, the answer is a 2xx or a 4xx problem: never a 500, never a crash.
import fc from 'fast-check'
import t from 'tap'
import { MAX_JSON_DEPTH } from '../../src/http/body.ts'
import { MAX_COLUMNS, MAX_HEADER_CELL_LENGTH, SAMPLE_CELL_LENGTH } from '../../src/imports/csv-file.ts'
import { checkWebhookUrl, isGlobalUnicast } from '../../src/webhooks/address-guard.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const RUNS = Number(process.env.FUZZ_RUNS ?? 150)
// Thousands of requests from one user: the rate limit is not what this test is about.
const server = await startTestServer(t, { env: { RATE_LIMIT_PER_MINUTE: '1000000' } })
const { members } = await createTenant(server.databaseUrl, { members: { 'ada@acme.test': 'admin' } })
const token = members['ada@acme.test'].token
for (const name of ['Acme', 'Ünïcode Ltd', "O'Brien & Sons"]) {
  await server.request('POST', '/api/companies', { token, body: { name, domain: `${name.replace(/\W/g, '').toLowerCase()}.test` } })
  await server.request('POST', '/api/deals', { token, body: { name: `${name} deal`, amount: '100.00' } })
}
let inputs = 0

const FIELDS = [
  'name',
  'amount',
  'stage',
  'created_at',
  'updated_at',
  'id',
  'owner_id',
  'email',
  'custom_fields.x',
  'custom_fields',
  'nope',
  '',
  "name'--",
  'name;drop',
]
const OPERATORS = ['eq', 'ne', 'lt', 'lte', 'gt', 'gte', 'in', 'contains', 'starts_with', 'is_null', 'like', '', 'eq]', '[eq']
const hostileText = fc.oneof(
  fc.string({ maxLength: 40 }),
  fc.string({ unit: 'binary', maxLength: 40 }),
  fc.constantFrom(
    "' or 1=1 --",
    '%00',
    '%ff%fe',
    '\u0000',
    '%',
    '_',
    '\\',
    '1e309',
    '-0',
    'NaN',
    '2026-13-45',
    '9'.repeat(400),
    'a'.repeat(5000),
    '{}',
    '[]',
    'null',
    'true',
    ',,,',
  ),
)

async function expectNo500(path: string, method = 'GET', body?: unknown): Promise<void> {
  inputs++
  const response = await server.request(method, path, { token, body })
  if (response.status >= 500) throw new Error(`${method} ${path} answered ${response.status}: ${response.text.slice(0, 300)}`)
  if (response.status >= 400 && response.headers.get('content-type') !== 'application/problem+json')
    throw new Error(`${path}: a ${response.status} without a problem body`)
}

t.test('list filters, sort, limit and cursor', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom('contacts', 'companies', 'deals'),
      fc.array(fc.tuple(fc.constantFrom(...FIELDS), fc.option(fc.constantFrom(...OPERATORS)), hostileText), { maxLength: 3 }),
      fc.option(fc.array(fc.tuple(fc.boolean(), fc.constantFrom(...FIELDS)), { maxLength: 3 })),
      fc.option(fc.oneof(fc.integer({ min: -5, max: 500 }).map(String), hostileText)),
      fc.option(hostileText),
      async (type, filters, sort, limit, cursor) => {
        const parts = filters.map(
          ([field, op, value]) => `${encodeURIComponent(`filter[${field}]${op ? `[${op}]` : ''}`)}=${encodeURIComponent(value)}`,
        )
        if (sort) parts.push(`sort=${encodeURIComponent(sort.map(([desc, field]) => (desc ? '-' : '') + field).join(','))}`)
        if (limit !== null) parts.push(`limit=${encodeURIComponent(limit)}`)
        if (cursor !== null) parts.push(`cursor=${encodeURIComponent(cursor)}`)
        await expectNo500(`/api/${type}?${parts.join('&')}`)
      },
    ),
    { numRuns: RUNS },
  )
})

t.test('raw, badly encoded query strings', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom('contacts', 'deals', 'search', 'deals/search'),
      fc.string({ unit: 'binary', maxLength: 60 }),
      async (path, raw) => {
        // Percent-encode only what would break the HTTP request line itself; lone surrogates become
        // an invalid UTF-8 byte, so the server also meets bad encodings.
        const query = Array.from(raw, (char) => {
          if (!/[\s#\u0000-\u001f\u007f-\u{10ffff}]/u.test(char)) return char
          try {
            return encodeURIComponent(char)
          } catch {
            return '%ff'
          }
        }).join('')
        await expectNo500(`/api/${path}?${query}`)
      },
    ),
    { numRuns: RUNS },
  )
})

t.test('search terms', async () => {
  await fc.assert(
    fc.asyncProperty(hostileText, fc.option(fc.constantFrom('contacts', 'deals,companies', 'nope', '')), async (q, types) => {
      await expectNo500(`/api/search?q=${encodeURIComponent(q)}${types !== null ? `&types=${encodeURIComponent(types)}` : ''}`)
      await expectNo500(`/api/deals/search?q=${encodeURIComponent(q)}`)
    }),
    { numRuns: RUNS },
  )
})

t.test('JSON bodies for create and update', async () => {
  const { body: created } = await server.request('POST', '/api/deals', { token, body: { name: 'fuzz target' } })
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom('contacts', 'companies', 'deals'),
      fc.object({ maxDepth: 2, values: [fc.jsonValue(), hostileText] }),
      async (type, body) => {
        await expectNo500(`/api/${type}`, 'POST', body)
        await expectNo500(`/api/deals/${created.data.id}`, 'PATCH', body)
      },
    ),
    { numRuns: RUNS },
  )
})

t.test('JSON nested at any depth: 400 past the limit with a real token, 401 unread with an unknown one, never a 5xx', async () => {
  // Built as text: JSON.stringify itself recurses, and overflows on the deepest of these.
  const nestedText = (depth: number, kinds: boolean[]) =>
    Array.from({ length: depth }, (_, level) => (kinds[level % kinds.length] ? '{"a":' : '[')).join('') +
    '1' +
    Array.from({ length: depth }, (_, level) => (kinds[(depth - 1 - level) % kinds.length] ? '}' : ']')).join('')
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom('contacts', 'companies', 'deals'),
      fc.oneof(fc.integer({ min: 1, max: MAX_JSON_DEPTH + 2 }), fc.integer({ min: 1, max: 6000 })),
      fc.array(fc.boolean(), { minLength: 1, maxLength: 3 }),
      fc.constantFrom('the body', 'a custom field', 'a string with brackets'),
      fc.boolean(),
      async (type, depth, kinds, where, realToken) => {
        inputs++
        const inner = nestedText(depth, kinds)
        const text =
          where === 'the body'
            ? inner
            : where === 'a custom field'
              ? `{"name":"n","first_name":"f","custom_fields":{"k":${inner}}}`
              : `{"name":${JSON.stringify(inner)}}`
        // Levels the text opens outside strings: the wrapper's two objects around a custom field.
        const levels = where === 'the body' ? depth : where === 'a custom field' ? depth + 2 : 1
        const response = await server.request('POST', `/api/${type}`, {
          token: realToken ? token : `crm_${'A'.repeat(43)}`,
          raw: text,
          headers: { 'content-type': 'application/json' },
        })
        if (response.status >= 500) throw new Error(`${levels} levels answered ${response.status}: ${response.text.slice(0, 300)}`)
        // An unknown token is authenticated before its body is read (test/hostile/unproven-bodies.test.ts).
        if (!realToken && (response.status !== 401 || response.body.code !== 'token_invalid'))
          throw new Error(`an unknown token answered ${response.status}, not 401 token_invalid: ${response.text.slice(0, 300)}`)
        if (realToken && levels > MAX_JSON_DEPTH && (response.status !== 400 || response.body.code !== 'invalid_json'))
          throw new Error(`${levels} levels answered ${response.status}, not 400 invalid_json: ${response.text.slice(0, 300)}`)
      },
    ),
    { numRuns: RUNS },
  )
})

t.test('CSV headers with long cells, digit runs and many columns: a 422 past the caps, a preview within them', async () => {
  const header = fc.oneof(
    fc.integer({ min: 1, max: 60_000 }).map((digits) => `a${'7'.repeat(digits)}x`),
    fc.integer({ min: 1, max: 2 * MAX_COLUMNS }).map((count) => Array.from({ length: count }, (_, index) => `c${index}`).join(',')),
    fc
      .tuple(fc.stringMatching(/^[a-zA-Z ]{0,5}$/), fc.integer({ min: 0, max: 3 * MAX_HEADER_CELL_LENGTH }))
      .map(([text, pad]) => text + ' '.repeat(pad) + '9'),
  )
  const cell = fc.oneof(
    fc.string({ maxLength: 5 }),
    fc.integer({ min: 0, max: 100_000 }).map((length) => 'z'.repeat(length)),
  )
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom('contacts', 'companies', 'deals'),
      header,
      fc.array(fc.array(cell, { maxLength: 4 }), { maxLength: 3 }),
      async (type, headerLine, rows) => {
        inputs++
        const csv = [headerLine, ...rows.map((row) => row.map((value) => `"${value}"`).join(','))].join('\n')
        const response = await server.request('POST', `/api/${type}/import/upload`, {
          token,
          raw: csv,
          headers: { 'content-type': 'text/csv' },
        })
        if (response.status >= 500) throw new Error(`upload answered ${response.status}: ${response.text.slice(0, 300)}`)
        const cells = headerLine.split(',')
        const refused = cells.length > MAX_COLUMNS || cells.some((name) => name.length > MAX_HEADER_CELL_LENGTH)
        if (refused && response.status !== 422) throw new Error(`a header past the caps answered ${response.status}`)
        if (response.status === 201) {
          const { columns, sample_rows: sample } = response.body.data
          if (columns.length > MAX_COLUMNS) throw new Error(`${columns.length} columns accepted`)
          if (sample.some((row: string[]) => row.length > MAX_COLUMNS || row.some((value) => value.length > SAMPLE_CELL_LENGTH)))
            throw new Error('a preview cell or row past its cap')
        }
      },
    ),
    { numRuns: RUNS },
  )
})

t.test('CSV uploads', async () => {
  const csvCell = fc.oneof(
    fc.string({ maxLength: 12 }),
    fc.constantFrom('"', '""', '"a,b"', '\r\n', ';', '\t', '\uFEFF', '\u0000', 'é', '😀'),
  )
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom('contacts', 'companies', 'deals'),
      fc.oneof(
        fc
          .array(fc.array(csvCell, { maxLength: 5 }), { maxLength: 6 })
          .map((rows) => Buffer.from(rows.map((row) => row.join(',')).join('\n'))),
        fc.uint8Array({ maxLength: 300 }).map((bytes) => Buffer.from(bytes)),
      ),
      fc.constantFrom('text/csv', 'multipart/form-data; boundary=x', 'application/octet-stream'),
      async (type, bytes, contentType) => {
        inputs++
        const response = await server.request('POST', `/api/${type}/import/upload`, {
          token,
          raw: bytes,
          headers: { 'content-type': contentType },
        })
        if (response.status >= 500) throw new Error(`upload answered ${response.status}: ${response.text.slice(0, 300)}`)
      },
    ),
    { numRuns: RUNS },
  )
})

t.test('the webhook address guard never throws and refuses every non-global address', async () => {
  const policy = { allowHttp: false, allowedCidrs: [] }
  await fc.assert(
    fc.asyncProperty(
      fc.oneof(
        fc.webUrl(),
        fc.string({ maxLength: 80 }),
        fc.tuple(fc.integer({ min: 0, max: 0xffffffff }), fc.constantFrom('', '/x', ':8443/x')).map(([n, rest]) => `https://${n}${rest}`),
        fc.ipV4().map((ip) => `https://${ip}/`),
        fc.ipV6().map((ip) => `https://[${ip}]/`),
      ),
      async (candidate) => {
        inputs++
        const result = await checkWebhookUrl(candidate, { ...policy, resolve: async () => ['10.0.0.1'] })
        if (result.ok) {
          for (const { address } of result.addresses) if (!isGlobalUnicast(address)) throw new Error(`${candidate} passed with ${address}`)
        }
      },
    ),
    { numRuns: RUNS * 4 },
  )
})

t.test('summary', async (t) => {
  t.ok(inputs > RUNS * 4, `${inputs} hostile inputs, no 500`)
  console.log(`# fuzz: ${inputs} inputs sent to the API, none answered 500`)
})
