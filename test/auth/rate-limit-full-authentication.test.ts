// The rate limit holds whichever way a request authenticates. A token's first request, a token
// named with another X-Tenant-Slug, and a cached identity found stale (a slug-less token whose last
// workspace moved) all take the full crm.authenticate path, which counts in the database and sees
// no process's unsettled requests; the process admits them against its unsettled count too, and
// takes back its own count of a stale identity's request, which crm.authenticate then counts.
// One process, requests one after another: exactly the limit passes, the first ones, whatever the
// mix of paths.
import fc from 'fast-check'
import t from 'tap'
import { addMember, createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const LIMIT = 12
const BATCH = 4
const REQUESTS = 20

// Settled only when a batch fills (the timer's interval is as long as allowed), so unsettled
// requests are there to be missed.
const server = await startTestServer(t, {
  env: { RATE_LIMIT_PER_MINUTE: String(LIMIT), RATE_LIMIT_BATCH: String(BATCH), RATE_LIMIT_SETTLE_MS: '10000' },
})
const first = await createTenant(server.databaseUrl, { members: {} })
const second = await createTenant(server.databaseUrl, { members: {} })

/** How a request authenticates: the user's token without a slug or with either workspace's, or a token minted for it. */
type Kind = 'no slug' | 'first slug' | 'second slug' | 'fresh token'
const KINDS: Kind[] = ['no slug', 'first slug', 'second slug', 'fresh token']

/** Until the clock minute has at least this many seconds left, so one run stays in one window. */
async function windowWithRoom(seconds: number) {
  for (;;) {
    const left = 60 - new Date().getUTCSeconds()
    if (left > seconds) return
    await new Promise((resolve) => setTimeout(resolve, left * 1000))
  }
}

let runs = 0
async function statusesOf(kinds: Kind[]): Promise<number[]> {
  runs++
  // A user of its own per run: nothing counted before.
  const email = `run-${runs}-${Math.random().toString(36).slice(2, 8)}@acme.test`
  const { userId, token } = await withOwner(server.databaseUrl, async (client) => {
    const member = await addMember(client, first.id, email, 'member')
    await addMember(client, second.id, email, 'member')
    return { userId: member.id, token: member.token }
  })
  const fresh = await withOwner(server.databaseUrl, (client) => Promise.all(kinds.map(() => mintToken(client, userId))))
  await windowWithRoom(20)
  const statuses: number[] = []
  for (const [index, kind] of kinds.entries()) {
    const headers: Record<string, string> = {}
    if (kind === 'first slug') headers['x-tenant-slug'] = first.slug
    if (kind === 'second slug') headers['x-tenant-slug'] = second.slug
    const response = await server.request('GET', '/api/me', { token: kind === 'fresh token' ? fresh[index] : token, headers })
    statuses.push(response.status)
  }
  return statuses
}

const expected = [...Array(LIMIT).fill(200), ...Array(REQUESTS - LIMIT).fill(429)]

t.test('slug alternation: every request authenticates in full, and exactly the limit passes', async (t) => {
  const kinds = Array.from({ length: REQUESTS }, (_, i): Kind => (i % 2 === 0 ? 'first slug' : 'second slug'))
  t.same(await statusesOf(kinds), expected)
})

t.test('a stale identity (its last workspace moved) is counted once', async (t) => {
  const cycle: Kind[] = ['first slug', 'no slug', 'second slug', 'no slug']
  const kinds = Array.from({ length: REQUESTS }, (_, i) => cycle[i % cycle.length])
  t.same(await statusesOf(kinds), expected)
})

t.test('unsettled requests, then fresh tokens: the limit holds', async (t) => {
  const kinds: Kind[] = [...Array(BATCH).fill('no slug'), ...Array(REQUESTS - BATCH).fill('fresh token')]
  t.same(await statusesOf(kinds), expected)
})

t.test('any mix of the paths: the first requests up to the limit pass, and no more', async (t) => {
  await fc.assert(
    fc.asyncProperty(fc.array(fc.constantFrom(...KINDS), { minLength: REQUESTS, maxLength: REQUESTS }), async (kinds) => {
      const statuses = await statusesOf(kinds)
      if (JSON.stringify(statuses) !== JSON.stringify(expected)) throw new Error(`${kinds.join(', ')}: ${statuses.join(' ')}`)
    }),
    { numRuns: 10 },
  )
  t.pass('held for every mix tried')
})
