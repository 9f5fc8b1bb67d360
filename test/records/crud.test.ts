// Create, read, update and delete for each record type over HTTP, with the outbox rows each writes.
import t from 'tap'
import { startWorld } from './helpers.ts'

const TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/

t.test('deals: create, read, update, delete', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')

  const created = await ann.post('/api/deals', { name: 'Globex renewal', amount: '12500.00', close_date: '2026-12-31' })
  t.equal(created.status, 201, created.text)
  const deal = created.body.data
  t.match(deal, {
    name: 'Globex renewal',
    amount: '12500.00',
    currency: 'USD',
    stage: 'lead',
    close_date: '2026-12-31',
    company_id: null,
    owner_id: ann.member.id,
    created_by: ann.member.id,
    updated_by: ann.member.id,
    custom_fields: {},
  })
  t.match(deal.created_at, TIME)
  t.match(deal.stage_changed_at, TIME)
  t.equal(created.headers.get('location'), `/api/deals/${deal.id}`)
  t.ok(created.headers.get('etag'))

  const read = await ann.get(`/api/deals/${deal.id}`)
  t.equal(read.status, 200)
  t.same(read.body.data, deal)
  const etag = read.headers.get('etag')!
  t.equal(etag, created.headers.get('etag'), 'the ETag of a record is the same however it was fetched')
  t.equal((await ann.get(`/api/deals/${deal.id}`, { 'if-none-match': etag })).status, 304)

  const moved = await ann.put(`/api/deals/${deal.id}`, { stage: 'won', id: 'ignored', created_at: 'ignored' }, { 'if-match': etag })
  t.equal(moved.status, 200, moved.text)
  t.equal(moved.body.data.stage, 'won')
  t.equal(moved.body.data.name, 'Globex renewal', 'fields not sent stay as they are')
  t.equal(moved.body.data.id, deal.id, 'read-only fields are ignored')
  t.not(moved.headers.get('etag'), etag)

  const stale = await ann.patch(`/api/deals/${deal.id}`, { name: 'Too late' }, { 'if-match': etag })
  t.equal(stale.status, 412)
  t.equal(stale.body.code, 'precondition_failed')
  t.equal(
    (await ann.patch(`/api/deals/${deal.id}`, { amount: 99.5 }, { 'if-match': moved.headers.get('etag')! })).body.data.amount,
    '99.50',
    'PATCH is an alias; numbers are accepted as money',
  )

  const same = await ann.put(`/api/deals/${deal.id}`, { stage: 'won' })
  t.equal(same.status, 200)
  const nothing = await ann.put(`/api/deals/${deal.id}`, { id: 'only read-only fields', updated_at: 'x' })
  t.equal(nothing.status, 200, 'a body with nothing writable answers the record as it is')
  t.equal(nothing.body.data.updated_at, same.body.data.updated_at, 'and changes nothing')
  t.equal((await world.as('bob@acme.test').put(`/api/deals/${deal.id}`, {})).status, 403, 'still needs update on it')
  t.equal((await ann.put('/api/deals/01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a', {})).status, 404)
  t.equal((await ann.put('/api/deals/01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a', { name: 'x' }, { 'if-match': '*' })).status, 404)
  t.equal(
    (await world.as('bob@acme.test').put(`/api/deals/${deal.id}`, { name: 'x' }, { 'if-match': '*' })).status,
    403,
    'If-Match on a record one may not change',
  )

  const { rows: events } = await world.owner(`select event, data, actor from crm.events where record_id = $1 order by id`, [deal.id])
  t.same(
    events.map((e) => e.event),
    ['deal.created', 'deal.updated', 'deal.updated'],
    'no event for the update that changed nothing',
  )
  t.same(events[0].data.object, deal, 'data.object is the API representation')
  t.same(events[1].data.previous_attributes.stage, 'lead', 'a stage change carries the old stage')
  t.same(Object.keys(events[2].data.previous_attributes), ['amount'])
  t.same(events[1].actor, { type: 'user', id: ann.member.id, via: 'api' })

  t.equal((await ann.del(`/api/deals/${deal.id}`)).status, 204)
  t.equal((await ann.get(`/api/deals/${deal.id}`)).status, 404)
  t.equal((await ann.del(`/api/deals/${deal.id}`)).status, 404)
  const { rows: deleted } = await world.owner(`select data from crm.events where record_id = $1 and event = 'deal.deleted'`, [deal.id])
  t.equal(deleted[0].data.object.amount, '99.50', '.deleted carries the record before deletion')
})

t.test('deals: validation', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  const cases: [unknown, string][] = [
    [{}, '/name'],
    [{ name: '' }, '/name'],
    [{ name: 'x'.repeat(256) }, '/name'],
    [{ name: 'x', amount: '-1' }, '/amount'],
    [{ name: 'x', amount: -1 }, '/amount'],
    [{ name: 'x', amount: '1.234' }, '/amount'],
    [{ name: 'x', amount: 1.234 }, '/amount'],
    [{ name: 'x', currency: 'usd' }, '/currency'],
    [{ name: 'x', stage: 'nope' }, '/stage'],
    [{ name: 'x', close_date: '2026-02-30' }, '/close_date'],
    [{ name: 'x', custom_fields: { Bad: 1 } }, '/custom_fields/Bad'],
    [{ name: 'x', custom_fields: { nested: { a: 1 } } }, '/custom_fields/nested'],
    [{ name: 'x', custom_fields: Object.fromEntries(Array.from({ length: 51 }, (_, i) => [`k${i}`, i])) }, '/custom_fields'],
    [{ name: 'x', company_id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a' }, '/company_id'],
    [{ name: 'x', owner_id: 'nope' }, '/owner_id'],
    [{ name: 'x', colour: 'red' }, '/colour'],
  ]
  for (const [body, pointer] of cases) {
    const response = await ann.post('/api/deals', body)
    t.equal(response.status, 422, `${JSON.stringify(body).slice(0, 60)} → 422 (${response.text.slice(0, 200)})`)
    t.equal(response.body?.errors?.[0]?.pointer, pointer, `${JSON.stringify(body).slice(0, 60)} → ${pointer}`)
  }
  const stages = await ann.get('/api/deal-stages')
  t.same(
    stages.body.data.map((s: { key: string }) => s.key),
    ['lead', 'qualified', 'proposal', 'negotiation', 'won', 'lost'],
  )
  t.same(stages.body.data[4], { key: 'won', label: 'Won', position: 4, is_closed: true, is_won: true })
  const custom = await ann.post('/api/deals', { name: 'x', custom_fields: { tier: 'gold', seats: 12, vip: true, note: null } })
  t.equal(custom.status, 201)
  t.same(custom.body.data.custom_fields, { tier: 'gold', seats: 12, vip: true, note: null })
})

t.test('companies: fields, normalisation, duplicates', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  const created = await ann.post('/api/companies', {
    name: 'Globex',
    domain: 'GLOBEX.com',
    website: 'https://globex.com/about',
    industry: 'Manufacturing',
    phone: '+1 (555) 010-0199 x12',
    city: 'Springfield',
    country: 'US',
    employee_count: 120,
    annual_revenue: '2500000.00',
    description: 'Makes things',
  })
  t.equal(created.status, 201, created.text)
  t.match(created.body.data, { domain: 'globex.com', employee_count: 120, annual_revenue: '2500000.00', phone: '+1 (555) 010-0199 x12' })
  const duplicate = await ann.post('/api/companies', { name: 'Globex 2', domain: 'globex.COM' })
  t.equal(duplicate.status, 409)
  t.equal(duplicate.body.code, 'duplicate')
  t.equal(duplicate.body.errors[0].pointer, '/domain')
  for (const [body, pointer] of [
    [{ name: 'x', domain: 'not a domain' }, '/domain'],
    [{ name: 'x', domain: 'https://globex.com' }, '/domain'],
    [{ name: 'x', website: 'globex.com' }, '/website'],
    [{ name: 'x', employee_count: -1 }, '/employee_count'],
    [{ name: 'x', employee_count: 1.5 }, '/employee_count'],
    [{ name: 'x', annual_revenue: 'lots' }, '/annual_revenue'],
    [{ name: 'x', description: 'x'.repeat(10_001) }, '/description'],
    [{ name: 'x', phone: 'call me' }, '/phone'],
  ] as const) {
    const response = await ann.post('/api/companies', body)
    t.equal(response.status, 422, `${JSON.stringify(body).slice(0, 50)}: ${response.text.slice(0, 150)}`)
    t.equal(response.body?.errors?.[0]?.pointer, pointer)
  }
})

t.test('contacts: fields, email, company link, deleting the company', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  const company = (await ann.post('/api/companies', { name: 'Globex' })).body.data
  const created = await ann.post('/api/contacts', {
    first_name: 'Ann',
    last_name: 'Lee',
    email: 'Ann.Lee@Globex.COM',
    phone: '555 0100',
    job_title: 'CTO',
    city: 'Springfield',
    country: 'US',
    company_id: company.id,
  })
  t.equal(created.status, 201, created.text)
  const contact = created.body.data
  t.equal(contact.email, 'ann.lee@globex.com', 'emails are stored lower-case')
  const duplicate = await ann.post('/api/contacts', { email: 'ANN.LEE@globex.com' })
  t.equal(duplicate.status, 409)
  t.equal(duplicate.body.errors[0].pointer, '/email')
  const nameless = await ann.post('/api/contacts', { job_title: 'Ghost' })
  t.equal(nameless.status, 422, 'at least one of first name, last name or email')
  t.equal((await ann.post('/api/contacts', { email: 'not-an-email' })).body.errors[0].pointer, '/email')
  t.equal((await ann.post('/api/contacts', { first_name: 'x'.repeat(101) })).body.errors[0].pointer, '/first_name')
  t.equal((await ann.post('/api/contacts', { last_name: 'Only' })).status, 201)
  const deal = (await ann.post('/api/deals', { name: 'Renewal', company_id: company.id })).body.data

  t.equal((await ann.del(`/api/companies/${company.id}`)).status, 204)
  t.equal((await ann.get(`/api/contacts/${contact.id}`)).body.data.company_id, null)
  t.equal((await ann.get(`/api/deals/${deal.id}`)).body.data.company_id, null)
  const { rows } = await world.owner(
    `select event, record_id, data from crm.events where event in ('contact.updated', 'deal.updated') order by id`,
  )
  t.same(
    rows.map((row) => [row.event, row.record_id, row.data.previous_attributes]),
    [
      ['contact.updated', contact.id, { company_id: company.id }],
      ['deal.updated', deal.id, { company_id: company.id }],
    ],
    'each record whose company was deleted emits its .updated event',
  )
})

t.test('ids and bodies that are not what they should be', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  t.equal((await ann.get('/api/deals/not-a-uuid')).status, 404)
  t.equal((await ann.get('/api/deals/01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a')).status, 404)
  const notJson = await world.server.request('POST', '/api/deals', {
    token: ann.member.token,
    raw: '{"name": ',
    headers: { 'content-type': 'application/json' },
  })
  t.equal(notJson.status, 400)
  t.equal(notJson.body.code, 'invalid_json')
  const array = await world.server.request('POST', '/api/deals', {
    token: ann.member.token,
    raw: '[]',
    headers: { 'content-type': 'application/json' },
  })
  t.equal(array.status, 400)
  const text = await world.server.request('POST', '/api/deals', {
    token: ann.member.token,
    raw: 'name=x',
    headers: { 'content-type': 'text/plain' },
  })
  t.equal(text.status, 415)
  t.equal((await world.server.request('GET', '/api/deals')).status, 401)
})
