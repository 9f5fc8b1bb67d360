// A string PostgreSQL cannot store (a NUL character, a lone UTF-16 surrogate) is refused with
// 422 validation_failed and its pointer wherever it sits in a JSON body, and a UI form with a NUL
// is a 4xx page: never a 500. (Query strings and headers are refused by their own parsers:
// src/records/query-string.ts, the slug check in authenticate.ts, idempotency.ts.)
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const tenant = await createTenant(server.databaseUrl, { plan: 'pro', members: { 'ada@nul.test': 'admin' } })
const token = tenant.members['ada@nul.test'].token

const NUL = '\u0000nul'
const LONE_SURROGATE = 'lone \ud800 surrogate'

/** The body as JSON text with JSON's own escapes, so the lone surrogate travels as \ud800. */
function send(method: string, path: string, body: unknown, withToken = true) {
  return server.request(method, path, {
    raw: JSON.stringify(body),
    headers: { 'content-type': 'application/json' },
    token: withToken ? token : undefined,
  })
}

const cases: { name: string; method: string; path: string; body: (bad: string) => unknown; pointer: string; auth?: boolean }[] = [
  { name: 'company name', method: 'POST', path: '/api/companies', body: (bad) => ({ name: bad }), pointer: '/name' },
  { name: 'contact first name', method: 'POST', path: '/api/contacts', body: (bad) => ({ first_name: bad }), pointer: '/first_name' },
  { name: 'deal name', method: 'POST', path: '/api/deals', body: (bad) => ({ name: bad }), pointer: '/name' },
  {
    name: 'custom field value',
    method: 'POST',
    path: '/api/companies',
    body: (bad) => ({ name: 'ok', custom_fields: { tier: bad } }),
    pointer: '/custom_fields/tier',
  },
  {
    name: 'custom field key',
    method: 'POST',
    path: '/api/companies',
    body: (bad) => ({ name: 'ok', custom_fields: { [bad]: 'x' } }),
    pointer: '/custom_fields/\u0000nul',
  },
  {
    name: 'webhook name',
    method: 'POST',
    path: '/api/webhook-subscriptions',
    body: (bad) => ({ url: 'https://hooks.example.com/x', events: ['*'], name: bad }),
    pointer: '/name',
  },
  { name: 'team name', method: 'POST', path: '/api/teams', body: (bad) => ({ name: bad }), pointer: '/name' },
  {
    name: 'invitation email',
    method: 'POST',
    path: '/api/invitations',
    body: (bad) => ({ email: `x${bad}@example.com`, role: 'member' }),
    pointer: '/email',
  },
  {
    name: 'signup name',
    method: 'POST',
    path: '/api/signup',
    body: (bad) => ({ email: 'new@nul.test', password: 'long enough password', name: bad, workspace_name: 'Nul' }),
    pointer: '/name',
    auth: false,
  },
  {
    name: 'token device name',
    method: 'POST',
    path: '/api/token',
    body: (bad) => ({ email: 'ada@nul.test', password: 'whatever it is', device_name: bad }),
    pointer: '/device_name',
    auth: false,
  },
  {
    name: 'token password',
    method: 'POST',
    path: '/api/token',
    body: (bad) => ({ email: 'ada@nul.test', password: bad, device_name: 'x' }),
    pointer: '/password',
    auth: false,
  },
  {
    name: 'invitation accept token',
    method: 'POST',
    path: '/api/invitations/accept',
    body: (bad) => ({ token: bad, password: 'long enough password', name: 'x' }),
    pointer: '/token',
    auth: false,
  },
]

for (const [kind, bad] of [
  ['NUL', NUL],
  ['lone surrogate', LONE_SURROGATE],
] as const) {
  t.test(`a ${kind} in a JSON body is 422 with its pointer`, async (t) => {
    for (const item of cases) {
      const response = await send(item.method, item.path, item.body(bad), item.auth !== false)
      t.equal(response.status, 422, `${item.name}: ${response.text.slice(0, 200)}`)
      t.equal(response.body?.code, 'validation_failed', item.name)
      const pointer = item.pointer.replace(NUL, bad)
      t.ok(
        response.body?.errors?.some((error: { pointer: string }) => error.pointer === pointer),
        `${item.name}: pointer ${JSON.stringify(pointer)} in ${JSON.stringify(response.body?.errors)}`,
      )
    }
  })
}

t.test('a NUL in a UI form field is a 4xx page, never a 500', async (t) => {
  const shown = await fetch(`${server.url}/sign-in`)
  const cookie = (shown.headers.getSetCookie() ?? []).map((line) => line.split(';')[0]).join('; ')
  const csrf = /name="csrf" value="([^"]+)"/.exec(await shown.text())?.[1] ?? ''
  t.ok(csrf, 'the sign-in form carries a CSRF token')
  const response = await fetch(`${server.url}/sign-in`, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded', cookie },
    body: `csrf=${encodeURIComponent(csrf)}&email=ada%00%40nul.test&password=whatever+it+is`,
  })
  t.ok(response.status >= 400 && response.status < 500, `status ${response.status}`)
})
