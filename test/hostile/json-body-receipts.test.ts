// JSON and form bodies being received are bounded, as uploads are: per client address (429
// rate_limited) and in total per process (503 unavailable), each with Retry-After, and a body's
// receipt is given back once it has arrived. Bodies without a caller (sign-in, a page's form, the
// OAuth token endpoint's) hold one set of receipts; the JSON bodies of proven callers another
// (test/hostile/unproven-bodies.test.ts). Slow senders hold their bodies open; the test waits for
// the server to hold them (a probe from the same address is refused), never for time.
import { request as httpRequest } from 'node:http'
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t, {
  env: {
    TRUST_PROXY: '127.0.0.1/32,::1/128',
    JSON_BODIES_PER_ADDRESS: '1',
    JSON_BODIES_TOTAL: '2',
    // The held bodies stay open for as long as the test needs them, however loaded the machine.
    BODY_IDLE_TIMEOUT_MS: '600000',
  },
})
const tenant = await createTenant(server.databaseUrl, { members: { 'ada@bodies.test': 'admin' } })
const token = tenant.members['ada@bodies.test'].token

type Answer = { status: number; headers: Record<string, string | string[] | undefined>; body: any }

const CONTACTS = { path: '/api/contacts', type: 'application/json' }
const OAUTH_TOKEN = { path: '/oauth/token', type: 'application/x-www-form-urlencoded' }
const SIGN_IN = { path: '/sign-in', type: 'application/x-www-form-urlencoded' }
const SIGN_IN_JSON = { path: '/api/token', type: 'application/json' }

/** A body sent over its own connection from `address` (a contact's by default): `first` bytes now, the rest on `finish`. */
function send(address: string, body: string, first = body.length, target = CONTACTS) {
  const req = httpRequest(`${server.url}${target.path}`, {
    method: 'POST',
    agent: false,
    headers: {
      authorization: `Bearer ${token}`,
      'content-type': target.type,
      'content-length': String(Buffer.byteLength(body)),
      'x-forwarded-for': address,
    },
  })
  const answer = new Promise<Answer>((resolve, reject) => {
    req.on('response', (response) => {
      let text = ''
      response.setEncoding('utf8')
      response.on('data', (chunk) => {
        text += chunk
      })
      response.on('end', () =>
        resolve({ status: response.statusCode ?? 0, headers: response.headers, body: parsed(response.headers['content-type'], text) }),
      )
    })
    req.on('error', (error) => (req.writableEnded ? undefined : reject(error)))
  })
  req.write(body.slice(0, first))
  if (first === body.length) req.end()
  return { answer, finish: () => (req.end(body.slice(first)), answer) }
}

/** JSON answers parsed; a page's HTML kept as text. */
function parsed(type: string | undefined, text: string): any {
  return text && type?.includes('json') ? JSON.parse(text) : text
}

let contacts = 0
/** A new contact's body (each with an email of its own). */
const contact = () => JSON.stringify({ first_name: 'Slow', email: `slow-${++contacts}@example.com` })
/** A body refused by validation (422), so probing writes nothing. */
const PROBE = JSON.stringify({ no_such_field: true })

/** Probes `target` from `address` until one is refused with `status` (the held bodies are then being received). */
async function untilRefused(address: string, status: number, target = CONTACTS): Promise<Answer> {
  for (let attempt = 0; ; attempt++) {
    const answer = await send(address, PROBE, undefined, target).answer
    if (answer.status === status) return answer
    if (answer.status !== 422) throw new Error(`a probe answered ${answer.status}`)
    if (attempt === 3000) throw new Error(`no probe from ${address} was refused with ${status}`)
  }
}

t.test('bodies being received are bounded per address (429) and in total (503), and given back', async (t) => {
  const first = send('203.0.113.1', contact(), 10)
  const sameAddress = await untilRefused('203.0.113.1', 429)
  t.equal(sameAddress.body.code, 'rate_limited')
  t.match(sameAddress.body.detail, /request bodies/)
  t.ok(Number(sameAddress.headers['retry-after']) > 0, 'with Retry-After')
  t.equal((await send('203.0.113.2', PROBE).answer).status, 422, 'another address is received meanwhile')

  const second = send('203.0.113.2', contact(), 10)
  const third = await untilRefused('203.0.113.3', 503)
  t.equal(third.body.code, 'unavailable', 'past the total')
  t.ok(Number(third.headers['retry-after']) > 0, 'with Retry-After')

  t.equal((await first.finish()).status, 201, 'a held body is answered once it has arrived')
  t.equal((await second.finish()).status, 201)
  t.equal((await send('203.0.113.1', contact()).answer).status, 201, 'the address and the total have their receipts back')
  t.equal((await send('203.0.113.3', PROBE).answer).status, 422)
})

t.test("forms and sign-in share the receipts of anonymous bodies; a caller's JSON bodies have their own", async (t) => {
  const form = 'grant_type=refresh_token&refresh_token=crmrt_unknown&client_id=unknown'
  const heldForm = send('203.0.113.20', form, 5, OAUTH_TOKEN)
  const signIn = await untilRefused('203.0.113.20', 429, SIGN_IN_JSON)
  t.match(signIn.body.detail, /request bodies/, 'sign-in from the address of a held form is refused')
  const page = await send('203.0.113.20', 'email=a%40b.test&password=x', undefined, SIGN_IN).answer
  t.equal(page.status, 429, "as is a page's form")
  t.match(page.body, /request bodies/, 'in HTML, saying why')
  t.ok(Number(page.headers['retry-after']) > 0, 'with Retry-After')
  t.equal((await send('203.0.113.20', contact()).answer).status, 201, "a caller's JSON body from that address is received")
  const answered = await heldForm.finish()
  t.ok([400, 401].includes(answered.status) && answered.body.error, 'the form is answered by the endpoint once it has arrived')
  t.equal((await send('203.0.113.20', PROBE, undefined, SIGN_IN_JSON).answer).status, 422, 'and its receipt is given back')

  const heldJson = send('203.0.113.21', contact(), 10)
  await untilRefused('203.0.113.21', 429)
  const tokenForm = await send('203.0.113.21', form, undefined, OAUTH_TOKEN).answer
  t.ok([400, 401].includes(tokenForm.status), "a form from the address of a held caller's body is received")
  t.equal((await heldJson.finish()).status, 201)
})

t.test('an IPv6 client counts by its /64, as for uploads', async (t) => {
  const held = send('2001:db8:1:2::1', contact(), 10)
  const neighbour = await untilRefused('2001:db8:1:2:ffff::9', 429)
  t.equal(neighbour.body.code, 'rate_limited', 'another address of the same /64 shares its bound')
  t.equal((await held.finish()).status, 201)
})

t.test('a body that fails (too deep, invalid) gives its receipt back', async (t) => {
  for (let i = 0; i < 3; i++) {
    t.equal((await send('203.0.113.9', `{"a":${'['.repeat(100)}${']'.repeat(100)}}`).answer).status, 400)
  }
  t.equal((await send('203.0.113.9', contact()).answer).status, 201)
})

t.test('the OpenAPI document lists both refusals for a route that takes a body', async (t) => {
  const document = (await server.request('GET', '/api/openapi.json')).body
  const responses = document.paths['/api/contacts'].post.responses
  t.ok(responses['429'] && responses['503'], 'POST /api/contacts documents 429 and 503')
  t.match(document.components.responses.Problem503.description, /bodies at once/)
})
