// Long polling on GET /api/events (docs/api.md section 8a): a wait ends when an event of the
// workspace commits, holds no database connection while it waits, is bounded per process (503),
// and still ends when the event only becomes readable after an older transaction ends.
import pg from 'pg'
import t from 'tap'
import type { FeedListener } from '../../src/webhooks/feed-listener.ts'
import { until } from '../helpers/until.ts'
import { startWorld } from '../records/helpers.ts'

const waiting = (listener: FeedListener | null, count: number) => until(`${count} feed waits`, async () => listener!.waiting() >= count)

t.test('a wait ends with the event committed while it waited, from the API or from any writer', async (t) => {
  const world = await startWorld(t)
  const admin = world.as('admin@acme.test')
  const listener = world.server.feedListener
  const start = (await admin.get('/api/events')).body.next_cursor

  const answer = admin.get(`/api/events?wait=30&after=${start}`)
  await waiting(listener, 1)
  const contact = (await admin.post('/api/contacts', { first_name: 'Woken' })).body.data
  const woken = await answer
  t.equal(woken.status, 200, woken.text)
  t.same(
    woken.body.data.map((event: any) => event.data.object.id),
    [contact.id],
    'the waiting request answers the new event',
  )

  // A writer outside the API (an import, the CLI) wakes the wait too: the outbox trigger notifies.
  const next = admin.get(`/api/events?wait=30&after=${woken.body.next_cursor}`)
  await waiting(listener, 1)
  await world.owner(
    `insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
     values ($1, 'deal.created', 'deal', gen_random_uuid(), '{"object": {"id": "x"}}', '{"type": "system", "id": null, "via": "system"}')`,
    [world.tenant.id],
  )
  t.same(
    (await next).body.data.map((event: any) => event.event),
    ['deal.created'],
    'an event written by the owner role wakes it',
  )

  // A client that goes away leaves no wait behind.
  const gone = new AbortController()
  const abandoned = fetch(`${world.server.url}/api/events?wait=30&after=${(await next).body.next_cursor}`, {
    headers: { authorization: `Bearer ${admin.member.token}`, 'x-tenant-slug': 'acme', 'x-request-id': 'abandoned' },
    signal: gone.signal,
  }).catch(() => null)
  await waiting(listener, 1)
  gone.abort()
  await abandoned
  await until('no wait is left', async () => listener!.waiting() === 0)
  t.pass('the wait of a closed connection is gone')
})

t.test('an event that becomes readable without a notification still ends the wait', async (t) => {
  const world = await startWorld(t)
  const admin = world.as('admin@acme.test')
  const listener = world.server.feedListener
  const start = (await admin.get('/api/events')).body.next_cursor
  // An older transaction with an id but no events: the feed reads nothing younger until it ends,
  // and its commit notifies nobody.
  const older = new pg.Client({ connectionString: world.server.databaseUrl })
  await older.connect()
  t.teardown(() => older.end())
  await older.query('begin')
  await older.query('select pg_current_xact_id()')
  const answer = admin.get(`/api/events?wait=30&after=${start}`)
  await waiting(listener, 1)
  const begun = listener!.begun()
  const contact = (await admin.post('/api/contacts', { first_name: 'Held back' })).body.data
  // Woken by the contact's commit, the request found it not yet readable and waits again.
  await until('the request woke, asked and waits again', async () => listener!.begun() > begun && listener!.waiting() === 1)
  await older.query('commit')
  const response = await answer
  t.same(
    response.body.data.map((event: any) => event.data.object.id),
    [contact.id],
    'the wait asks again while events are pending and answers once they are readable',
  )
})

t.test('many waits hold no connection each; past FEED_WAITS_PER_PROCESS the answer is 503', async (t) => {
  const waits = 40
  const world = await startWorld(t, { env: { DB_POOL_SIZE: '4', FEED_WAITS_PER_PROCESS: String(waits) } })
  const admin = world.as('admin@acme.test')
  const listener = world.server.feedListener
  const start = (await admin.get('/api/events')).body.next_cursor
  // Distinct URLs, so that no two requests share a run: each one is a waiting client of its own.
  const answers = Array.from({ length: waits }, (_, index) => admin.get(`/api/events?wait=30&limit=${index + 1}&after=${start}`))
  await waiting(listener, waits)
  const {
    rows: [connections],
  } = await world.owner(
    `select count(*)::int as all, count(*) filter (where state <> 'idle')::int as busy
       from pg_stat_activity where datname = current_database() and usename like 'crm\\_runtime%'`,
  )
  t.ok(connections.all < waits, `${waits} waiting clients, ${connections.all} connections of the API process`)
  t.ok(connections.all <= 4 + 3, 'at most the pool, the statement pool, the settling connection and the listener')
  t.equal(connections.busy, 0, 'none of them busy or in a transaction while the clients wait')

  const full = await admin.get(`/api/events?wait=30&limit=${waits + 1}&after=${start}`)
  t.equal(full.status, 503, full.text)
  t.equal(full.body.code, 'unavailable')
  t.ok(full.headers.get('retry-after'), 'with Retry-After')

  const contact = (await admin.post('/api/contacts', { first_name: 'Everyone' })).body.data
  const results = await Promise.all(answers)
  t.ok(
    results.every((result) => result.status === 200 && result.body.data[0]?.data.object.id === contact.id),
    'every waiting client gets the event',
  )
})
