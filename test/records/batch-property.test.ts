// A property of the batch routes (docs/api.md section 5a): a batch answers, item by item, what the
// same single requests answer in the same order: the status, the problem's code and pointers, and
// the record. Each run writes two twin sets of records (names told apart by a prefix), one through
// a batch and one through single requests, and compares the answers with the prefix taken out.
import fc from 'fast-check'
import t from 'tap'
import type { TestResponse } from '../helpers/server.ts'
import { type Client, startWorld } from './helpers.ts'

const world = await startWorld(t)
const ann = world.as('ann@acme.test')
const bob = world.as('bob@acme.test')

type Item = { status: number; data?: any; problem?: any }

/** What must be equal between the twins: volatile members out, the twin's prefix replaced. */
function comparable(item: Item, prefix: string): unknown {
  const text = JSON.stringify(item).replaceAll(prefix, 'TWIN')
  const { status, data, problem } = JSON.parse(text)
  const record =
    data && Object.fromEntries(Object.entries(data).filter(([name]) => !/^(id|created_at|updated_at|stage_changed_at)$/.test(name)))
  return { status, record, problem: problem && { code: problem.code, errors: problem.errors } }
}

function singleItem(response: TestResponse): Item {
  return response.status < 300 ? { status: response.status, data: response.body.data } : { status: response.status, problem: response.body }
}

/** Contacts, mostly valid, with now and then a refused value and e-mails that often repeat (409). */
const contactInput = (prefix: string) =>
  fc
    .record(
      {
        first_name: fc.oneof(
          { weight: 4, arbitrary: fc.string({ minLength: 1, maxLength: 3 }) },
          fc.constant('x'.repeat(101)),
          fc.constant(null),
        ),
        email: fc.oneof(
          { weight: 5, arbitrary: fc.integer({ min: 0, max: 2 }).map((n) => `person${n}@${prefix}.test`) },
          fc.constant('not an email'),
        ),
        job_title: fc.string({ maxLength: 5 }),
        custom_fields: fc.oneof({ weight: 4, arbitrary: fc.constant({ tier: 'gold' }) }, fc.constant({ 'Bad Key': 1 })),
        nickname: fc.constant('unknown field'),
      },
      { requiredKeys: ['first_name'] },
    )
    .map(({ nickname, ...input }) => JSON.stringify(input.job_title === '' ? { ...input, nickname } : input))

const dealChange = fc.record(
  {
    owner: fc.constantFrom('ann', 'bob'),
    name: fc.oneof(fc.constant(''), fc.string({ minLength: 1, maxLength: 4 })),
    amount: fc.oneof(fc.constant('10.00'), fc.constant(12.5), fc.constant(-1), fc.constant('1.234')),
    stage: fc.constantFrom('won', 'lead', 'nope'),
    staleIfMatch: fc.boolean(),
  },
  { requiredKeys: ['owner', 'staleIfMatch'] },
)

let run = 0

t.test('batch create answers what single creates answer', async (t) => {
  await fc.assert(
    fc.asyncProperty(fc.array(contactInput('PREFIX'), { minLength: 1, maxLength: 8 }), async (inputs) => {
      run += 1
      const [a, b] = [`a${run}x`, `b${run}x`]
      const forTwin = (prefix: string) => inputs.map((input) => JSON.parse(input.replaceAll('PREFIX', prefix)))
      const batch = await ann.post('/api/contacts/batch/create', { inputs: forTwin(a) })
      t.equal(batch.status, 200, batch.text)
      const singles: Item[] = []
      for (const input of forTwin(b)) singles.push(singleItem(await ann.post('/api/contacts', input)))
      t.same(
        batch.body.results.map((item: Item) => comparable(item, a)),
        singles.map((item) => comparable(item, b)),
      )
    }),
    { numRuns: 15 },
  )
})

/** A deal owned by `owner`, named for its twin. */
async function dealOf(owner: Client, name: string) {
  const created = await owner.post('/api/deals', { name })
  return { id: created.body.data.id as string, etag: created.headers.get('etag')! }
}

t.test('batch update answers what single PATCHes answer', async (t) => {
  await fc.assert(
    fc.asyncProperty(fc.array(dealChange, { minLength: 1, maxLength: 5 }), async (changes) => {
      run += 1
      const [a, b] = [`a${run}x`, `b${run}x`]
      const twins = async (prefix: string) => {
        const deals = []
        for (const [index, change] of changes.entries())
          deals.push(await dealOf(change.owner === 'ann' ? ann : bob, `${prefix} deal ${index}`))
        return deals
      }
      const [dealsA, dealsB] = [await twins(a), await twins(b)]
      const body = (change: (typeof changes)[number], etag: string) => {
        const { owner: _owner, staleIfMatch: _stale, ...fields } = change
        return { fields, ifMatch: change.staleIfMatch ? '"stale"' : etag }
      }
      const batch = await ann.post('/api/deals/batch/update', {
        inputs: changes.map((change, index) => {
          const { fields, ifMatch } = body(change, dealsA[index].etag)
          return { id: dealsA[index].id, ...fields, if_match: ifMatch }
        }),
      })
      t.equal(batch.status, 200, batch.text)
      const singles: Item[] = []
      for (const [index, change] of changes.entries()) {
        const { fields, ifMatch } = body(change, dealsB[index].etag)
        singles.push(singleItem(await ann.patch(`/api/deals/${dealsB[index].id}`, fields, { 'if-match': ifMatch })))
      }
      t.same(
        batch.body.results.map((item: Item) => comparable(item, a)),
        singles.map((item) => comparable(item, b)),
      )
    }),
    { numRuns: 15 },
  )
})

/** An upsert on a contact's e-mail: of a contact that exists (ann's, bob's) or not, now and then refused. */
const upsertChange = fc.record(
  {
    person: fc.integer({ min: 0, max: 3 }),
    upper: fc.boolean(),
    noEmail: fc.boolean(),
    first_name: fc.oneof({ weight: 4, arbitrary: fc.string({ minLength: 1, maxLength: 3 }) }, fc.constant('x'.repeat(101))),
    job_title: fc.string({ maxLength: 5 }),
    if_match: fc.constantFrom('"stale"', '*'),
  },
  { requiredKeys: ['person', 'upper', 'noEmail'] },
)

t.test('batch upsert answers what the same upserts one at a time answer', async (t) => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.constantFrom('none', 'ann', 'bob'), { minLength: 4, maxLength: 4 }),
      fc.array(upsertChange, { minLength: 1, maxLength: 8 }),
      async (owners, changes) => {
        run += 1
        const [a, b] = [`a${run}x`, `b${run}x`]
        const emailOf = (prefix: string, person: number) => `person${person}@${prefix}.test`
        const inputs = async (prefix: string) => {
          for (const [person, owner] of owners.entries()) {
            if (owner !== 'none')
              await (owner === 'ann' ? ann : bob).post('/api/contacts', { first_name: 'x', email: emailOf(prefix, person) })
          }
          return changes.map(({ person, upper, noEmail, ...fields }) => {
            const email = emailOf(prefix, person)
            return noEmail ? fields : { ...fields, email: upper ? email.toUpperCase() : email }
          })
        }
        const [inputsA, inputsB] = [await inputs(a), await inputs(b)]
        const batch = await ann.post('/api/contacts/batch/upsert', { match_on: 'email', inputs: inputsA })
        t.equal(batch.status, 200, batch.text)
        const singles: Item[] = []
        for (const input of inputsB) {
          const single = await ann.post('/api/contacts/batch/upsert', { match_on: 'email', inputs: [input] })
          singles.push(single.body.results[0])
        }
        const uncased = (items: Item[], prefix: string) =>
          items.map((item) => comparable(JSON.parse(JSON.stringify(item).replaceAll(prefix.toUpperCase(), prefix)), prefix))
        t.same(uncased(batch.body.results, a), uncased(singles, b))
      },
    ),
    { numRuns: 15 },
  )
})

/** A valid contact that sends some of the optional fields: a batch of them mixes sets of fields sent. */
const validContact = (prefix: string, index: number) =>
  fc
    .record(
      {
        last_name: fc.string({ minLength: 1, maxLength: 3 }),
        job_title: fc.string({ minLength: 1, maxLength: 3 }),
        phone: fc.constantFrom('+1 555 0100', null),
        custom_fields: fc.constant({ tier: 'gold' }),
      },
      { requiredKeys: [] },
    )
    .map((fields) => ({ first_name: `${prefix}${index}`, email: `p${index}@${prefix}.test`, ...fields }))

t.test('a valid batch create, whatever the fields each input sends, answers and records what single creates do', async (t) => {
  await fc.assert(
    fc.asyncProperty(
      fc
        .integer({ min: 1, max: 8 })
        .chain((size) => fc.tuple(...Array.from({ length: size }, (_, index) => validContact('PREFIX', index)))),
      async (inputs) => {
        run += 1
        const [a, b] = [`a${run}x`, `b${run}x`]
        const forTwin = (prefix: string) => inputs.map((input) => JSON.parse(JSON.stringify(input).replaceAll('PREFIX', prefix)))
        const batch = await ann.post('/api/contacts/batch/create', { inputs: forTwin(a) })
        t.equal(batch.status, 200, batch.text)
        t.equal(batch.body.counts.failed, 0, 'every input is valid: the set-wise INSERTs ran')
        const singles: Item[] = []
        for (const input of forTwin(b)) singles.push(singleItem(await ann.post('/api/contacts', input)))
        t.same(
          batch.body.results.map((item: Item) => comparable(item, a)),
          singles.map((item) => comparable(item, b)),
        )
        // Each record's own history: one contact.created with the same object, actor and via.
        const historyOf = async (item: Item, prefix: string) => {
          const entries = (await ann.get(`/api/contacts/${item.data.id}/history`)).body.data
          return JSON.parse(JSON.stringify(entries).replaceAll(item.data.id, 'ID').replaceAll(prefix, 'TWIN')).map(
            ({ id: _id, occurred_at: _at, ...entry }: Record<string, unknown>) => entry,
          )
        }
        for (const [index, item] of batch.body.results.entries()) {
          const [fromBatch, fromSingle] = [await historyOf(item, a), await historyOf(singles[index], b)]
          t.equal(fromBatch.length, 1, 'one event per record')
          t.same(fromBatch, fromSingle)
        }
      },
    ),
    { numRuns: 15 },
  )
})
