// Hostile batch bodies (docs/api.md section 5a): too many items are refused on their count before
// any item is validated, whatever the items are; NUL bytes, 1 MiB strings, deeply nested custom
// fields, duplicate ids, concurrent batches over the same records and another workspace's ids get
// clear 4xx answers or per-item answers, never a 500, and nothing half-written.
import fc from 'fast-check'
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { clientFor, startWorld } from '../records/helpers.ts'

const world = await startWorld(t)
const ann = world.as('ann@acme.test')
const TYPES = ['contacts', 'companies', 'deals'] as const
const OPERATIONS = ['create', 'read', 'update', 'upsert', 'delete'] as const

const rawPost = (path: string, raw: string) =>
  world.server.request('POST', path, {
    token: ann.member.token,
    raw,
    headers: { 'x-tenant-slug': world.tenant.slug, 'content-type': 'application/json' },
  })

t.test('a batch over 100 items is refused on its count, whatever its items are', async (t) => {
  // Items the schema would refuse one by one (0, a nested array) and items it would accept: a
  // count past the limit answers batch_too_large either way, without validating any of them.
  const item = fc.constantFrom('0', '{}', '""', '[[]]', 'null', '{"id":0}')
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom(...TYPES),
      fc.constantFrom(...OPERATIONS),
      fc.oneof(fc.integer({ min: 101, max: 1_000 }), fc.integer({ min: 100_000, max: 200_000 })),
      item,
      async (type, operation, count, value) => {
        const key = operation === 'read' || operation === 'delete' ? 'ids' : 'inputs'
        // Within the 1 MiB body limit (over it is a 413, told before the count).
        const fitting = Math.min(count, Math.floor((1024 * 1024 - 64) / (value.length + 1)))
        const answer = await rawPost(`/api/${type}/batch/${operation}`, `{"${key}":[${Array(fitting).fill(value).join(',')}]}`)
        return (
          answer.status === 422 &&
          answer.body?.code === 'batch_too_large' &&
          answer.body.errors.length === 1 &&
          answer.body.errors[0].pointer === `/${key}`
        )
      },
    ),
    { numRuns: 25 },
  )
  const { rows } = await world.owner(
    'select (select count(*) from crm.contacts) + (select count(*) from crm.companies) + (select count(*) from crm.deals) as n',
  )
  t.equal(Number(rows[0].n), 0, 'nothing was written')
})

const other = await createTenant(world.server.databaseUrl, { slug: 'other', members: { 'zed@other.test': 'admin' } })
const zed = clientFor(world.server, other, other.members['zed@other.test'])
const admin = world.as('admin@acme.test')

/** Every table a batch writes, as text, to compare before and after a refused batch. */
const snapshot = async () =>
  (
    await world.owner(
      `select (select coalesce(jsonb_agg(c order by c.id), '[]') from crm.contacts c)::text
           || (select coalesce(jsonb_agg(c order by c.id), '[]') from crm.companies c)::text
           || (select coalesce(jsonb_agg(d order by d.id), '[]') from crm.deals d)::text
           || (select count(*) from crm.events)::text as state`,
    )
  ).rows[0].state as string

/** A 4xx problem body for the whole call, or per-item answers each a single route's status. */
function clearBatchAnswer(answer: { status: number; body: any }): boolean {
  if (answer.status >= 400 && answer.status < 500) return typeof answer.body?.code === 'string' && typeof answer.body?.detail === 'string'
  return (
    answer.status === 200 &&
    answer.body.results.every(
      (result: any) =>
        [200, 201, 204].includes(result.status) ||
        ([403, 404, 409, 412, 422].includes(result.status) && typeof result.problem?.code === 'string'),
    )
  )
}

t.test('NUL bytes, megabyte strings and deeply nested custom fields are refused, nothing written', async (t) => {
  const before = await snapshot()
  const nested = (depth: number): unknown => (depth === 0 ? 'leaf' : { a: nested(depth - 1) })
  const megabyte = 'x'.repeat(1024 * 1024)
  const bodies: [string, unknown][] = [
    ['/api/contacts/batch/create', { inputs: [{ first_name: 'ok' }, { first_name: 'nul\u0000here' }], atomic: true }],
    ['/api/contacts/batch/create', { inputs: [{ first_name: 'ok' }, { custom_fields: { 'key\u0000': 1 } }], atomic: true }],
    ['/api/contacts/batch/read', { ids: ['\u0000'] }],
    ['/api/contacts/batch/create', { inputs: [{ first_name: 'ok' }, { first_name: megabyte }], atomic: true }],
    ['/api/contacts/batch/create', { inputs: [{ first_name: 'ok' }, { first_name: 'x'.repeat(1000 * 1000) }], atomic: true }],
    ['/api/companies/batch/create', { inputs: [{ name: 'ok' }, { name: 'deep', custom_fields: nested(70) }], atomic: true }],
    ['/api/companies/batch/create', { inputs: [{ name: 'ok' }, { name: 'deep', custom_fields: nested(40) }], atomic: true }],
    ['/api/deals/batch/upsert', { inputs: [{ name: 'ok' }, { name: 'deep', custom_fields: { tier: [[[['gold']]]] } }], atomic: true }],
    ['/api/deals/batch/update', { inputs: [{ id: '\u0000', name: 'x' }], atomic: true }],
  ]
  for (const [path, body] of bodies) {
    const answer = await ann.post(path, body)
    t.ok(clearBatchAnswer(answer) && answer.status >= 400, `${path}: ${answer.status} ${answer.text.slice(0, 160)}`)
  }
  t.equal(await snapshot(), before, 'nothing was written')
})

t.test('duplicate ids, another workspace’s ids and garbage ids answer per item', async (t) => {
  const mine = (await admin.post('/api/deals/batch/create', { inputs: [{ name: 'Mine 1' }, { name: 'Mine 2' }] })).body.results.map(
    (result: any) => result.data.id,
  )
  const theirs = (await zed.post('/api/deals/batch/create', { inputs: [{ name: 'Theirs' }] })).body.results[0].data.id
  const theirsBefore = (await zed.get(`/api/deals/${theirs}`)).body
  const ids = fc.constantFrom(mine[0], mine[1], theirs, '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a', 'not-a-uuid', '', theirs.toUpperCase())
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom('read', 'update', 'upsert', 'delete'),
      fc.array(ids, { minLength: 1, maxLength: 8 }),
      fc.boolean(),
      async (operation, chosen, atomic) => {
        const body =
          operation === 'read' || operation === 'delete'
            ? { ids: chosen, ...(operation === 'delete' ? { atomic } : {}) }
            : { inputs: chosen.map((id) => ({ id, amount: '1.00' })), atomic }
        const answer = await admin.post(`/api/deals/batch/${operation}`, body)
        if (!clearBatchAnswer(answer)) return false
        // Another workspace's record is not found, and stays as it was.
        if (answer.status === 200) {
          for (const [index, id] of chosen.entries()) {
            if (id.toLowerCase() === theirs && operation !== 'upsert' && answer.body.results[index].status !== 404) return false
          }
        }
        const after = await zed.get(`/api/deals/${theirs}`)
        return after.status === 200 && JSON.stringify(after.body) === JSON.stringify(theirsBefore)
      },
    ),
    { numRuns: 60 },
  )
  t.pass('every batch answered clearly; the other workspace’s deal is untouched')
})

t.test('20 concurrent batches over the same records: per-item answers, no 500, every write whole', async (t) => {
  const created = await admin.post('/api/contacts/batch/create', {
    inputs: Array.from({ length: 30 }, (_, index) => ({
      first_name: 'Same',
      last_name: `Record ${index}`,
      email: `same${index}@race.test`,
    })),
  })
  const ids: string[] = created.body.results.map((result: any) => result.data.id)
  await fc.assert(
    fc.asyncProperty(
      fc.array(
        fc.record({
          operation: fc.constantFrom('update', 'upsert', 'delete', 'read'),
          // Each batch takes the records in its own order, so two batches lock them in different orders.
          order: fc.shuffledSubarray(ids, { minLength: 1 }),
          atomic: fc.boolean(),
          value: fc.integer({ min: 0, max: 1000 }),
        }),
        { minLength: 20, maxLength: 20 },
      ),
      async (batches) => {
        const answers = await Promise.all(
          batches.map(({ operation, order, atomic, value }) =>
            admin.post(
              `/api/contacts/batch/${operation}`,
              operation === 'read' || operation === 'delete'
                ? { ids: order, ...(operation === 'delete' ? { atomic } : {}) }
                : operation === 'upsert'
                  ? {
                      match_on: 'email',
                      inputs: order.map((id) => ({ email: `same${ids.indexOf(id)}@race.test`, job_title: `v${value}` })),
                      atomic,
                    }
                  : { inputs: order.map((id) => ({ id, job_title: `v${value}` })), atomic },
            ),
          ),
        )
        // A 503 is the pool shedding load on a busy machine (nothing written, retry): not a failure
        // of the batch; anything else must be a clear answer.
        const unclear = answers.find(
          (answer) =>
            !(answer.status === 503 && answer.body?.code === 'unavailable') && (!clearBatchAnswer(answer) || answer.status >= 500),
        )
        t.notOk(unclear, unclear ? `${unclear.status} ${unclear.text.slice(0, 300)}` : 'every batch answered clearly')
        // Whole rows only: every live contact has its email and one of the values a batch wrote.
        const { rows } = await world.owner(
          `select count(*) filter (where email is null or (job_title is not null and job_title !~ '^v[0-9]+$'))::int as torn
             from crm.contacts where email like '%@race.test'`,
        )
        return !unclear && rows[0].torn === 0
      },
    ),
    { numRuns: 3 },
  )
})
