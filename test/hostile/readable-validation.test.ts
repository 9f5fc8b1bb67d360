// A body that fails validation gets one sentence per wrong field, each with its pointer, all at
// once, in words a person understands: never the validator's jargon (anyOf, "must match a schema",
// patterns, regular expressions). docs/api.md section 2.
import fc from 'fast-check'
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const tenant = await createTenant(server.databaseUrl, { plan: 'pro', members: { 'ada@words.test': 'admin' } })
const token = tenant.members['ada@words.test'].token

const JARGON =
  /anyOf|oneOf|allOf|schema|pattern|required property|additionalProperties|\^|\$|\\[ds]|\[[^\]]*-[^\]]*\]|must be (string|number|integer|null|boolean|object)$/

type FieldCase = { field: string; bad: fc.Arbitrary<unknown> }
const wrongType = fc.oneof(fc.boolean(), fc.constant([1]), fc.constant({ x: 1 }))
const tooLong = (max: number) => fc.string({ minLength: max + 1, maxLength: max + 20, unit: fc.constantFrom('a', 'b') })
const notMatching = fc.constantFrom('has space', '%%%', 'no@', '-', 'ABC DEF')

const FIELDS: Record<string, { path: string; base: Record<string, unknown>; fields: FieldCase[] }> = {
  company: {
    path: '/api/companies',
    base: { name: 'Globex' },
    fields: [
      { field: 'domain', bad: fc.oneof(wrongType, notMatching) },
      { field: 'website', bad: fc.oneof(wrongType, notMatching) },
      { field: 'phone', bad: fc.oneof(wrongType, fc.constant('%%%')) },
      { field: 'name', bad: fc.oneof(wrongType, tooLong(255)) },
    ],
  },
  contact: {
    path: '/api/contacts',
    base: { first_name: 'Ann' },
    fields: [
      { field: 'first_name', bad: fc.oneof(wrongType, tooLong(100)) },
      { field: 'email', bad: fc.oneof(wrongType, notMatching) },
      { field: 'phone', bad: fc.oneof(wrongType, fc.constant('%%%')) },
    ],
  },
  deal: {
    path: '/api/deals',
    base: { name: 'Renewal' },
    fields: [
      { field: 'amount', bad: fc.oneof(wrongType, notMatching, fc.constant('1.234')) },
      { field: 'currency', bad: fc.oneof(wrongType, fc.constantFrom('usd', 'US', 'U5D')) },
      { field: 'stage', bad: fc.oneof(wrongType, notMatching) },
      { field: 'close_date', bad: fc.oneof(wrongType, notMatching, fc.constant('2026-13-45')) },
    ],
  },
}

type Problem = { pointer: string; message: string }

t.test('every wrong field of a random invalid body gets a readable sentence with its pointer', async (t) => {
  await fc.assert(
    fc.asyncProperty(
      fc
        .constantFrom(...Object.keys(FIELDS))
        .chain((type) =>
          fc
            .subarray(FIELDS[type].fields, { minLength: 1 })
            .chain((chosen) => fc.tuple(fc.constant(type), fc.tuple(...chosen.map((item) => fc.tuple(fc.constant(item.field), item.bad))))),
        ),
      async ([type, wrong]) => {
        const { path, base } = FIELDS[type]
        const body = { ...base, ...Object.fromEntries(wrong) }
        const response = await server.request('POST', path, { body, token })
        t.equal(response.status, 422, response.text.slice(0, 300))
        const problems: Problem[] = response.body?.errors ?? []
        for (const problem of problems) t.notMatch(problem.message, JARGON, `${problem.pointer}: ${problem.message}`)
        t.notMatch(response.body?.detail ?? '', JARGON)
        // Wrong types and lengths are reported together; a field that only fails a pattern or a
        // format is reported with the others once every length is right (patterns run on bounded input).
        const lengthOrType = wrong.filter(([, value]) => typeof value !== 'string' || value.length > 100)
        const expected = lengthOrType.length > 0 ? lengthOrType : wrong
        for (const [field] of expected) {
          t.ok(
            problems.some((problem) => problem.pointer === `/${field}`),
            `${type}: /${field} in ${JSON.stringify(problems)}`,
          )
        }
      },
    ),
    { numRuns: 60 },
  )
})

t.test('exact sentences', async (t) => {
  const cases: [string, Record<string, unknown>, string, string][] = [
    ['/api/contacts', { first_name: 'x'.repeat(101) }, '/first_name', 'must be non-empty text of at most 100 characters or null'],
    ['/api/contacts', { first_name: 'Ann', email: 'nope' }, '/email', 'must be an email address or null'],
    ['/api/deals', { name: 'D', amount: 'lots' }, '/amount', 'must be a decimal number such as 1200.50 or null'],
    ['/api/deals', { name: 'D', currency: 'usd' }, '/currency', 'must be a three-letter currency code such as USD'],
    ['/api/deals', { name: 'D', close_date: 'soon' }, '/close_date', 'must be a date such as 2026-12-31 or null'],
  ]
  for (const [path, body, pointer, message] of cases) {
    const response = await server.request('POST', path, { body, token })
    t.equal(response.status, 422)
    t.same(
      ((response.body?.errors ?? []) as Problem[]).find((problem) => problem.pointer === pointer)?.message,
      message,
      `${path} ${pointer}`,
    )
  }
})
