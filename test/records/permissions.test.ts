// Permissions per scope (own, team, all), over HTTP and through crm.act_as, which must agree.
import t from 'tap'
import { startWorld } from './helpers.ts'

const EMAILS = [
  'admin@acme.test',
  'ann@acme.test',
  'bob@acme.test',
  'reader@acme.test',
  'carol@acme.test',
  'dave@acme.test',
  'nobody@acme.test',
]

t.test('own, team and all scopes', async (t) => {
  const world = await startWorld(t, {
    roles: {
      seller: [
        'deals:view:team',
        'deals:create:team',
        'deals:update:team',
        'deals:delete:own',
        'contacts:view:own',
        'contacts:create:own',
        'companies:view:all',
      ],
      outsider: [],
    },
    members: { 'carol@acme.test': 'seller', 'dave@acme.test': 'seller', 'nobody@acme.test': 'outsider' },
    teams: { east: ['carol@acme.test', 'ann@acme.test'] },
  })
  const admin = world.as('admin@acme.test')
  const ann = world.as('ann@acme.test')
  const bob = world.as('bob@acme.test')
  const reader = world.as('reader@acme.test')
  const carol = world.as('carol@acme.test')
  const nobody = world.as('nobody@acme.test')
  const id = (email: string) => world.tenant.members[email].id

  // The admin creates one deal and one contact per owner (create:all lets them set any owner).
  const deals: Record<string, string> = {}
  for (const email of ['admin@acme.test', 'ann@acme.test', 'bob@acme.test', 'carol@acme.test', 'dave@acme.test']) {
    const response = await admin.post('/api/deals', { name: `Deal of ${email}`, owner_id: id(email) })
    t.equal(response.status, 201, response.text)
    deals[email] = response.body.data.id
    t.equal((await admin.post('/api/contacts', { first_name: email, owner_id: id(email) })).status, 201)
  }

  const visible = async (email: string, path = '/api/deals') =>
    (await world.as(email).get(`${path}?limit=200`)).body.data.map((row: any) => row.owner_id).sort()
  t.same((await visible('admin@acme.test')).length, 5, 'all: everything')
  t.same((await visible('ann@acme.test')).length, 5, 'member: view all')
  t.same((await visible('reader@acme.test')).length, 5, 'read_only: view all')
  t.same(await visible('carol@acme.test'), [id('ann@acme.test'), id('carol@acme.test')].sort(), 'team: her own and her team mate Ann’s')
  t.same(await visible('dave@acme.test'), [id('dave@acme.test')], 'team without a team: only his own')
  t.same(await visible('carol@acme.test', '/api/contacts'), [id('carol@acme.test')], 'own')
  t.same(await visible('nobody@acme.test'), [], 'no grant: nothing')
  t.same((await visible('carol@acme.test', '/api/companies')).length, 0, 'no companies yet')

  // Reading: invisible is 404, like absent.
  t.equal((await carol.get(`/api/deals/${deals['bob@acme.test']}`)).status, 404)
  t.equal((await carol.get(`/api/deals/${deals['ann@acme.test']}`)).status, 200)

  // Writing: a visible record the role may not change is 403; an invisible one 404.
  t.equal((await ann.put(`/api/deals/${deals['bob@acme.test']}`, { name: 'Mine now' })).status, 403, 'member: update own only')
  t.equal((await ann.put(`/api/deals/${deals['ann@acme.test']}`, { name: 'Still mine' })).status, 200)
  t.equal(
    (await ann.put(`/api/deals/${deals['ann@acme.test']}`, { owner_id: id('bob@acme.test') })).status,
    403,
    'an owner change must stay within the scope',
  )
  t.equal((await ann.del(`/api/deals/${deals['bob@acme.test']}`)).status, 403)
  t.equal((await reader.put(`/api/deals/${deals['ann@acme.test']}`, { name: 'x' })).status, 403, 'read_only cannot update')
  t.equal((await reader.post('/api/deals', { name: 'x' })).status, 403, 'read_only cannot create')
  t.equal((await reader.del(`/api/deals/${deals['ann@acme.test']}`)).status, 403)
  t.equal((await carol.put(`/api/deals/${deals['ann@acme.test']}`, { stage: 'won' })).status, 200, 'team: update a team mate’s deal')
  t.equal((await carol.put(`/api/deals/${deals['bob@acme.test']}`, { stage: 'won' })).status, 404, 'team: another team’s deal is invisible')
  t.equal(
    (await carol.put(`/api/deals/${deals['ann@acme.test']}`, { owner_id: id('carol@acme.test') })).status,
    200,
    'team: reassign within the team',
  )
  t.equal(
    (await carol.put(`/api/deals/${deals['carol@acme.test']}`, { owner_id: id('bob@acme.test') })).status,
    403,
    'team: not outside it',
  )
  t.equal((await carol.del(`/api/deals/${deals['ann@acme.test']}`)).status, 204, 'delete own (the deal is hers now)')
  t.equal((await carol.post('/api/deals', { name: 'For Ann', owner_id: id('ann@acme.test') })).status, 201, 'create for a team mate')
  t.equal(
    (await carol.post('/api/deals', { name: 'For Bob', owner_id: id('bob@acme.test') })).status,
    403,
    'not for someone outside the team',
  )
  t.equal((await carol.post('/api/deals', { name: 'For a stranger', owner_id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a' })).status, 403)
  t.equal(
    (await admin.post('/api/deals', { name: 'For a stranger', owner_id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a' })).body.errors[0].pointer,
    '/owner_id',
    'the owner must be a member',
  )
  t.equal((await nobody.post('/api/deals', { name: 'x' })).status, 403)
  t.equal((await bob.get(`/api/deals/${deals['carol@acme.test']}`)).status, 200)

  // The same rules read in SQL: crm.act_as sees exactly what the API shows.
  for (const email of EMAILS) {
    for (const path of ['deals', 'contacts', 'companies']) {
      const overHttp = (await world.as(email).get(`/api/${path}?limit=200`)).body.data.map((row: any) => row.id).sort()
      await world.owner('begin')
      await world.owner('select crm.act_as($1, $2)', [email, 'acme'])
      const { rows } = await world.owner(`select id from crm.${path} order by id`)
      await world.owner('rollback')
      t.same(
        rows.map((row) => row.id),
        overHttp,
        `${email} sees the same ${path} through crm.act_as`,
      )
    }
  }

  // A context set by hand, without crm.authenticate's proof, sees nothing.
  await world.owner('begin')
  await world.owner(
    `select set_config('role', 'crm_api', true), set_config('crm.user_id', $1, true), set_config('crm.workspace_id', $2, true)`,
    [id('admin@acme.test'), world.tenant.id],
  )
  const { rows: forged } = await world.owner('select count(*)::int as n from crm.deals')
  await world.owner('rollback')
  t.equal(forged[0].n, 0, 'forged settings see zero rows')
})

t.test('another workspace is invisible', async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  const deal = (await ann.post('/api/deals', { name: 'Acme only' })).body.data
  const { createTenant } = await import('../helpers/fixtures.ts')
  const other = await createTenant(world.server.databaseUrl, { slug: 'globex', members: { 'boss@globex.test': 'admin' } })
  const boss = other.members['boss@globex.test']
  const headers = { 'x-tenant-slug': 'globex' }
  t.same((await world.server.request('GET', '/api/deals', { token: boss.token, headers })).body.data, [])
  t.equal((await world.server.request('GET', `/api/deals/${deal.id}`, { token: boss.token, headers })).status, 404)
  t.equal((await world.server.request('PUT', `/api/deals/${deal.id}`, { token: boss.token, headers, body: { name: 'x' } })).status, 404)
  t.equal((await world.server.request('DELETE', `/api/deals/${deal.id}`, { token: boss.token, headers })).status, 404)
  const company = (await ann.post('/api/companies', { name: 'Acme Co' })).body.data
  const link = await world.server.request('POST', '/api/deals', { token: boss.token, headers, body: { name: 'x', company_id: company.id } })
  t.equal(link.status, 422, 'a company of another workspace cannot be linked')
  t.equal(link.body.errors[0].pointer, '/company_id')
  const stages = await world.server.request('GET', '/api/deal-stages', { token: boss.token, headers })
  t.equal(stages.body.data.length, 6, 'each workspace has its own pipeline')
})
