// The events feed shows a caller exactly the events of the records it may view (own, team, all)
// with its token's scopes, as the record lists do: a property over random records and owners,
// checked over HTTP and in SQL through crm.act_as (row-level security on crm.events).
import fc from 'fast-check'
import t from 'tap'
import { mintToken, withOwner } from '../helpers/fixtures.ts'
import { until } from '../helpers/until.ts'
import { type Client, clientFor, startWorld } from '../records/helpers.ts'

const OWNERS = ['admin@acme.test', 'ann@acme.test', 'bob@acme.test', 'carol@acme.test', 'dave@acme.test']
const TYPES = [
  { path: 'contacts', event: 'contact', body: (n: number) => ({ first_name: `c${n}` }) },
  { path: 'companies', event: 'company', body: (n: number) => ({ name: `co${n}` }) },
  { path: 'deals', event: 'deal', body: (n: number) => ({ name: `d${n}` }) },
]

t.test('a caller reads the events of the records it may view, with its scopes', async (t) => {
  const world = await startWorld(t, {
    roles: {
      seller: ['deals:view:team', 'contacts:view:own', 'companies:view:all'],
      outsider: [],
    },
    members: { 'carol@acme.test': 'seller', 'dave@acme.test': 'seller', 'nobody@acme.test': 'outsider' },
    teams: { east: ['carol@acme.test', 'ann@acme.test'] },
  })
  const admin = world.as('admin@acme.test')
  const id = (email: string) => world.tenant.members[email].id
  const scoped = async (email: string, scopes: string[]) => {
    const token = await withOwner(world.server.databaseUrl, (client) => mintToken(client, id(email), { scopes }))
    return clientFor(world.server, world.tenant, { ...world.tenant.members[email], token })
  }
  const viewers: { name: string; client: Client; email: string; scopes: string[] | null }[] = [
    ...['admin@acme.test', 'ann@acme.test', 'reader@acme.test', 'carol@acme.test', 'dave@acme.test', 'nobody@acme.test'].map((email) => ({
      name: email,
      client: world.as(email),
      email,
      scopes: null,
    })),
    { name: 'ann with deals:read', client: await scoped('ann@acme.test', ['deals:read']), email: 'ann@acme.test', scopes: ['deals:read'] },
    {
      name: 'carol with contacts:write',
      client: await scoped('carol@acme.test', ['contacts:write']),
      email: 'carol@acme.test',
      scopes: ['contacts:write'],
    },
  ]

  let serial = 0
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.record({ type: fc.integer({ min: 0, max: 2 }), owner: fc.constantFrom(...OWNERS) }), { minLength: 1, maxLength: 6 }),
      async (records) => {
        const cursors = new Map<string, string>()
        for (const viewer of viewers) {
          const start = await viewer.client.get('/api/events?limit=500')
          cursors.set(viewer.name, start.body.next_cursor)
        }
        const created: { path: string; id: string }[] = []
        for (const record of records) {
          const type = TYPES[record.type]
          const response = await admin.post(`/api/${type.path}`, { ...type.body(serial++), owner_id: id(record.owner) })
          if (response.status !== 201) throw new Error(response.text)
          created.push({ path: type.path, id: response.body.data.id })
        }
        // The feed shows a commit once every older transaction of the cluster has ended, another
        // test file's included: compare only once the admin's feed shows all of them, so that no
        // caller's read is early and the next run's cursors start after them.
        await until(
          'the commits are below the feed horizon',
          async () =>
            (await admin.get(`/api/events?limit=500&after=${cursors.get('admin@acme.test')}`)).body.data.length === created.length,
          2400,
        )
        for (const viewer of viewers) {
          // What the record lists show this caller of the records just made: the oracle.
          const listed = new Set<string>()
          for (const type of TYPES) {
            const list = await viewer.client.get(`/api/${type.path}?limit=200`)
            if (list.status === 200) for (const row of list.body.data) listed.add(row.id)
          }
          const expected = created.filter((record) => listed.has(record.id)).map((record) => record.id)
          const feed = await viewer.client.get(`/api/events?limit=500&after=${cursors.get(viewer.name)}`)
          if (feed.status !== 200) throw new Error(`${viewer.name}: ${feed.text}`)
          const seen = feed.body.data.map((event: any) => event.data.object.id)
          if (JSON.stringify(seen) !== JSON.stringify(expected)) {
            throw new Error(`${viewer.name} read ${JSON.stringify(seen)} where the lists show ${JSON.stringify(expected)}`)
          }
          // The same rule in SQL: crm.act_as reads crm.events under the policy.
          const inSql = await withOwner(world.server.databaseUrl, async (client) => {
            await client.query('begin')
            await client.query('select crm.act_as($1, $2, $3)', [viewer.email, 'acme', viewer.scopes])
            const { rows } = await client.query(
              'select record_id::text from crm.events where record_id = any ($1::uuid[]) order by xid, id',
              [created.map((record) => record.id)],
            )
            await client.query('rollback')
            return rows.map((row) => row.record_id)
          })
          if (JSON.stringify(inSql) !== JSON.stringify(expected)) {
            throw new Error(`${viewer.name} reads ${JSON.stringify(inSql)} in SQL where the lists show ${JSON.stringify(expected)}`)
          }
        }
      },
    ),
    { numRuns: 8 },
  )
  t.pass('every viewer read exactly the events of the records it may view')

  // Another workspace's events are never read, whoever asks.
  const other = await admin.get('/api/events?limit=500')
  t.ok(
    other.body.data.every((event: any) => event.workspace.id === world.tenant.id),
    'only the workspace of the request',
  )
})
