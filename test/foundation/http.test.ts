// The HTTP skeleton: problem+json for every failure, body limits, request ids, health.
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const { members } = await createTenant(server.databaseUrl, { members: { 'ada@acme.test': 'admin' } })
const token = members['ada@acme.test'].token

t.test('health', async (t) => {
  t.same((await server.request('GET', '/healthz')).body, { status: 'ok' })
  const ready = await server.request('GET', '/readyz')
  t.equal(ready.status, 200)
  t.same(
    ready.body,
    { status: 'ready', context_carrier: 'parameter' },
    'the request context travels in the fast carrier (the embedded owner may set it)',
  )
})

t.test('unknown routes answer a JSON problem, never HTML', async (t) => {
  const response = await server.request('GET', '/api/nothing-here')
  t.equal(response.status, 404)
  t.equal(response.headers.get('content-type'), 'application/problem+json')
  t.match(response.body, { type: '/problems/not_found', title: 'Not found', status: 404, code: 'not_found', request_id: /^[0-9a-f-]{36}$/ })
  t.equal(response.body.request_id, response.headers.get('x-request-id'))
})

t.test('a request line and headers over their limit answer a problem too', async (t) => {
  const response = await server.request('GET', `/api/contacts/${'x'.repeat(20_000)}`)
  t.equal(response.status, 431)
  t.equal(response.headers.get('content-type'), 'application/problem+json')
  t.match(response.body, { status: 431, code: 'payload_too_large', request_id: /^[0-9a-f-]{36}$/ })
  t.equal(response.body.request_id, response.headers.get('x-request-id'))
  t.equal((await server.request('GET', '/healthz')).status, 200, 'the server goes on answering')
})

t.test('bodies: invalid JSON, wrong type, too large, not an object', async (t) => {
  const json = { 'content-type': 'application/json' }
  t.equal((await server.request('POST', '/api/token', { raw: '{', headers: json })).body.code, 'invalid_json')
  t.equal((await server.request('POST', '/api/token', { raw: '[1,2]', headers: json })).body.code, 'invalid_json')
  t.equal(
    (await server.request('POST', '/api/token', { raw: Buffer.from([0x7b, 0xff, 0xfe, 0x7d]), headers: json })).body.code,
    'invalid_json',
  )
  const large = await server.request('POST', '/api/token', { raw: JSON.stringify({ email: 'x'.repeat(1024 * 1024 + 10) }), headers: json })
  t.equal(large.status, 413)
  t.equal(large.body.code, 'payload_too_large')
  const text = await server.request('POST', '/api/token', { raw: 'hello', headers: { 'content-type': 'text/plain' } })
  t.equal(text.status, 415)
  t.equal(text.body.code, 'unsupported_media_type')
})

t.test('one JSON log line per request, without secrets', async (t) => {
  server.logLines.length = 0
  await server.request('GET', '/api/me', { token, headers: { 'X-Request-Id': 'log-probe-1' } })
  const line = server.logLines.map((text) => JSON.parse(text)).find((entry) => entry.request_id === 'log-probe-1')
  t.match(line, { level: 'info', msg: 'request', method: 'GET', path: '/api/me', status: 200, ms: Number })
  t.notOk(server.logLines.join('\n').includes(token), 'the token is never logged')
})

t.test('an internal error is a 500 with only the request id', async (t) => {
  // A database that disappeared under a running service: 503 unavailable with Retry-After.
  const broken = await startTestServer(t, { databaseUrl: server.databaseUrl })
  await broken.pool.end()
  const response = await broken.request('GET', '/api/me', { token })
  t.ok([500, 503].includes(response.status))
  t.notMatch(response.text, /select|crm\.|stack|at /i, 'no SQL or stack trace in the body')
  t.ok(response.body.request_id)
})
