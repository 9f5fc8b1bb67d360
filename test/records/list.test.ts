// Lists over HTTP: every filter operator against real rows, sorts, keyset paging that stays right
// while rows are inserted and deleted between pages, Link headers, and hostile parameters.
import t from 'tap'
import { type Client, startWorld } from './helpers.ts'

async function all(client: Client, path: string): Promise<any[]> {
  const rows: any[] = []
  let next: string | null = path
  for (let pages = 0; next && pages < 100; pages++) {
    const response = await client.get(next)
    if (response.status !== 200) throw new Error(`${next}: ${response.status} ${response.text}`)
    rows.push(...response.body.data)
    const link = response.headers.get('link')
    next = link ? /^<([^>]+)>; rel="next"$/.exec(link)![1] : null
    if ((response.body.next_cursor === null) !== (link === null)) throw new Error('next_cursor and Link disagree')
  }
  return rows
}

const names = (rows: any[]) => rows.map((row) => row.name)

t.test('filters, one operator at a time', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  const company = (await ann.post('/api/companies', { name: 'Globex' })).body.data
  const seed = [
    { name: 'Alpha', amount: '100.00', stage: 'lead', close_date: '2026-01-15', custom_fields: { tier: 'gold', seats: 10, vip: true } },
    {
      name: 'beta deal',
      amount: '250.50',
      stage: 'won',
      close_date: '2026-03-01',
      company_id: company.id,
      custom_fields: { tier: 'silver', seats: '10' },
    },
    { name: 'Gamma 50%_off', amount: null, stage: 'lost', currency: 'EUR', custom_fields: {} },
    { name: 'Delta', amount: '1000.00', stage: 'won', close_date: '2026-12-31', company_id: company.id, custom_fields: { tier: 'gold' } },
  ]
  for (const body of seed) t.equal((await ann.post('/api/deals', body)).status, 201)
  const list = async (query: string) => {
    const response = await ann.get(`/api/deals?${query}`)
    t.equal(response.status, 200, `${query}: ${response.text.slice(0, 200)}`)
    return names(response.body.data)
  }
  t.same(await list('filter[stage]=won'), ['beta deal', 'Delta'], 'filter[field]=v is eq')
  t.same(await list('filter[stage][eq]=won'), ['beta deal', 'Delta'], 'eq')
  t.same(await list('filter[stage][ne]=won'), ['Alpha', 'Gamma 50%_off'], 'ne')
  t.same(await list('filter[amount][ne]=100'), ['beta deal', 'Gamma 50%_off', 'Delta'], 'ne keeps records without a value')
  t.same(await list('filter[amount][lt]=250.50'), ['Alpha'], 'lt')
  t.same(await list('filter[amount][lte]=250.50'), ['Alpha', 'beta deal'], 'lte')
  t.same(await list('filter[amount][gt]=250.5'), ['Delta'], 'gt')
  t.same(await list('filter[amount][gte]=250.5'), ['beta deal', 'Delta'], 'gte')
  t.same(await list('filter[stage][in]=lead,lost'), ['Alpha', 'Gamma 50%_off'], 'in')
  t.same(await list('filter[name][contains]=DEAL'), ['beta deal'], 'contains is case-insensitive')
  t.same(await list('filter[name][contains]=50%25_'), ['Gamma 50%_off'], 'contains takes % and _ literally')
  t.same(await list('filter[name][contains]=%25'), ['Gamma 50%_off'])
  t.same(await list('filter[name][starts_with]=B'), ['beta deal'], 'starts_with is case-insensitive')
  t.same(await list('filter[amount][is_null]=true'), ['Gamma 50%_off'], 'is_null true')
  t.same(await list('filter[amount][is_null]=false'), ['Alpha', 'beta deal', 'Delta'], 'is_null false')
  t.same(await list(`filter[company_id]=${company.id}`), ['beta deal', 'Delta'], 'uuid eq')
  t.same(await list(`filter[company_id]=${company.id.toUpperCase()}`), ['beta deal', 'Delta'], 'uuid in upper case')
  t.same(await list('filter[close_date][gte]=2026-03-01&filter[close_date][lt]=2026-12-31'), ['beta deal'], 'date range')
  t.same(await list('filter[currency]=EUR'), ['Gamma 50%_off'])
  t.same(await list('filter[custom_fields.tier]=gold'), ['Alpha', 'Delta'], 'custom field equality')
  t.same(await list('filter[custom_fields.seats]=10'), ['Alpha', 'beta deal'], 'matches the number 10 and the string "10"')
  t.same(await list('filter[custom_fields.vip]=true'), ['Alpha'])
  t.same(await list('filter[custom_fields.none]=x'), [])
  t.same(await list('filter[stage]=won&filter[amount][gt]=500'), ['Delta'], 'filters combine with AND')
  const future = new Date(Date.now() + 60_000).toISOString()
  t.same(await list(`updated_since=${future}`), [], 'updated_since in the future')
  t.same((await list('updated_since=2020-01-01')).length, 4, 'updated_since in the past')
  t.same(await list(`filter[created_at][lt]=${encodeURIComponent('2020-01-01T00:00:00+02:00')}`), [], 'offsets are accepted')
  const [owner] = (await ann.get('/api/deals?limit=1')).body.data
  t.equal(owner.owner_id, ann.member.id)
  t.same((await list(`filter[owner_id]=${ann.member.id}`)).length, 4)

  const contacts = world.as('ann@acme.test')
  await contacts.post('/api/contacts', { first_name: 'Ann', email: 'Ann@Example.com' })
  await contacts.post('/api/contacts', { first_name: 'Bob', email: 'bob@example.com' })
  const emails = (await contacts.get('/api/contacts?filter[email]=ANN@example.COM')).body.data.map((row: any) => row.email)
  t.same(emails, ['ann@example.com'], 'email equality ignores case')
  t.same((await contacts.get('/api/contacts?filter[email][ends_with]=x')).status, 400)
})

t.test('sorting and keyset paging', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  const amounts = ['5.00', null, '1.00', '5.00', '3.00', null, '2.00', '5.00', '4.00', '1.00']
  const created: any[] = []
  for (const [index, amount] of amounts.entries())
    created.push((await ann.post('/api/deals', { name: `Deal ${String.fromCharCode(106 - index)}`, amount })).body.data)

  const byDefault = await all(ann, '/api/deals?limit=3')
  t.same(
    byDefault.map((row) => row.id),
    created.map((row) => row.id),
    'default order is created_at, id',
  )

  const byAmount = await all(ann, '/api/deals?sort=-amount,name&limit=2')
  const expected = [...created].sort((a, b) => {
    if (a.amount === null || b.amount === null) return a.amount === b.amount ? (a.name < b.name ? -1 : 1) : a.amount === null ? 1 : -1
    return Number(b.amount) - Number(a.amount) || (a.name < b.name ? -1 : 1)
  })
  t.same(
    byAmount.map((row) => row.name),
    expected.map((row) => row.name),
    '-amount,name with nulls last, across pages of 2',
  )
  const ascending = await all(ann, '/api/deals?sort=amount&limit=3')
  t.same(
    ascending.slice(-2).map((row) => row.amount),
    [null, null],
    'nulls last ascending too',
  )
  t.same(ascending.length, 10)
  t.same(
    (await all(ann, '/api/deals?sort=-created_at&limit=4')).map((row) => row.id),
    created.map((row) => row.id).reverse(),
  )
  t.same(
    (await all(ann, '/api/deals?sort=name&limit=4')).map((row) => row.name),
    created.map((row) => row.name).sort(),
  )

  const first = await ann.get('/api/deals?limit=200')
  t.equal(first.body.data.length, 10)
  t.equal(first.body.next_cursor, null)
  t.equal(first.headers.get('link'), null)
  const limited = await ann.get('/api/deals?limit=4&filter[amount][is_null]=false&sort=-amount')
  t.match(
    limited.headers.get('link'),
    /^<\/api\/deals\?limit=4&filter\[amount\]\[is_null\]=false&sort=-amount&cursor=[A-Za-z0-9_-]+>; rel="next"$/,
  )
  const wrongSort = await ann.get(`/api/deals?limit=4&sort=name&cursor=${limited.body.next_cursor}`)
  t.equal(wrongSort.status, 400, 'a cursor is tied to its sort')
})

t.test('paging stays correct while rows are inserted and deleted between pages', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  const ids: string[] = []
  for (let i = 0; i < 12; i++)
    ids.push((await ann.post('/api/deals', { name: `D${String(i).padStart(2, '0')}`, amount: String(i % 4) })).body.data.id)

  for (const sort of ['', '&sort=-amount,name', '&sort=name']) {
    const seen: string[] = []
    let response = await ann.get(`/api/deals?limit=4${sort}`)
    seen.push(...response.body.data.map((row: any) => row.name))
    // Between pages: delete a row already seen, delete one not yet seen, and add new ones.
    const unseen = (await ann.get(`/api/deals?limit=200${sort}`)).body.data.filter((row: any) => !seen.includes(row.name))
    await ann.del(`/api/deals/${response.body.data[0].id}`)
    await ann.del(`/api/deals/${unseen[unseen.length - 1].id}`)
    const removedLater = unseen[unseen.length - 1].name
    await ann.post('/api/deals', { name: `New${sort.length}`, amount: '9' })
    while (response.body.next_cursor) {
      response = await ann.get(`/api/deals?limit=4${sort}&cursor=${response.body.next_cursor}`)
      t.equal(response.status, 200)
      seen.push(...response.body.data.map((row: any) => row.name))
    }
    const everything = (await ann.get(`/api/deals?limit=200${sort}`)).body.data.map((row: any) => row.name)
    t.equal(new Set(seen).size, seen.length, `no row twice (${sort || 'default'})`)
    t.notOk(seen.includes(removedLater), 'a row deleted before its page is not returned')
    const survivorsBefore = everything.filter((name: string) => !name.startsWith('New'))
    for (const name of survivorsBefore) t.ok(seen.includes(name), `${name} is not skipped (${sort || 'default'})`)
    // Put the world back for the next sort.
    for (const row of (await ann.get('/api/deals?limit=200&filter[name][starts_with]=New')).body.data) await ann.del(`/api/deals/${row.id}`)
  }
})

t.test('hostile parameters answer 400 invalid_parameter, never 500', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  await ann.post('/api/deals', { name: 'x' })
  const hostile = [
    'filter[name]=%ZZ',
    'filter[name]=%C3%28',
    'filter[name]=%00',
    'filter[name]=a%00b',
    'filter[amount]=1%27%20or%20%271%27=%271',
    'filter[amount]=1;select%20pg_sleep(5)',
    'filter[name%22;drop%20table%20crm.deals;--]=x',
    'filter[name][op%27]=x',
    'filter[stage][regex]=.*',
    'filter[custom_fields.x%27)%20or%20(%271]=1',
    'sort=name;drop%20table%20crm.deals',
    'sort=(select%201)',
    'sort=name%20desc',
    'sort=unknown',
    'cursor=%27%20or%201=1--',
    `cursor=${Buffer.from('{"s":"created_at,id","k":["1 or 1=1","x"]}').toString('base64url')}`,
    'limit=1e3',
    'limit=-5',
    `limit=${'9'.repeat(100)}`,
    `filter[name]=${'a'.repeat(5000)}`,
    'updated_since=yesterday',
    'filter[created_at][gte]=2026-13-45',
    'filter[close_date]=99999-01-01',
    'bogus=1',
    'filter[name]=a&filter[name]=b',
    `filter[amount]=${'1'.repeat(400)}`,
    `filter[id][in]=${Array.from({ length: 150 }, () => '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a').join(',')}`,
  ]
  for (const query of hostile) {
    const response = await ann.get(`/api/deals?${query}`)
    t.equal(response.status, 400, `${query.slice(0, 80)} → 400 (${response.text.slice(0, 120)})`)
    t.equal(response.body?.code, 'invalid_parameter')
    t.match(response.headers.get('content-type'), /application\/problem\+json/)
  }
  for (const query of ['q=%FF', 'q=', `q=${'x'.repeat(300)}`, 'q=a&bogus=1']) {
    t.equal((await ann.get(`/api/deals/search?${query}`)).status, 400, `search ${query.slice(0, 40)}`)
    t.equal((await ann.get(`/api/search?${query}`)).status, 400, `global search ${query.slice(0, 40)}`)
  }
  t.equal((await ann.get('/api/search?q=a&types=deals,users')).status, 400)
  t.equal((await ann.get('/api/search?q=a&limit=0')).status, 400)
  const bad = await ann.post('/api/deals', { name: 'x' }, { 'idempotency-key': 'x'.repeat(256) })
  t.equal(bad.status, 400)
  t.equal((await ann.get('/api/deals')).body.data.length, 1, 'the table is still there')
})
