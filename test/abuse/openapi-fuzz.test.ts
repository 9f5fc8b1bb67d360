// Every operation of /api/openapi.json, fuzzed from its own description: hostile values in each
// path parameter, query parameter, header and body field (NUL, lone surrogates, 1 MiB strings, huge
// and negative numbers, 1,000 to 5,000 levels of nesting (sent as text), headers up to and past
// 16 KiB, wrong types, unknown fields, unicode), sent as an
// admin, as a read-only member and without a token. Whatever the input: never a 5xx, every error a
// problem+json with a code, every answer shaped as the document says, and /healthz answering
// throughout. Replay a failure with the printed FUZZ_SEED (FUZZ_RUNS sets the cases per operation
// and caller, FUZZ_BUDGET_MS the time they may take, 0 for no limit).
import SwaggerParser from '@apidevtools/swagger-parser'
import fc from 'fast-check'
import t from 'tap'
import { Compile } from 'typebox/schema'
import { MAX_JSON_DEPTH } from '../../src/http/body.ts'
import { addMember, createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer, type TestResponse } from '../helpers/server.ts'

type JsonObject = Record<string, any>

const SEED = Number(process.env.FUZZ_SEED ?? Math.floor(Math.random() * 2 ** 31))
const RUNS = Number(process.env.FUZZ_RUNS ?? 4)
// The whole fuzz stops within this budget, shared evenly by the operations (0: no limit), so a
// loaded machine runs fewer cases rather than hitting the test timeout.
const BUDGET_MS = Number(process.env.FUZZ_BUDGET_MS ?? 40_000)
const MIB = 'x'.repeat(1 << 20)

const server = await startTestServer(t, {
  env: {
    // Thousands of requests from one user: the rate limit is not what this test is about.
    RATE_LIMIT_PER_MINUTE: '1000000',
    WEBHOOK_ALLOW_HTTP: 'true',
    WEBHOOK_ALLOWED_CIDRS: '127.0.0.0/8',
  },
})
const tenant = await createTenant(server.databaseUrl, {
  plan: 'pro',
  members: { 'admin@fuzz.test': 'admin', 'reader@fuzz.test': 'read_only', 'victim@fuzz.test': 'member' },
  teams: { sales: ['victim@fuzz.test'] },
})
const admin = tenant.members['admin@fuzz.test']
const reader = tenant.members['reader@fuzz.test']

// Users whose every token an operation may revoke (DELETE /api/tokens): fresh tokens before each call.
const revokers = await withOwner(server.databaseUrl, async (client) => ({
  admin: await addMember(client, tenant.id, 'admin-revoker@fuzz.test', 'admin'),
  reader: await addMember(client, tenant.id, 'reader-revoker@fuzz.test', 'read_only'),
}))
async function freshToken(userId: string): Promise<string> {
  return withOwner(server.databaseUrl, (client) => mintToken(client, userId))
}

// Real ids, so that some cases reach the handlers behind the lookups.
const ids: string[] = []
async function created(path: string, body: unknown, raw?: { text: string; type: string }): Promise<string> {
  const response = raw
    ? await server.request('POST', path, { token: admin.token, raw: raw.text, headers: { 'content-type': raw.type } })
    : await server.request('POST', path, { token: admin.token, body })
  if (response.status !== 201) throw new Error(`${path} answered ${response.status}: ${response.text.slice(0, 300)}`)
  ids.push(response.body.data.id)
  return response.body.data.id
}
const companyId = await created('/api/companies', { name: 'Acme', domain: 'acme.test' })
await created('/api/contacts', { first_name: 'Ada', email: 'ada@acme.test', company_id: companyId })
await created('/api/deals', { name: 'Big deal', amount: '100.00' })
await created('/api/webhook-subscriptions', { name: 'hook', url: 'http://127.0.0.1:9/hook', events: ['*'] })
await created('/api/contacts/import/upload', null, { text: 'first_name,email\nGrace,grace@acme.test\n', type: 'text/csv' })
await created('/api/roles', { name: 'auditor' })
await created('/api/invitations', { email: 'new@fuzz.test', role: 'member' })
const roleIds = await withOwner(server.databaseUrl, async (client) => {
  const { rows } = await client.query(
    'select id from crm.roles where workspace_id = $1 union all select id from crm.teams where workspace_id = $1',
    [tenant.id],
  )
  return rows.map((row) => row.id as string)
})
ids.push(...roleIds)
// Members the fuzz may suspend, delete or change; never the callers themselves.
const victimIds = [tenant.members['victim@fuzz.test'].id]
const everyUserId = [admin.id, reader.id, ...victimIds]

const documentResponse = await server.request('GET', '/api/openapi.json')
// Named schemas are $refs into components (src/schema-names.ts); the checks below compile plain
// JSON Schema, so the document is read with every reference replaced by what it names.
const document: JsonObject = (await SwaggerParser.dereference(structuredClone(documentResponse.body))) as JsonObject
const problemCheck = Compile(document.components.schemas.Problem)

// --- hostile values -------------------------------------------------------------------------------

const nested = (depth: number, leaf: unknown): unknown => {
  let value = leaf
  for (let i = 0; i < depth; i++) value = i % 2 ? [value] : { a: value }
  return value
}
const hostileStrings = fc.oneof(
  fc.constantFrom(
    '\u0000',
    'a\u0000b',
    '\ud800',
    'x\udc00y',
    '\ufeff',
    '\u202eevil',
    'Ünïcode Ltd 😀',
    'e\u0301\u0301\u0301',
    'ｆｕｌｌｗｉｄｔｈ',
    "' or 1=1 --",
    '%00',
    '%ff%fe',
    '\\',
    '../../etc/passwd',
    '',
    ' ',
    '1e309',
    '-1',
    '-0',
    'NaN',
    'Infinity',
    '99999999999999999999999999',
    '2026-13-45',
    '9999-12-31T23:59:59Z',
    'null',
    'true',
    '{}',
    '[]',
    '*',
    'a'.repeat(300),
    MIB,
    '00000000-0000-0000-0000-000000000000',
    'ffffffff-ffff-ffff-ffff-ffffffffffff',
  ),
  fc.string({ maxLength: 30 }),
  fc.string({ unit: 'binary', maxLength: 30 }),
)
const hostileNumbers = fc.oneof(
  fc.constantFrom(-1, 0, -0, 1.5, 2 ** 31, 2 ** 53 + 2, 2 ** 63, -(2 ** 63), 1e308, -1e308, Number.MIN_VALUE),
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
)
/**
 * A body sent as it is written: nesting this deep cannot go through JSON.stringify, which recurses
 * and overflows. Past MAX_JSON_DEPTH every one is 400 invalid_json, before authentication too.
 */
class RawJson {
  readonly text: string
  constructor(text: string) {
    this.text = text
  }
}
const deepBodies = fc.constantFrom(
  new RawJson(`${'{"a":'.repeat(5000)}1${'}'.repeat(5000)}`),
  new RawJson(`{"name":"n","first_name":"f","custom_fields":{"k":${'['.repeat(3000)}${']'.repeat(3000)}}}`),
  new RawJson(`{"a":${'['.repeat(MAX_JSON_DEPTH)}${']'.repeat(MAX_JSON_DEPTH)}}`),
)
const hostileValue: fc.Arbitrary<unknown> = fc.oneof(
  hostileStrings,
  hostileNumbers,
  fc.constantFrom<unknown>(null, true, false, [], {}, [null], { '': 1 }, { __proto__: 1 }, { constructor: { prototype: 1 } }),
  fc.constantFrom(nested(1000, 'deep'), nested(1000, 1), [MIB]),
  fc.jsonValue({ maxDepth: 3 }),
)

// --- values shaped by the document ----------------------------------------------------------------

function validString(schema: JsonObject, name: string): fc.Arbitrary<string> {
  if (schema.format === 'uuid') {
    const pool = name.includes('owner') || name.includes('user') ? everyUserId : ids
    return fc.oneof(fc.constantFrom(...pool), fc.uuid())
  }
  if (name.includes('email') || String(schema.pattern ?? '').includes('@')) return fc.emailAddress().filter((e) => e.length <= 254)
  if (String(schema.pattern ?? '').includes('contact|company|deal')) {
    return fc.constantFrom('*', 'contact.*', 'deal.created', 'company.deleted')
  }
  if (name === 'url') return fc.constantFrom('http://127.0.0.1:9/hook', 'https://example.com/hook', 'http://10.0.0.1/')
  if (name === 'role') return fc.constantFrom('admin', 'member', 'read_only', 'auditor', 'nope')
  if (name === 'amount') return fc.constantFrom('0', '1.50', '-1', '99999999999999.99', '1e5')
  if (name === 'phone') return fc.constantFrom('+1 555 0100', '555-0100 x12')
  if (name.endsWith('_at') || name.endsWith('_date') || name.endsWith('_since')) {
    return fc.constantFrom('2026-01-01', '2026-01-01T00:00:00Z', '1970-01-01T00:00:00.000Z')
  }
  const min = schema.minLength ?? 0
  return fc.string({ minLength: min, maxLength: Math.max(min, Math.min(schema.maxLength ?? 20, 20)) })
}

/** A value within the schema most of the time, so the handler behind validation is reached. */
function shaped(schema: JsonObject | undefined, name: string, depth = 0): fc.Arbitrary<unknown> {
  if (!schema || depth > 4) return fc.jsonValue({ maxDepth: 1 })
  if (schema.const !== undefined) return fc.constant(schema.const)
  if (schema.enum) return fc.constantFrom(...schema.enum)
  const choices = schema.anyOf ?? schema.oneOf
  if (choices) return fc.oneof(...choices.map((choice: JsonObject) => shaped(choice, name, depth + 1)))
  switch (schema.type) {
    case 'string':
      return validString(schema, name)
    case 'integer':
      return fc.integer({ min: schema.minimum ?? -10, max: Math.min(schema.maximum ?? 1000, 1000) })
    case 'number':
      return fc.double({ min: schema.minimum ?? -1000, max: schema.maximum ?? 1000, noNaN: true })
    case 'boolean':
      return fc.boolean()
    case 'null':
      return fc.constant(null)
    case 'array':
      return fc.array(shaped(schema.items, name, depth + 1), { maxLength: 3 })
    case 'object': {
      const properties = Object.entries<JsonObject>(schema.properties ?? {}).filter(([, property]) => !property.readOnly)
      const record = Object.fromEntries(properties.map(([key, property]) => [key, shaped(property, key, depth + 1)]))
      const patterns = Object.keys(schema.patternProperties ?? {})
      const extra =
        patterns.length > 0
          ? fc.dictionary(fc.stringMatching(/^[a-z][a-z0-9_]{0,8}$/), fc.jsonValue({ maxDepth: 0 }), { maxKeys: 3 })
          : fc.constant({})
      return fc.tuple(fc.record(record, { requiredKeys: schema.required ?? [] }), extra).map(([a, b]) => ({ ...b, ...a }))
    }
    default:
      return fc.jsonValue({ maxDepth: 1 })
  }
}

/** Mostly shaped values with a hostile one here and there. */
const mixed = (schema: JsonObject | undefined, name: string) =>
  fc.oneof({ arbitrary: shaped(schema, name), weight: 2 }, { arbitrary: hostileValue, weight: 1 })

function body(schema: JsonObject): fc.Arbitrary<unknown> {
  const properties = Object.entries<JsonObject>(schema.properties ?? {}).filter(([, property]) => !property.readOnly)
  const fields = fc.record(Object.fromEntries(properties.map(([key, property]) => [key, mixed(property, key)])), {
    requiredKeys: [],
  })
  const unknownFields = fc.dictionary(
    fc.oneof(fc.string({ maxLength: 10 }), fc.constantFrom('__proto__', 'constructor', 'id', '')),
    hostileValue,
    {
      maxKeys: 2,
    },
  )
  return fc.oneof(
    { arbitrary: shaped(schema, 'body'), weight: 2 },
    { arbitrary: fields, weight: 4 },
    { arbitrary: fc.tuple(fields, unknownFields).map(([a, b]) => ({ ...b, ...a })), weight: 1 },
    { arbitrary: hostileValue, weight: 1 },
    { arbitrary: deepBodies, weight: 1 },
  )
}

/** Percent-encoded text, lone surrogates included (as the bytes of their would-be UTF-8). */
function encode(value: string): string {
  return Array.from(value, (char) => {
    try {
      return encodeURIComponent(char)
    } catch {
      return '%ED%A0%80'
    }
  }).join('')
}
const asText = (value: unknown): string => (typeof value === 'string' ? value : (JSON.stringify(value) ?? 'undefined'))

function pathValue(name: string): fc.Arbitrary<string> {
  const pool = name === 'user_id' ? victimIds : ids
  return fc.oneof(
    { arbitrary: fc.constantFrom(...pool), weight: 3 },
    { arbitrary: fc.uuid(), weight: 1 },
    // An empty segment, "." or ".." would address another route (or none), not this one.
    { arbitrary: fc.oneof(hostileStrings, hostileNumbers.map(String)).filter((value) => !['', '.', '..'].includes(value)), weight: 3 },
  )
}

function queryValue(parameter: JsonObject): fc.Arbitrary<[string, string][]> {
  const name = parameter.name
  if (parameter.style === 'deepObject') {
    const key = fc.oneof(
      fc.constantFrom('name', 'email', 'amount', 'stage', 'created_at', 'owner_id', 'company_id', 'custom_fields.x', 'nope', ''),
      hostileStrings.filter((s) => s.length < 100),
    )
    const operator = fc.option(fc.constantFrom('eq', 'ne', 'lt', 'gte', 'in', 'contains', 'starts_with', 'is_null', 'like', '[x]'))
    const deep = fc.constant<[string, string]>([`${name}${'[a]'.repeat(1000)}`, '1'])
    return fc.array(
      fc.oneof(
        fc
          .tuple(key, operator, fc.oneof(hostileStrings, fc.constantFrom('1', 'true', 'a,b')))
          .map(([field, op, value]): [string, string] => [`${name}[${field}]${op ? `[${op}]` : ''}`, value]),
        deep,
      ),
      { maxLength: 3 },
    )
  }
  const value = fc.oneof(
    shaped(parameter.schema, name).map(asText),
    hostileStrings,
    hostileNumbers.map(String),
    fc.constantFrom('1', '100', '101', '-1', '0'),
  )
  // Once, twice (an array where one value is expected), or not at all.
  return fc.oneof(
    fc.constant<[string, string][]>([]),
    value.map((v): [string, string][] => [[name, v]]),
    fc.tuple(value, value).map(([a, b]): [string, string][] => [
      [name, a],
      [name, b],
    ]),
  )
}

// Header values are bytes: only what fetch will send (no NUL, nothing past U+00FF).
const headerValue = fc.oneof(
  fc.string({ maxLength: 40 }).filter((s) => /^[\x20-\x7e]*$/.test(s)),
  // Up to Node's 16 KiB for the request line and headers together, and past it (431).
  fc.constantFrom('*', '"x"', 'W/"1"', '', 'é', 'a'.repeat(8000), '9'.repeat(15_000), 'a'.repeat(17_000)),
)

// --- checks ---------------------------------------------------------------------------------------

const validators = new Map<unknown, ReturnType<typeof Compile>>()
function validatorFor(schema: JsonObject) {
  let validator = validators.get(schema)
  if (!validator) {
    validator = Compile(schema)
    validators.set(schema, validator)
  }
  return validator
}

function check(label: string, operation: JsonObject, response: TestResponse): void {
  const fail = (why: string) => {
    throw new Error(`${label} answered ${response.status} ${why}: ${response.text.slice(0, 400)}`)
  }
  if (response.status >= 500) fail('(a 5xx)')
  const type = response.headers.get('content-type') ?? ''
  if (response.status >= 400) {
    // The OAuth endpoints document their own JSON errors (RFC 6749 section 5.2).
    const documentedError = operation.responses[String(response.status)]?.content?.['application/json']?.schema
    if (documentedError && type.startsWith('application/json')) {
      const [ok, errors] = validatorFor(documentedError).Errors(response.body)
      if (!ok) fail(`with an error body unlike the document's (${JSON.stringify(errors.slice(0, 2))})`)
      return
    }
    if (!type.startsWith('application/problem+json')) fail(`with content-type ${type}`)
    if (!response.body || typeof response.body.code !== 'string') fail('without a code')
    const [ok, errors] = problemCheck.Errors(response.body)
    if (!ok) fail(`with a problem body unlike the document's (${JSON.stringify(errors.slice(0, 2))})`)
    return
  }
  if (response.status === 204 || response.status === 304) return
  const documented = operation.responses[String(response.status)]
  if (!documented) fail('(a status the document does not list)')
  const schema = documented.content?.['application/json']?.schema
  if (!schema || !type.startsWith('application/json')) return
  const [ok, errors] = validatorFor(schema).Errors(response.body)
  if (!ok) fail(`with a body unlike the document's (${JSON.stringify(errors.slice(0, 2))})`)
}

/** The service's last logged errors (a 500's cause is logged, not answered). */
function serverErrors(): string[] {
  return server.logLines
    .filter((line) => line.includes('"level":"error"'))
    .slice(-3)
    .map((line) => line.slice(0, 1500))
}

// --- /healthz, sampled throughout -----------------------------------------------------------------

let fuzzing = true
let healthSamples = 0
let slowestHealth = 0
const healthFailures: string[] = []
const healthLoop = (async () => {
  while (fuzzing) {
    const started = performance.now()
    const response = await fetch(`${server.url}/healthz`).catch((error: Error) => ({ status: 0, statusText: error.message }))
    slowestHealth = Math.max(slowestHealth, performance.now() - started)
    healthSamples++
    if (response.status !== 200) healthFailures.push(`${response.status} ${response.statusText}`)
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
})()

// --- the fuzz -------------------------------------------------------------------------------------

type Operation = { method: string; path: string; operation: JsonObject }
const operations: Operation[] = Object.entries<JsonObject>(document.paths)
  .flatMap(([path, methods]) =>
    Object.entries<JsonObject>(methods).map(([method, operation]) => ({ method: method.toUpperCase(), path, operation })),
  )
  // Deletions last, so the records the other operations use exist while they run.
  .sort((a, b) => Number(a.method === 'DELETE') - Number(b.method === 'DELETE'))

const callers = ['admin', 'read-only member', 'no token'] as const
let cases = 0

t.test('the document describes operations', async (t) => {
  t.equal(documentResponse.status, 200)
  t.ok(operations.length > 50, `${operations.length} operations`)
  t.comment(`FUZZ_SEED=${SEED} FUZZ_RUNS=${RUNS} FUZZ_BUDGET_MS=${BUDGET_MS}: ${operations.length} operations × ${callers.length} callers`)
})

for (const [index, { method, path, operation }] of operations.entries()) {
  t.test(`${method} ${path}`, async (t) => {
    const parameters: JsonObject[] = operation.parameters ?? []
    const bodySchema = operation.requestBody?.content?.['application/json']?.schema
    const input = fc.record({
      caller: fc.constantFrom(...callers.keys()),
      path: fc.record<Record<string, string>>(
        Object.fromEntries(parameters.filter((p) => p.in === 'path').map((p) => [p.name, pathValue(p.name)])),
      ),
      query: fc.array(fc.oneof(...parameters.filter((p) => p.in === 'query').map(queryValue), fc.constant<[string, string][]>([])), {
        maxLength: 3,
      }),
      headers: fc.record(Object.fromEntries(parameters.filter((p) => p.in === 'header').map((p) => [p.name, headerValue])), {
        requiredKeys: [],
      }),
      body: bodySchema ? fc.option(body(bodySchema), { freq: 10 }) : fc.constant(null),
    })
    const details = await fc.check(
      fc.asyncProperty(input, async (input) => {
        cases++
        const url =
          path.replace(/\{(\w+)\}/g, (_, name: string) => encode(input.path[name])) +
          (input.query.length > 0
            ? `?${input.query
                .flat()
                .map(([key, value]) => `${encode(key)}=${encode(value)}`)
                .join('&')}`
            : '')
        const caller = callers[input.caller]
        let token: string | undefined
        if (caller !== 'no token') {
          const revokes = method === 'DELETE' && path === '/api/tokens'
          const user = caller === 'admin' ? (revokes ? revokers.admin : admin) : revokes ? revokers.reader : reader
          token = revokes ? await freshToken(user.id) : user.token
        }
        const response = await server.request(method, url, {
          token,
          headers: input.body instanceof RawJson ? { ...input.headers, 'content-type': 'application/json' } : input.headers,
          ...(input.body instanceof RawJson ? { raw: input.body.text } : input.body !== null ? { body: input.body } : {}),
        })
        if (input.body instanceof RawJson && response.status < 500) {
          const refusedFirst = response.status === 400 || response.status === 401 || response.status === 431
          if (!refusedFirst && response.status !== 404 && response.status !== 405 && response.status !== 415)
            throw new Error(`${method} ${url.slice(0, 200)}: a body nested past ${MAX_JSON_DEPTH} levels answered ${response.status}`)
        }
        check(`${method} ${url.slice(0, 200)} as ${caller}`, operation, response)
      }),
      {
        seed: SEED + index,
        numRuns: RUNS * callers.length,
        endOnFailure: true,
        ...(BUDGET_MS > 0 ? { interruptAfterTimeLimit: BUDGET_MS / operations.length, markInterruptAsFailure: false } : {}),
      },
    )
    // Interrupted by the time budget before any case failed: the cases run stand. fast-check's own
    // report of a failure would print the 1 MiB values whole, so the input is shortened here.
    if (details.failed && details.counterexample !== null) {
      const input = JSON.stringify(details.counterexample?.[0], (_, value) =>
        typeof value === 'string' && value.length > 200 ? `${value.slice(0, 40)}…(${value.length} characters)` : value,
      )
      t.fail(
        `${(details.errorInstance as Error)?.message ?? 'failed'}\n  input: ${input?.slice(0, 2000)}\n  replay: FUZZ_SEED=${SEED} (seed ${details.seed}, path ${details.counterexamplePath})\n  server errors: ${serverErrors().join('\n')}`,
      )
    } else t.pass(`${details.numRuns} cases`)
  })
}

t.test('/healthz answered throughout', async (t) => {
  fuzzing = false
  await healthLoop
  t.same(healthFailures, [], 'every /healthz sample answered 200')
  t.ok(healthSamples > 0)
  t.comment(
    `FUZZ_SEED=${SEED}: ${cases} cases over ${operations.length} operations; /healthz sampled ${healthSamples} times, slowest ${slowestHealth.toFixed(1)} ms`,
  )
})
