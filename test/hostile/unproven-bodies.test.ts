// Bodies sent with a made-up token cannot starve anyone (docs/security.md). A JSON body of an
// authenticated route is read only for a caller the process has proven: a token it has not seen
// is authenticated first, in a short transaction of its own, and a refused one gets its 401 without
// a byte of its body read or a receipt taken. Before, 256 stalled bodies with well-formed fake
// tokens from a few addresses held every JSON body receipt of the process, and every tenant's JSON
// writes and sign-in answered 503 for as long as the bodies were renewed.
import { request as httpRequest } from 'node:http'
import t from 'tap'
import { hashPassword } from '../../src/auth/passwords.ts'
import { newToken } from '../../src/auth/tokens.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { until } from '../helpers/until.ts'

const PASSWORD = 'correct horse battery'
// The default bounds (64 bodies per address, 256 in all); the held bodies stay open for as long as
// the test needs them, however loaded the machine.
const server = await startTestServer(t, { env: { TRUST_PROXY: '127.0.0.1/32,::1/128', BODY_IDLE_TIMEOUT_MS: '600000' } })
const tenant = await createTenant(server.databaseUrl, { members: { 'ada@unproven.test': 'admin', 'bob@unproven.test': 'member' } })
const ada = tenant.members['ada@unproven.test']
const bob = tenant.members['bob@unproven.test']
const owner = await ownerClient(t, server.databaseUrl)
await owner.query('update crm.users set password_hash = $1 where id = $2', [await hashPassword(PASSWORD), ada.id])
t.equal(server.config.jsonBodies.total, 256)

type Stalled = { answered: Promise<number> }

/** A POST of `body` from `address`: a few bytes of it, then nothing. */
function stalledPost(path: string, address: string, headers: Record<string, string>, body: string): Stalled {
  const req = httpRequest(`${server.url}${path}`, {
    method: 'POST',
    agent: false,
    headers: { ...headers, 'content-length': String(body.length), 'x-forwarded-for': address },
  })
  const answered = new Promise<number>((resolve) => {
    req.on('response', (response) => {
      response.resume()
      resolve(response.statusCode ?? 0)
    })
    req.on('error', () => resolve(-1))
  })
  req.write(body.slice(0, 5))
  t.teardown(() => req.destroy())
  return { answered }
}

/** POST /api/contacts from `address` with a fake token, stalled. */
function stalledBody(address: string, token: string): Stalled {
  const body = JSON.stringify({ first_name: 'Stalled', email: 'stalled@example.com' })
  return stalledPost('/api/contacts', address, { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body)
}

/** A form posted to a signed-in page (sign-out) from `address`, with a made-up session cookie when `cookie`, stalled. */
function stalledForm(address: string, cookie: boolean): Stalled {
  const headers: Record<string, string> = { 'content-type': 'application/x-www-form-urlencoded' }
  if (cookie) headers.cookie = `crm_session=${newToken()}`
  return stalledPost('/sign-out', address, headers, 'csrf=' + 'x'.repeat(60))
}

const signIn = () => server.request('POST', '/api/token', { body: { email: ada.email, password: PASSWORD, device_name: 'tests' } })

t.test('300 stalled bodies with fake tokens from five addresses leave the slots of real callers free', async (t) => {
  const stalled: Stalled[] = []
  for (let i = 0; i < 300; i++) stalled.push(stalledBody(`198.51.100.${1 + (i % 5)}`, newToken()))
  // Either every stalled body was answered, or the server holds them: a whole body with a fake
  // token from a sixth address is then refused for want of a receipt.
  const answers: (number | undefined)[] = stalled.map(() => undefined)
  for (const [index, body] of stalled.entries()) {
    body.answered.then((status) => {
      answers[index] = status
    })
  }
  await until('the stalled bodies are answered or held', async () => {
    if (answers.every((status) => status !== undefined)) return true
    const probe = await server.request('POST', '/api/contacts', {
      token: newToken(),
      body: { first_name: 'Probe' },
      headers: { 'x-forwarded-for': '198.51.100.99' },
    })
    return probe.status === 503
  })

  const known = await server.request('POST', '/api/contacts', { token: ada.token, body: { first_name: 'Real', email: 'real@example.com' } })
  t.equal(known.status, 201, "a real user's JSON write is received")
  const first = await server.request('POST', '/api/contacts', {
    token: bob.token,
    body: { first_name: 'First', email: 'first@example.com' },
  })
  t.equal(first.status, 201, 'and so is the first request of a token the process has not seen')
  t.equal((await signIn()).status, 200, 'sign-in is received')
  // 401 after the short authentication (or 503 when the database's admission was full), never read.
  t.ok(
    answers.every((status) => status === 401 || status === 503),
    'every body with a fake token was refused without being read',
  )
})

t.test("300 stalled forms to a signed-in page with made-up session cookies leave sign-in's receipts free", async (t) => {
  for (let i = 0; i < 300; i++) stalledForm(`192.0.2.${1 + (i % 5)}`, true)
  // Held: a whole form with a made-up cookie from a sixth address is refused for want of a receipt.
  await until('the stalled forms are held', async () => {
    const probe = await fetch(`${server.url}/sign-out`, {
      method: 'POST',
      redirect: 'manual',
      headers: {
        'content-type': 'application/x-www-form-urlencoded',
        cookie: `crm_session=${newToken()}`,
        'x-forwarded-for': '192.0.2.99',
      },
      body: 'csrf=x',
    })
    await probe.arrayBuffer()
    return probe.status === 503
  })
  t.equal((await signIn()).status, 200, 'sign-in is received')
  const withoutSession = await stalledForm('192.0.2.50', false).answered
  t.equal(withoutSession, 303, 'a form posted to a signed-in page without a session is sent to sign-in unread')
})
