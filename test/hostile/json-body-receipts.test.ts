// JSON bodies being received are bounded, as uploads are: per client address (429 rate_limited)
// and in total per process (503 unavailable), each with Retry-After, and a body's receipt is given
// back once it has arrived. Slow senders hold their bodies open; the test waits for the server to
// hold them (a probe from the same address is refused), never for time.
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

/** A contact's body sent over its own connection from `address`: `first` bytes now, the rest on `finish`. */
function send(address: string, body: string, first = body.length) {
  const req = httpRequest(`${server.url}/api/contacts`, {
    method: 'POST',
    agent: false,
    headers: {
      authorization: `Bearer ${token}`,
      'content-type': 'application/json',
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
        resolve({ status: response.statusCode ?? 0, headers: response.headers, body: text ? JSON.parse(text) : null }),
      )
    })
    req.on('error', (error) => (req.writableEnded ? undefined : reject(error)))
  })
  req.write(body.slice(0, first))
  if (first === body.length) req.end()
  return { answer, finish: () => (req.end(body.slice(first)), answer) }
}

let contacts = 0
/** A new contact's body (each with an email of its own). */
const contact = () => JSON.stringify({ first_name: 'Slow', email: `slow-${++contacts}@example.com` })
/** A body refused by validation (422), so probing writes nothing. */
const PROBE = JSON.stringify({ no_such_field: true })

/** Probes from `address` until one is refused with `status` (the held bodies are then being received). */
async function untilRefused(address: string, status: number): Promise<Answer> {
  for (let attempt = 0; ; attempt++) {
    const answer = await send(address, PROBE).answer
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
