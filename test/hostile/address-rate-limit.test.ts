// The unauthenticated routes are limited per client address (docs/api.md section 3), and forwarding
// headers are believed only from a trusted proxy (TRUST_PROXY): X-Forwarded-For decides the
// address, X-Forwarded-Proto the session cookie's Secure flag. An IPv6 client is counted by its
// /64, which it can rotate through freely; an IPv4-mapped address as the IPv4 address it is.
import type { IncomingMessage } from 'node:http'
import fc from 'fast-check'
import t from 'tap'
import { addressBlock } from '../../src/cidr.ts'
import { createAddressRateLimit } from '../../src/http/address-rate-limit.ts'
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

/** An IPv6 address's eight groups, written out in full or with the longest run of zeros as `::`. */
function ipv6Text(groups: number[], shorten: boolean): string {
  const hex = groups.map((group) => group.toString(16))
  if (!shorten) return hex.join(':')
  let best = { start: -1, length: 0 }
  for (let start = 0; start < 8; start++) {
    let length = 0
    while (start + length < 8 && groups[start + length] === 0) length++
    if (length > best.length) best = { start, length }
  }
  if (best.length < 2) return hex.join(':')
  return `${hex.slice(0, best.start).join(':')}::${hex.slice(best.start + best.length).join(':')}`
}

const group = fc.integer({ min: 0, max: 0xffff })
const ipv6Groups = fc.array(group, { minLength: 8, maxLength: 8 })

t.test('an IPv6 address counts by its /64; an IPv4-mapped one as its IPv4 address', async (t) => {
  await fc.assert(
    fc.property(
      ipv6Groups,
      fc.array(group, { minLength: 4, maxLength: 4 }),
      fc.boolean(),
      fc.boolean(),
      (groups, otherHost, shortA, shortB) => {
        fc.pre(!(groups[0] === 0 && groups[1] === 0 && groups[2] === 0 && groups[3] === 0 && groups[4] === 0))
        const sameNetwork = [...groups.slice(0, 4), ...otherHost]
        const block = addressBlock(ipv6Text(groups, shortA))
        return (
          block === addressBlock(ipv6Text(sameNetwork, shortB)) &&
          block ===
            `${groups
              .slice(0, 4)
              .map((g) => g.toString(16))
              .join(':')}::/64`
        )
      },
    ),
  )
  await fc.assert(
    fc.property(ipv6Groups, fc.integer({ min: 0, max: 3 }), group, (groups, changed, value) => {
      fc.pre(groups[changed] !== value)
      const other = groups.with(changed, value)
      return addressBlock(ipv6Text(groups, true)) !== addressBlock(ipv6Text(other, true))
    }),
  )
  await fc.assert(
    fc.property(fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 4, maxLength: 4 }), (bytes) => {
      const v4 = bytes.join('.')
      const mappedHex = `::ffff:${((bytes[0] << 8) | bytes[1]).toString(16)}:${((bytes[2] << 8) | bytes[3]).toString(16)}`
      return (
        addressBlock(v4) === v4 &&
        addressBlock(`::ffff:${v4}`) === v4 &&
        addressBlock(mappedHex) === v4 &&
        addressBlock(`[::ffff:${v4}]`) === v4
      )
    }),
  )
  t.equal(addressBlock('2001:db8:1:2:3:4:5:6%eth0'), '2001:db8:1:2::/64', 'a zone id changes nothing')
  t.equal(addressBlock('not an address'), 'not an address')
})

t.test('the limit: one /64 shares one count, however many addresses it uses', async (t) => {
  const limit = createAddressRateLimit(3, () => 0)
  const from = (address: string) => ({ socket: { remoteAddress: address }, headers: {} }) as unknown as IncomingMessage
  for (let host = 1; host <= 3; host++) limit(from(`2001:db8:aa:bb::${host}`))
  t.throws(() => limit(from('2001:db8:aa:bb:ffff:ffff:ffff:fff0')), { code: 'rate_limited' }, 'a fourth address of the /64 is refused')
  t.doesNotThrow(() => limit(from('2001:db8:aa:bc::1')), 'the next /64 has its own count')
  for (let attempt = 1; attempt <= 3; attempt++) limit(from('198.51.100.7'))
  t.throws(() => limit(from('::ffff:198.51.100.7')), { code: 'rate_limited' }, 'the IPv4-mapped form is the same client')
})

t.test('behind a trusted proxy: IPv6 clients of one /64 share a count', async (t) => {
  const server = await startTestServer(t, {
    env: { UNAUTHENTICATED_RATE_LIMIT_PER_MINUTE: String(LIMIT), TRUST_PROXY: '127.0.0.1/32, ::1' },
  })
  // 2 × LIMIT + 1 attempts: wherever a minute ends among them, one side of it holds more than LIMIT.
  const statuses: number[] = []
  for (let host = 1; host <= 2 * LIMIT + 1; host++)
    statuses.push((await signIn(server, { 'x-forwarded-for': `2001:db8:77:1:${host.toString(16)}::${host}` })).status)
  t.ok(statuses.includes(429), `a client rotating through its /64 is refused (${statuses.join(' ')})`)
  t.equal((await signIn(server, { 'x-forwarded-for': '2001:db8:77:2::1' })).status, 422, 'another /64 is another client')
})
