// Hostile strings cost time linear in their length: every pattern of a request schema is on the
// list below with the reason it cannot backtrack more than linearly, every string with a pattern
// or a format has a maxLength (checked before any pattern runs), and an anonymous client is
// refused before its body is read. The figures printed are diagnostics, never assertions.
import t from 'tap'
import { JSON_BODY_LIMIT } from '../../src/http/body.ts'
import { plainSchema } from '../../src/http/openapi.ts'
import type { RouteDefinition } from '../../src/http/route.ts'
import { allRoutes } from '../../src/http/routes/index.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

/**
 * Patterns reviewed as linear for a backtracking engine. A new pattern fails this test until it is
 * added here with its reason: anchored, no nested quantifiers, and no two neighbouring repetitions
 * that can match the same character (or, where they can, a bound that keeps the retries linear).
 */
const LINEAR_PATTERNS: Record<string, string> = {
  '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$': 'fixed-length groups between literal hyphens',
  '^[a-z][a-z0-9_]{0,62}$': 'one bounded repetition',
  '^\\d{1,16}(\\.\\d{1,2})?$': 'bounded digits; the optional part starts with a literal dot the digits cannot match',
  '^\\d{4}-\\d{2}-\\d{2}$': 'fixed length',
  '^[A-Z]{3}$': 'fixed length',
  '^[^\\s@]+@[^\\s@]+\\.[^\\s@.]+$':
    'the local part stops at the only @; the domain gives back one character at a time and the tail [^\\s@.]+$ is tried once from each dot, over its own dot-free segment: O(n) in all',
  '^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)+[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.?$':
    'each repeated label ends at a literal dot its characters cannot match, and a label is at most 63 characters: O(63 n)',
  '^\\+?[ ().\\-/]*[0-9][0-9 ().\\-/]*( ?([xX]|[eE][xX][tT]\\.?|#) ?[0-9]{1,10})?$':
    'the leading punctuation cannot match the first digit, so the number splits one way; the extension starts with a letter or # the number cannot match',
  '^[Hh][Tt][Tt][Pp][Ss]?://[^\\s/?#]\\S*$': 'one repetition after single characters',
  '^\\s*[^@\\s]+@[^@\\s][^@\\s.]*\\.[^@\\s]+\\s*$': 'neighbouring repetitions are disjoint (white space, non-dots then a dot, non-space)',
  '\\S': 'one character class, unanchored: one test per position',
  '^\\s*\\d{6}\\s*$': 'white space and digits are disjoint',
  '^(\\*|(contact|company|deal)\\.(\\*|created|updated|deleted))$': 'alternatives of literals',
  '^(contacts|companies|deals):(view|create|update|delete|import|export):(own|team|all)$': 'alternatives of literals',
  '^.*$': 'one repetition of any character but a line break',
}

/** The formats typebox checks with its own expressions, each run only within a maxLength. */
const CHECKED_FORMATS = new Set(['uuid', 'date', 'date-time', 'uri', 'email'])

type JsonSchema = Record<string, any>
type StringField = { pointer: string; schema: JsonSchema; wrap: (value: string) => unknown }

/** Every string a body schema accepts, with a function that puts a value at its place in a body. */
function stringFields(schema: JsonSchema, pointer = '', wrap: (value: unknown) => unknown = (value) => value): StringField[] {
  const found: StringField[] = []
  if (schema.type === 'string' && schema.const === undefined && schema.enum === undefined)
    found.push({ pointer: pointer || '/', schema, wrap: wrap as (value: string) => unknown })
  for (const variant of schema.anyOf ?? []) found.push(...stringFields(variant, pointer, wrap))
  for (const [name, property] of Object.entries<JsonSchema>(schema.properties ?? {})) {
    found.push(...stringFields(property, `${pointer}/${name}`, (value) => wrap({ [name]: value })))
  }
  for (const value of Object.values<JsonSchema>(schema.patternProperties ?? {})) {
    found.push(...stringFields(value, `${pointer}/key`, (inner) => wrap({ key: inner })))
  }
  if (schema.items) found.push(...stringFields(schema.items, `${pointer}/0`, (value) => wrap([value])))
  return found
}

function patternsOf(schema: JsonSchema, into: string[] = []): string[] {
  if (schema === null || typeof schema !== 'object') return into
  if (typeof schema.pattern === 'string' && schema.type === 'string') into.push(schema.pattern)
  for (const key of Object.keys(schema.patternProperties ?? {})) into.push(key)
  for (const value of Object.values(schema)) if (value !== null && typeof value === 'object') patternsOf(value as JsonSchema, into)
  return into
}

const bodyRoutes = allRoutes().filter(
  (route): route is RouteDefinition & { body: NonNullable<RouteDefinition['body']> } =>
    route.body !== undefined && route.bodyKind !== 'file',
)

t.test('every pattern of a request schema is linear, and every string with a pattern or a format has a maxLength', async (t) => {
  for (const route of bodyRoutes) {
    const schema = plainSchema(route.body)
    for (const pattern of patternsOf(schema)) {
      t.ok(LINEAR_PATTERNS[pattern], `${route.method} ${route.path}: ${pattern} is on the list of linear patterns`)
    }
    for (const field of stringFields(schema)) {
      if (field.schema.pattern === undefined && field.schema.format === undefined) continue
      t.type(field.schema.maxLength, 'number', `${route.method} ${route.path} ${field.pointer} has a maxLength`)
      if (field.schema.format !== undefined)
        t.ok(CHECKED_FORMATS.has(field.schema.format), `${route.method} ${route.path} ${field.pointer}: format ${field.schema.format}`)
    }
  }
})

const server = await startTestServer(t, { env: { RATE_LIMIT_PER_MINUTE: '100000' } })
const tenant = await createTenant(server.databaseUrl, { plan: 'pro', members: { 'ada@hostile.test': 'admin' } })
const token = tenant.members['ada@hostile.test'].token
const SOME_ID = '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'

// Just under the body limit once wrapped in JSON, so the string is parsed and validated.
const HOSTILE_LENGTH = JSON_BODY_LIMIT - 4096
const HOSTILE_STRINGS: Record<string, string> = {
  'digits then a bad character': `${'1'.repeat(HOSTILE_LENGTH - 1)}a`,
  'repeated a@': 'a@'.repeat(HOSTILE_LENGTH / 2),
  'http:// and many dots': `http://${'.'.repeat(HOSTILE_LENGTH - 8)} `,
  'a.a.a... then a bad character': `x@${'a.'.repeat(HOSTILE_LENGTH / 2 - 2)}!`,
}

function concretePath(path: string): string {
  return path.replace(/:[a-z_]+/g, SOME_ID)
}

async function timed(method: string, path: string, body: unknown, withToken: boolean) {
  const started = performance.now()
  const response = await server.request(method, concretePath(path), {
    raw: JSON.stringify(body),
    headers: { 'content-type': 'application/json' },
    token: withToken ? token : undefined,
  })
  return { response, ms: performance.now() - started }
}

t.test('a 1 MiB hostile string in any string field is a quick 4xx problem, with a token and without', async (t) => {
  const slowest: Record<string, { ms: number; where: string }> = {}
  const note = (kind: string, ms: number, where: string) => {
    if (!slowest[kind] || slowest[kind].ms < ms) slowest[kind] = { ms, where }
  }
  // PATCH and PUT share their schema: each schema is probed once.
  const probed = new Set<unknown>()
  for (const route of bodyRoutes) {
    if (probed.has(route.body)) continue
    probed.add(route.body)
    for (const [index, field] of stringFields(plainSchema(route.body)).entries()) {
      for (const [kind, hostile] of Object.entries(HOSTILE_STRINGS)) {
        const where = `${route.method} ${route.path} ${field.pointer} (${kind})`
        const body = field.wrap(hostile)
        const admin = await timed(route.method, route.path, body, true)
        t.ok(admin.response.status >= 400 && admin.response.status < 500, `${where} as admin: ${admin.response.status}`)
        t.equal(admin.response.headers.get('content-type'), 'application/problem+json', `${where}: a problem`)
        note(`${field.schema.pattern ? 'pattern' : field.schema.format ? 'format' : 'plain'} field, ${kind}, as admin`, admin.ms, where)
        // An authenticated route refuses before reading the body, whichever field carries the
        // string: one field per route is enough; open routes validate every field.
        if (route.auth === 'required' && index > 0) continue
        const anonymous = await timed(route.method, route.path, body, false)
        if (route.auth === 'required') t.equal(anonymous.response.status, 401, `${where} without a token`)
        else
          t.ok(
            anonymous.response.status >= 400 && anonymous.response.status < 500,
            `${where} without a token: ${anonymous.response.status}`,
          )
        note(`${route.auth === 'required' ? 'authenticated' : 'open'} route, ${kind}, without a token`, anonymous.ms, where)
      }
    }
  }
  for (const [kind, { ms, where }] of Object.entries(slowest)) t.comment(`slowest answer, ${kind}: ${ms.toFixed(1)} ms at ${where}`)
})

t.test('without a well-formed bearer token the answer is 401 before the body is read', async (t) => {
  for (const authorization of [
    undefined,
    'Bearer',
    'Bearer crm_short',
    `Bearer crm_${'a'.repeat(42)}!`,
    'Basic YTpi',
    `Bearer ${'x'.repeat(43)}`,
  ]) {
    // A body that would be refused as invalid JSON, were it read.
    const response = await fetch(`${server.url}/api/contacts`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(authorization ? { authorization } : {}) },
      body: '{not json',
    })
    t.equal(response.status, 401, `${authorization ?? 'no Authorization'}`)
    t.match((await response.json()).code, /^token_(missing|invalid)$/)
  }
})

t.test('GET /healthz is answered while a hostile request is being validated', async (t) => {
  const order: string[] = []
  const hostile = timed('POST', '/api/contacts', { phone: HOSTILE_STRINGS['digits then a bad character'] }, true).then((result) => {
    order.push('hostile')
    return result
  })
  const health = server.request('GET', '/healthz').then((response) => {
    order.push('health')
    return response
  })
  const [hostileResult, healthResult] = await Promise.all([hostile, health])
  t.equal(healthResult.status, 200)
  t.equal(hostileResult.response.status, 422)
  t.same(order.slice().sort(), ['health', 'hostile'], 'both answered')
  t.comment(`answered in this order: ${order.join(', ')}; the hostile request took ${hostileResult.ms.toFixed(1)} ms`)
})
