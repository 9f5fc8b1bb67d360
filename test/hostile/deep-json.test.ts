// A JSON body that nests objects and arrays deeper than MAX_JSON_DEPTH is 400 invalid_json before
// it is parsed or walked: never a 500 from a recursion that ran out of stack. An unknown token is
// refused (401) before its body is read at all. The depth is counted on the text in one pass, and the walks over
// request values either loop (validation's string check) or rely on that bound (typebox,
// idempotency's canonical form).
import fc from 'fast-check'
import t from 'tap'
import { jsonNestsDeeperThan, MAX_JSON_DEPTH } from '../../src/http/body.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

/** The nesting of a parsed value, counted with a loop (the value may be deep). */
function depthOf(value: unknown): number {
  let deepest = 0
  const pending: { value: unknown; depth: number }[] = [{ value, depth: 0 }]
  while (pending.length > 0) {
    const { value: item, depth } = pending.pop()!
    if (item === null || typeof item !== 'object') continue
    deepest = Math.max(deepest, depth + 1)
    for (const child of Object.values(item)) pending.push({ value: child, depth: depth + 1 })
  }
  return deepest
}

t.test('the text scan agrees with the parsed depth, brackets and escapes inside strings included', async () => {
  const tricky = fc.constantFrom('[', ']', '{', '}', '"', '\\', '\\"', '\\\\', '\\u005b', 'x')
  const value = fc.letrec((tie) => ({
    node: fc.oneof(
      { depthSize: 'small' },
      fc.array(tricky).map((parts) => parts.join('')),
      fc.integer(),
      fc.array(tie('node'), { maxLength: 3 }),
      fc.dictionary(
        fc.array(tricky).map((parts) => parts.join('')),
        tie('node'),
        { maxKeys: 3 },
      ),
    ),
  })).node
  fc.assert(
    fc.property(value, fc.integer({ min: 0, max: 8 }), (item, max) => {
      const text = JSON.stringify(item)
      return jsonNestsDeeperThan(text, max) === depthOf(JSON.parse(text)) > max
    }),
  )
})

const server = await startTestServer(t)
const tenant = await createTenant(server.databaseUrl, { members: { 'ada@deep.test': 'admin' } })
const realToken = tenant.members['ada@deep.test'].token
const fakeToken = `crm_${'A'.repeat(43)}`

const nested = (open: string, close: string, depth: number, inner: string) => open.repeat(depth) + inner + close.repeat(depth)
const bodies = {
  'an object 5,000 deep': nested('{"a":', '}', 5000, '1'),
  'an array 3,000 deep in a contact': `{"first_name":"Ada","custom_fields":{"k":${nested('[', ']', 3000, '')}}}`,
  [`one level past ${MAX_JSON_DEPTH}`]: `{"first_name":"Ada","custom_fields":{"k":${nested('[', ']', MAX_JSON_DEPTH - 1, '')}}}`,
}

for (const [name, text] of Object.entries(bodies)) {
  t.test(`${name}: 400 invalid_json with a real token; an unknown one is refused unread`, async (t) => {
    const response = await server.request('POST', '/api/contacts', {
      token: realToken,
      raw: text,
      headers: { 'content-type': 'application/json' },
    })
    t.equal(response.status, 400, response.text)
    t.equal(response.body.code, 'invalid_json')
    t.match(response.body.detail, `deeper than ${MAX_JSON_DEPTH} levels`)
    // Authenticated before its body is read (test/hostile/unproven-bodies.test.ts).
    const unknown = await server.request('POST', '/api/contacts', {
      token: fakeToken,
      raw: text,
      headers: { 'content-type': 'application/json' },
    })
    t.equal(unknown.status, 401, unknown.text)
    t.equal(unknown.body.code, 'token_invalid')
  })
}

t.test(`a body at ${MAX_JSON_DEPTH} levels is parsed and judged by its schema`, async (t) => {
  const text = `{"first_name":"Ada","custom_fields":{"k":${nested('[', ']', MAX_JSON_DEPTH - 2, '')}}}`
  const response = await server.request('POST', '/api/contacts', {
    token: realToken,
    raw: text,
    headers: { 'content-type': 'application/json' },
  })
  t.equal(response.status, 422, response.text)
  t.equal(response.body.errors[0].pointer, '/custom_fields/k')
})

t.test('nothing failed on the server: no 500, no stack in the log', async (t) => {
  t.notOk(
    server.logLines.some((line) => line.includes('"status":500') || line.includes('stack') || line.includes('request failed')),
    'no failure logged',
  )
})
