// A create's answer (src/http/routes/records.ts, createRecord in src/records/operations.ts): its
// INSERT is built once per set of fields sent and reused with each create's values, and without an
// Idempotency-Key the record goes out as the text PostgreSQL rendered. Checked here, as a property
// over types, fields sent in any order and their values: the answer is byte for byte the record
// GET answers next, with the same ETag and a Location naming it, and holds exactly the values sent
// (a statement reused for another create's values must not keep the previous one's); with a key,
// the first answer and its replay are the same bytes.
import { randomUUID } from 'node:crypto'
import fc from 'fast-check'
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const tenant = await createTenant(server.databaseUrl, { slug: 'createanswer', members: { 'ann@answer.test': 'member' } })
const token = tenant.members['ann@answer.test'].token
const headers = { 'x-tenant-slug': tenant.slug }
const call = (method: string, path: string, body?: unknown, extra: Record<string, string> = {}) =>
  server.request(method, path, { token, body, headers: { ...headers, ...extra } })

// The identity is cached first: creates then travel in one statement with their authentication.
if ((await call('GET', '/api/deals')).status !== 200) throw new Error('warming the identity failed')

const text = fc.string({ minLength: 1, maxLength: 12, unit: 'grapheme' }).filter((value) => value.trim() === value && value !== '')
const customFields = fc.dictionary(fc.constantFrom('tier', 'note', 'size'), fc.oneof(text, fc.integer(), fc.boolean()), {
  maxKeys: 3,
})
/** Per type: its required field, and the optional fields a create may send with a value of each. */
const TYPES = {
  deals: {
    required: { name: text },
    optional: {
      amount: fc.integer({ min: 0, max: 10_000_000 }).map((cents) => (cents / 100).toFixed(2)),
      close_date: fc
        .date({ min: new Date('2000-01-01'), max: new Date('2099-12-31'), noInvalidDate: true })
        .map((date) => date.toISOString().slice(0, 10)),
      stage: fc.constantFrom('lead', 'won'),
      custom_fields: customFields,
    },
  },
  contacts: { required: { first_name: text }, optional: { last_name: text, custom_fields: customFields } },
  companies: { required: { name: text }, optional: { custom_fields: customFields } },
}

const bodies = fc.oneof(
  ...Object.entries(TYPES).map(([path, { required, optional }]) =>
    fc
      .record({ ...required, ...optional } as Record<string, fc.Arbitrary<unknown>>, { requiredKeys: Object.keys(required) })
      .chain((body) =>
        fc.shuffledSubarray(Object.keys(body), { minLength: Object.keys(body).length }).map((order) => ({ path, order, body })),
      )
      .map(({ path, order, body }) => ({
        path,
        body: Object.fromEntries(order.map((name) => [name, (body as Record<string, unknown>)[name]])),
      })),
  ),
)

t.test('property: a create answers the record GET answers next, holding the values sent', async (t) => {
  await fc.assert(
    fc.asyncProperty(bodies, async ({ path, body }) => {
      const created = await call('POST', `/api/${path}`, body)
      if (created.status !== 201) throw new Error(`${path} ${JSON.stringify(body)}: ${created.status} ${created.text}`)
      const id = created.body.data.id
      const read = await call('GET', `/api/${path}/${id}`)
      t.equal(created.text, read.text, 'the same bytes as GET one')
      t.equal(created.headers.get('etag'), read.headers.get('etag'), 'the same ETag')
      t.equal(created.headers.get('location'), `/api/${path}/${id}`)
      for (const [name, value] of Object.entries(body)) t.same(created.body.data[name], value, `${name} as sent`)
    }),
    { numRuns: 60 },
  )
})

t.test('with an Idempotency-Key, the first answer and its replay are the same bytes', async (t) => {
  const key = randomUUID()
  const first = await call('POST', '/api/deals', { name: 'Keyed', amount: '12.50' }, { 'idempotency-key': key })
  const replay = await call('POST', '/api/deals', { name: 'Keyed', amount: '12.50' }, { 'idempotency-key': key })
  t.equal(first.status, 201)
  t.equal(replay.status, 201)
  t.equal(replay.headers.get('idempotent-replayed'), 'true')
  t.equal(replay.text, first.text)
  t.equal(replay.headers.get('location'), first.headers.get('location'))
  t.same(first.body, (await call('GET', `/api/deals/${first.body.data.id}`)).body, 'the record GET answers')
})
