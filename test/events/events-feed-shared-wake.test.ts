// Waits of different callers on the same URL, woken by one commit (docs/api.md section 8a): the
// process shares a wake's query only between requests of the same credential (src/http/app.ts,
// runShared), so each waiter answers exactly what its own request without a wait answers now, and
// a caller who may read none of the events keeps waiting. A property over the events of the
// commit (types and owners) and the types filter the callers share.
import fc from 'fast-check'
import t from 'tap'
import { mintToken, withOwner } from '../helpers/fixtures.ts'
import { until } from '../helpers/until.ts'
import { type Client, clientFor, startWorld } from '../records/helpers.ts'

const OWNERS = ['admin@acme.test', 'ann@acme.test', 'bob@acme.test', 'carol@acme.test', 'dave@acme.test']
const RECORD_TYPES = ['contact', 'company', 'deal']
const FILTERS = [null, 'contact.*', 'deal.*,company.created']

type Wait = {
  viewer: { name: string; client: Client }
  gone: AbortController
  answered: boolean
  answer: Promise<{ status: number; body: { data: unknown[] } } | null>
}

t.test('callers waiting on one URL each get what their own request answers', async (t) => {
  const world = await startWorld(t, {
    roles: { seller: ['deals:view:team', 'contacts:view:own', 'companies:view:all'], outsider: [] },
    members: { 'carol@acme.test': 'seller', 'dave@acme.test': 'seller', 'nobody@acme.test': 'outsider' },
    teams: { east: ['carol@acme.test', 'ann@acme.test'] },
  })
  const listener = world.server.feedListener!
  const id = (email: string) => world.tenant.members[email].id
  const scoped = async (email: string, scopes: string[]) => {
    const token = await withOwner(world.server.databaseUrl, (client) => mintToken(client, id(email), { scopes }))
    return clientFor(world.server, world.tenant, { ...world.tenant.members[email], token })
  }
  const viewers: { name: string; client: Client }[] = [
    ...['admin@acme.test', 'ann@acme.test', 'carol@acme.test', 'dave@acme.test', 'nobody@acme.test'].map((email) => ({
      name: email,
      client: world.as(email),
    })),
    { name: 'ann with deals:read', client: await scoped('ann@acme.test', ['deals:read']) },
    { name: 'carol with contacts:write', client: await scoped('carol@acme.test', ['contacts:write']) },
  ]
  const admin = world.as('admin@acme.test')

  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.record({ type: fc.constantFrom(...RECORD_TYPES), owner: fc.constantFrom(...OWNERS) }), { minLength: 1, maxLength: 5 }),
      fc.constantFrom(...FILTERS),
      async (events, filter) => {
        const start = (await admin.get('/api/events?limit=500')).body.next_cursor
        // One URL for every caller: only the credential tells their requests apart.
        const url = `/api/events?after=${start}${filter ? `&types=${filter}` : ''}`
        const waits = viewers.map((viewer) => {
          const wait = { viewer, gone: new AbortController(), answered: false } as Wait
          wait.answer = fetch(`${world.server.url}${url}&wait=30`, {
            headers: { authorization: `Bearer ${viewer.client.member.token}`, 'x-tenant-slug': 'acme' },
            signal: wait.gone.signal,
          })
            .then(async (response) => {
              wait.answered = true
              return { status: response.status, body: await response.json() }
            })
            .catch(() => null)
          return wait
        })
        await until('every caller waits', async () => listener.waiting() === viewers.length)
        const begun = listener.begun()
        // One commit, events of several types and owners.
        await world.owner(
          `insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
           select $1, e.type || '.created', e.type, gen_random_uuid(),
                  jsonb_build_object('object', jsonb_build_object('id', gen_random_uuid(), 'owner_id', e.owner)),
                  '{"type": "system", "id": null, "via": "system"}'
             from unnest($2::text[], $3::uuid[]) as e(type, owner)`,
          [world.tenant.id, events.map((event) => event.type), events.map((event) => id(event.owner))],
        )
        // The feed shows a commit once every older transaction has ended, another test file's in the
        // same cluster included: read what each caller's own request answers only after the admin's
        // shows all of it.
        await until(
          'the commit is below the feed horizon',
          async () => (await admin.get(`/api/events?after=${start}&limit=500`)).body.data.length === events.length,
          2400,
        )
        const expected = new Map<string, unknown[]>()
        for (const viewer of viewers) {
          const own = await viewer.client.get(url)
          if (own.status !== 200) throw new Error(`${viewer.name}: ${own.text}`)
          expected.set(viewer.name, own.body.data)
        }
        const seeing = waits.filter((wait) => (expected.get(wait.viewer.name) ?? []).length > 0)
        const blind = waits.filter((wait) => (expected.get(wait.viewer.name) ?? []).length === 0)
        for (const wait of seeing) {
          const woken = await wait.answer
          if (woken?.status !== 200) throw new Error(`${wait.viewer.name}'s wait answered ${JSON.stringify(woken)}`)
          const want = JSON.stringify(expected.get(wait.viewer.name))
          if (JSON.stringify(woken.body.data) !== want) {
            throw new Error(`${wait.viewer.name} was woken with ${JSON.stringify(woken.body.data)} where its own request reads ${want}`)
          }
        }
        // Those who may read none of it woke, asked, and wait again, with nothing answered.
        await until(
          'the callers who read nothing wait again',
          async () =>
            blind.some((wait) => wait.answered) || (listener.begun() >= begun + blind.length && listener.waiting() === blind.length),
        )
        const answered = blind.filter((wait) => wait.answered).map((wait) => wait.viewer.name)
        for (const wait of blind) wait.gone.abort()
        await until('no wait is left', async () => listener.waiting() === 0)
        if (answered.length > 0) throw new Error(`${answered.join(', ')} answered, where their own requests read nothing`)
      },
    ),
    { numRuns: 10 },
  )
  t.pass('every woken caller answered exactly its own events, and the others kept waiting')
})
