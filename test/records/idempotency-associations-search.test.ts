// Idempotency-Key replays, associations with their events, and search ranking.
import t from 'tap'
import { startWorld } from './helpers.ts'

t.test('Idempotency-Key', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  const bob = world.as('bob@acme.test')
  const key = { 'idempotency-key': 'order-42' }
  const first = await ann.post('/api/contacts', { first_name: 'Ann', email: 'ann@globex.com' }, key)
  t.equal(first.status, 201)
  t.equal(first.headers.get('idempotent-replayed'), null)
  const again = await ann.post('/api/contacts', { email: 'ann@globex.com', first_name: 'Ann' }, key)
  t.equal(again.status, 201, 'same status')
  t.equal(again.text, first.text, 'same body, byte for byte (key order in the request does not matter)')
  t.equal(again.headers.get('idempotent-replayed'), 'true')
  t.equal(again.headers.get('location'), first.headers.get('location'))
  const different = await ann.post('/api/contacts', { first_name: 'Someone else' }, key)
  t.equal(different.status, 409)
  t.equal(different.body.code, 'idempotency_conflict')
  const otherPath = await ann.post('/api/companies', { name: 'Ann' }, key)
  t.equal(otherPath.status, 409, 'the same key on another route is another request')
  const bobs = await bob.post('/api/contacts', { first_name: 'Ann', email: 'ann2@globex.com' }, key)
  t.equal(bobs.status, 201, 'keys are per user')
  t.equal(bobs.headers.get('idempotent-replayed'), null)
  const { rows } = await world.owner(`select count(*)::int as n from crm.contacts`)
  t.equal(rows[0].n, 2, 'the replay created nothing')

  const failed = await ann.post('/api/contacts', { email: 'not-an-email' }, { 'idempotency-key': 'bad-1' })
  t.equal(failed.status, 422)
  const retried = await ann.post('/api/contacts', { email: 'fixed@globex.com' }, { 'idempotency-key': 'bad-1' })
  t.equal(retried.status, 201, 'a failed request does not use up its key')

  const parallel = await Promise.all(
    Array.from({ length: 5 }, () => ann.post('/api/deals', { name: 'Once' }, { 'idempotency-key': 'race' })),
  )
  t.same(
    parallel.map((response) => response.status),
    [201, 201, 201, 201, 201],
  )
  t.equal(new Set(parallel.map((response) => response.body.data.id)).size, 1, 'concurrent retries create one deal')
  t.equal(parallel.filter((response) => response.headers.get('idempotent-replayed') === 'true').length, 4)

  await world.owner(`update crm.idempotency_keys set expires_at = now() - interval '1 second' where key = 'order-42' and user_id = $1`, [
    ann.member.id,
  ])
  const { rows: pruned } = await world.owner(`select * from crm.housekeeping(30) where step = 'crm.prune_idempotency_keys'`)
  t.equal(Number(pruned[0].removed), 1, 'housekeeping removes expired keys')
  const afterExpiry = await ann.post('/api/contacts', { first_name: 'New', email: 'new@globex.com' }, key)
  t.equal(afterExpiry.status, 201)
  t.equal(afterExpiry.headers.get('idempotent-replayed'), null, 'after 24 hours a key is new again')
})

t.test('associations', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  const bob = world.as('bob@acme.test')
  const deal = (await ann.post('/api/deals', { name: 'Renewal' })).body.data
  const c1 = (await ann.post('/api/contacts', { first_name: 'One' })).body.data
  const c2 = (await ann.post('/api/contacts', { first_name: 'Two' })).body.data
  const c3 = (await bob.post('/api/contacts', { first_name: 'Three' })).body.data
  const company = (await ann.post('/api/companies', { name: 'Globex' })).body.data

  t.same((await ann.get(`/api/associations/deals/${deal.id}`)).body.data, { contacts: [], companies: [] })
  const put = await ann.put(`/api/associations/deals/${deal.id}`, { contacts: [c1.id, c2.id], companies: [company.id] })
  t.equal(put.status, 200, put.text)
  t.same(put.body.data, { contacts: [c1.id, c2.id], companies: [company.id] })
  t.same(
    (await ann.get(`/api/associations/contacts/${c1.id}`)).body.data,
    { companies: [], deals: [deal.id] },
    'links work both ways; the record’s own type is absent',
  )

  const replace = await ann.put(`/api/associations/deals/${deal.id}`, { contacts: [c2.id, c3.id] })
  t.same(replace.body.data, { contacts: [c2.id, c3.id], companies: [company.id] }, 'a key not sent stays as it is')
  t.same((await ann.put(`/api/associations/deals/${deal.id}`, { contacts: [c2.id, c3.id] })).status, 200)

  const { rows } = await world.owner(`select event, record_id, data from crm.events where data ? 'associations_changed' order by id`)
  t.same(
    rows.map((row) => [row.event, row.record_id]),
    [
      ['deal.updated', deal.id],
      ['deal.updated', deal.id],
    ],
    'one event per change, none for a no-op',
  )
  t.same(rows[0].data.associations_changed, {
    contacts: { added: [c1.id, c2.id], removed: [] },
    companies: { added: [company.id], removed: [] },
  })
  t.same(rows[1].data.associations_changed, { contacts: { added: [c3.id], removed: [c1.id] } })
  t.equal(rows[1].data.object.id, deal.id)

  const bad = await ann.put(`/api/associations/deals/${deal.id}`, { contacts: [c1.id, '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'] })
  t.equal(bad.status, 422)
  t.equal(bad.body.errors[0].pointer, '/contacts/1')
  t.equal((await ann.put(`/api/associations/deals/${deal.id}`, { deals: [deal.id] })).status, 422, 'the record’s own type is not a key')
  t.equal(
    (await ann.put(`/api/associations/deals/${deal.id}`, { contacts: Array.from({ length: 1001 }, () => c1.id) })).status,
    422,
    'at most 1,000 ids',
  )
  t.equal((await bob.put(`/api/associations/deals/${deal.id}`, { contacts: [] })).status, 403, 'needs update on the addressed record')
  t.equal((await ann.get('/api/associations/deals/01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a')).status, 404)
  t.equal((await ann.get(`/api/associations/users/${deal.id}`)).status, 404)

  t.equal((await ann.del(`/api/contacts/${c2.id}`)).status, 204)
  t.same((await ann.get(`/api/associations/deals/${deal.id}`)).body.data.contacts, [c3.id], 'deleting a record removes its links')
})

t.test('links to records the caller cannot see are neither shown nor removed', async (t) => {
  const world = await startWorld(t, {
    roles: { own_viewer: ['deals:view:own', 'deals:update:own', 'contacts:view:own'] },
    members: { 'olga@acme.test': 'own_viewer' },
  })
  const admin = world.as('admin@acme.test')
  const olga = world.as('olga@acme.test')
  const olgaId = world.tenant.members['olga@acme.test'].id
  const deal = (await admin.post('/api/deals', { name: 'Shared', owner_id: olgaId })).body.data
  const mine = (await admin.post('/api/contacts', { first_name: 'Mine', owner_id: olgaId })).body.data
  const hidden = (await admin.post('/api/contacts', { first_name: 'Hidden' })).body.data
  await admin.put(`/api/associations/deals/${deal.id}`, { contacts: [mine.id, hidden.id] })
  t.same((await olga.get(`/api/associations/deals/${deal.id}`)).body.data, { contacts: [mine.id], companies: [] })
  t.equal((await olga.put(`/api/associations/deals/${deal.id}`, { contacts: [hidden.id] })).status, 422, 'cannot link what she cannot see')
  t.same((await olga.put(`/api/associations/deals/${deal.id}`, { contacts: [] })).body.data.contacts, [])
  t.same((await admin.get(`/api/associations/deals/${deal.id}`)).body.data.contacts, [hidden.id], 'the hidden link stays')
})

t.test('search', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  await ann.post('/api/contacts', { first_name: 'Ann', last_name: 'Lee', email: 'ann.lee@globex.com', phone: '+1 (555) 010-0199' })
  await ann.post('/api/contacts', { first_name: 'Joanna', last_name: 'Annison', email: 'jo@initech.com' })
  await ann.post('/api/contacts', { first_name: 'Anneliese', email: 'anneliese@example.com' })
  await ann.post('/api/contacts', { first_name: 'Zed', email: 'zed@example.com' })
  await ann.post('/api/companies', { name: 'Globex Corporation', domain: 'globex.com', phone: '555-867-5309' })
  await ann.post('/api/companies', { name: 'Initech', domain: 'initech.com' })
  await ann.post('/api/deals', { name: 'Globex renewal 2027' })
  await ann.post('/api/deals', { name: 'Annual support' })

  const people = await ann.get('/api/contacts/search?q=ann')
  t.equal(people.status, 200, people.text)
  const firstNames = people.body.data.map((row: any) => row.first_name)
  t.equal(firstNames[0], 'Ann', 'the exact match first')
  t.same(firstNames.slice(1).sort(), ['Anneliese', 'Joanna'].sort(), 'then prefix and substring matches')
  t.ok(people.body.data.length === 3)
  t.notOk(firstNames.includes('Zed'))

  t.equal((await ann.get('/api/contacts/search?q=5550100199')).body.data[0]?.first_name, 'Ann', 'phone digits')
  t.equal((await ann.get('/api/contacts/search?q=555-010-0199')).body.data[0]?.first_name, 'Ann', 'phone with punctuation')
  t.equal((await ann.get('/api/contacts/search?q=ANN.LEE@GLOBEX.COM')).body.data[0]?.first_name, 'Ann', 'email, any case')
  t.equal((await ann.get('/api/companies/search?q=globex.com')).body.data[0]?.name, 'Globex Corporation', 'domain')
  t.equal((await ann.get('/api/companies/search?q=Globx')).body.data[0]?.name, 'Globex Corporation', 'a typo still finds it (trigram)')
  t.equal((await ann.get('/api/deals/search?q=renewal')).body.data[0]?.name, 'Globex renewal 2027', 'deal names')
  t.same((await ann.get('/api/deals/search?q=%25')).body.data, [], '% is a literal, not a wildcard')

  const paged = await ann.get('/api/contacts/search?q=ann&limit=1')
  t.equal(paged.body.data.length, 1)
  t.ok(paged.body.next_cursor)
  const rest = await ann.get(`/api/contacts/search?q=ann&limit=5&cursor=${paged.body.next_cursor}`)
  t.same(
    [...paged.body.data, ...rest.body.data].map((row: any) => row.first_name),
    firstNames,
    'search pages like a list',
  )
  const filtered = await ann.get('/api/contacts/search?q=ann&filter[email][contains]=example')
  t.same(
    filtered.body.data.map((row: any) => row.first_name),
    ['Anneliese'],
    'filters apply to search',
  )
  const sorted = await ann.get('/api/contacts/search?q=ann&sort=-first_name')
  t.same(
    sorted.body.data.map((row: any) => row.first_name),
    ['Joanna', 'Anneliese', 'Ann'],
    'an explicit sort replaces the ranking',
  )

  const global = await ann.get('/api/search?q=globex&limit=10')
  t.equal(global.status, 200)
  const types = global.body.data.map((hit: any) => hit.type)
  t.same(new Set(types), new Set(['company', 'contact', 'deal']))
  const top = global.body.data[0]
  t.match(top, { type: 'company', title: 'Globex Corporation', subtitle: 'globex.com' })
  t.equal(top.record.domain, 'globex.com')
  t.ok(
    global.body.data.every((hit: any, i: number, all: any[]) => i === 0 || all[i - 1].score >= hit.score),
    'best first',
  )
  const onlyDeals = await ann.get('/api/search?q=globex&types=deals')
  t.same(
    onlyDeals.body.data.map((hit: any) => hit.type),
    ['deal'],
  )
  t.equal((await ann.get('/api/search?q=an&limit=2')).body.data.length, 2, 'limit')
  t.same((await world.as('reader@acme.test').get('/api/search?q=zzzzqqq')).body.data, [])
})
