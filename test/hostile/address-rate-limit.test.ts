// The unauthenticated routes are limited per client address (API.md section 3), and forwarding
// headers are believed only from a trusted proxy (TRUST_PROXY): X-Forwarded-For decides the
// address, X-Forwarded-Proto the session cookie's Secure flag.
import t from 'tap'
import { startTestServer, type TestServer } from '../helpers/server.ts'

const LIMIT = 3

/** Counts are per clock minute: start a test early in a minute so it cannot straddle two. */
async function earlyInAMinute(): Promise<void> {
  const second = new Date().getSeconds()
  if (second > 45) await new Promise((resolve) => setTimeout(resolve, (61 - second) * 1000))
}

function signIn(server: TestServer, headers: Record<string, string> = {}) {
  // An invalid body: answered 422 at once, yet counted like any attempt.
  return server.request('POST', '/api/token', { body: {}, headers })
}

async function preSessionCookie(server: TestServer, headers: Record<string, string>): Promise<string> {
  const response = await fetch(`${server.url}/sign-in`, { headers })
  return response.headers.getSetCookie().join('\n')
}

t.test('without a trusted proxy: the socket address is counted and forwarding headers are ignored', async (t) => {
  const server = await startTestServer(t, { env: { UNAUTHENTICATED_RATE_LIMIT_PER_MINUTE: String(LIMIT) } })
  await earlyInAMinute()
  for (let attempt = 1; attempt <= LIMIT; attempt++)
    t.equal((await signIn(server, { 'x-forwarded-for': `10.0.0.${attempt}` })).status, 422, `attempt ${attempt}`)
  const refused = await signIn(server, { 'x-forwarded-for': '10.0.0.99' })
  t.equal(refused.status, 429, 'a new X-Forwarded-For does not make a new client')
  t.equal(refused.body.code, 'rate_limited')
  t.ok(Number(refused.headers.get('retry-after')) >= 1 && Number(refused.headers.get('retry-after')) <= 60, 'Retry-After within the minute')
  for (const [path, body] of [
    ['/api/signup', {}],
    ['/api/invitations/accept', {}],
    ['/api/token/2fa-challenge', {}],
  ] as const) {
    t.equal((await server.request('POST', path, { body })).status, 429, `${path} shares the count`)
  }
  const page = await fetch(`${server.url}/sign-in`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: 'email=a%40b.c&password=x',
  })
  t.equal(page.status, 429, 'the sign-in page too')
  t.ok(page.headers.get('retry-after'))
  t.notMatch(await preSessionCookie(server, { 'x-forwarded-proto': 'https' }), /Secure/, 'X-Forwarded-Proto from anyone is not believed')
})

t.test('behind a trusted proxy: the first untrusted hop from the right is the client', async (t) => {
  const server = await startTestServer(t, {
    env: { UNAUTHENTICATED_RATE_LIMIT_PER_MINUTE: String(LIMIT), TRUST_PROXY: '127.0.0.1/32, ::1' },
  })
  await earlyInAMinute()
  for (let attempt = 1; attempt <= LIMIT; attempt++) t.equal((await signIn(server, { 'x-forwarded-for': '198.51.100.1' })).status, 422)
  t.equal((await signIn(server, { 'x-forwarded-for': '198.51.100.1' })).status, 429, 'that client is over its limit')
  t.equal(
    (await signIn(server, { 'x-forwarded-for': '198.51.100.1, 127.0.0.1' })).status,
    429,
    'a trusted hop on its right changes nothing',
  )
  t.equal(
    (await signIn(server, { 'x-forwarded-for': '203.0.113.7, 198.51.100.1' })).status,
    429,
    'an address it wrote on the left is not believed',
  )
  t.equal((await signIn(server, { 'x-forwarded-for': '198.51.100.2' })).status, 422, 'another client has its own count')
  t.match(await preSessionCookie(server, { 'x-forwarded-proto': 'https' }), /Secure/, 'X-Forwarded-Proto from the proxy is believed')
  t.notMatch(await preSessionCookie(server, { 'x-forwarded-proto': 'http' }), /Secure/)
})
