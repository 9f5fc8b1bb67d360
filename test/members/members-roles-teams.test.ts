// /api/members, /api/roles, /api/teams: admin-only changes, what non-admins may read, the seat and
// last-admin rules, and the database rules underneath (RLS backstop, audit views, crm.act_as).
import t from 'tap'
import { crm } from '../helpers/cli.ts'
import { createTenant, mintToken, type Tenant, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const url = server.databaseUrl

const as = (tenant: Tenant, email: string) => {
  const token = tenant.members[email].token
  const headers = { 'x-tenant-slug': tenant.slug }
  return {
    get: (path: string) => server.request('GET', path, { token, headers }),
    post: (path: string, body?: unknown) => server.request('POST', path, { token, headers, body }),
    patch: (path: string, body: unknown) => server.request('PATCH', path, { token, headers, body }),
    del: (path: string) => server.request('DELETE', path, { token, headers }),
  }
}

t.test('members: list with seats, one member, and what a non-admin reads', async (t) => {
  const tenant = await createTenant(url, {
    slug: 'm1',
    seats: 5,
    members: { 'admin@m1.test': 'admin', 'bob@m1.test': 'member' },
    teams: { east: ['bob@m1.test'] },
  })
  const admin = as(tenant, 'admin@m1.test')
  const bob = as(tenant, 'bob@m1.test')
  const list = await admin.get('/api/members')
  t.equal(list.status, 200)
  t.same(list.body.seats, { used: 2, limit: 5 })
  t.equal(list.body.next_cursor, null)
  t.match(list.body.data, [
    {
      user_id: tenant.members['admin@m1.test'].id,
      email: 'admin@m1.test',
      name: 'admin@m1.test',
      role: 'admin',
      teams: [],
      suspended_at: null,
      joined_at: /Z$/,
    },
    { user_id: tenant.members['bob@m1.test'].id, email: 'bob@m1.test', role: 'member', teams: ['east'], suspended_at: null },
  ])
  const own = await bob.get('/api/members')
  t.equal(own.status, 200)
  t.same(
    own.body.data.map((row: any) => row.email),
    ['bob@m1.test'],
    'a non-admin reads only their own membership',
  )
  t.equal((await bob.get(`/api/members/${tenant.members['bob@m1.test'].id}`)).status, 200)
  t.equal((await bob.get(`/api/members/${tenant.members['admin@m1.test'].id}`)).status, 404, 'others read as absent')
  t.equal((await admin.get(`/api/members/${tenant.members['bob@m1.test'].id}`)).body.data.email, 'bob@m1.test')
  t.equal((await admin.get('/api/members/nope')).status, 404)
  t.equal((await admin.get('/api/members/00000000-0000-7000-8000-000000000000')).status, 404)
})

t.test('members: change role and teams; problems; admins only', async (t) => {
  const tenant = await createTenant(url, {
    slug: 'm2',
    members: { 'admin@m2.test': 'admin', 'bob@m2.test': 'member' },
    teams: { east: [], west: [] },
  })
  const admin = as(tenant, 'admin@m2.test')
  const bob = as(tenant, 'bob@m2.test')
  const bobId = tenant.members['bob@m2.test'].id
  const adminId = tenant.members['admin@m2.test'].id
  const changed = await admin.patch(`/api/members/${bobId}`, { role: 'read_only', teams: ['east', 'west'] })
  t.equal(changed.status, 200, changed.text)
  t.match(changed.body.data, { role: 'read_only', teams: ['east', 'west'] })
  t.match(
    (await admin.patch(`/api/members/${bobId}`, { teams: ['west'] })).body.data,
    { role: 'read_only', teams: ['west'] },
    'teams replace the set',
  )
  t.match((await admin.patch(`/api/members/${bobId}`, { teams: [] })).body.data, { teams: [] })
  t.match(
    (await server.request('PUT', `/api/members/${bobId}`, { token: tenant.members['admin@m2.test'].token, body: { role: 'member' } })).body
      .data,
    { role: 'member' },
    'PUT is an alias',
  )

  for (const [body, pointer, status] of [
    [{ role: 'boss' }, '/role', 422],
    [{ teams: ['north'] }, '/teams/0', 422],
    [{ role: 'member', colour: 'red' }, '/colour', 422],
    [{ teams: 'east' }, '/teams', 422],
  ] as const) {
    const response = await admin.patch(`/api/members/${bobId}`, body)
    t.equal(response.status, status, JSON.stringify(body))
    t.equal(response.body.errors?.[0]?.pointer, pointer)
  }
  t.equal((await admin.patch('/api/members/00000000-0000-7000-8000-000000000000', { role: 'member' })).status, 404)
  const forbidden = await bob.patch(`/api/members/${bobId}`, { role: 'admin' })
  t.equal(forbidden.status, 403, 'a member cannot promote themself')
  t.equal(forbidden.body.code, 'forbidden')
  t.equal((await bob.post(`/api/members/${adminId}/suspend`)).status, 403)
  t.equal((await bob.del(`/api/members/${adminId}`)).status, 403)

  const demote = await admin.patch(`/api/members/${adminId}`, { role: 'member' })
  t.equal(demote.status, 422, 'the last admin cannot be demoted')
  t.equal(demote.body.code, 'validation_failed')
  t.equal((await admin.post(`/api/members/${adminId}/suspend`)).status, 422, '... nor suspended')
  const remove = await admin.del(`/api/members/${adminId}`)
  t.equal(remove.status, 422, `... nor removed ${remove.text}`)
  t.equal((await admin.patch(`/api/members/${bobId}`, { role: 'admin' })).status, 200)
  t.equal((await admin.patch(`/api/members/${adminId}`, { role: 'member' })).status, 200, 'with a second admin, the first may step down')
})

t.test('suspension stops tokens at once; unsuspend needs a free seat', async (t) => {
  const tenant = await createTenant(url, { slug: 'm3', seats: 2, members: { 'admin@m3.test': 'admin', 'bob@m3.test': 'member' } })
  const admin = as(tenant, 'admin@m3.test')
  const bob = as(tenant, 'bob@m3.test')
  const bobId = tenant.members['bob@m3.test'].id
  t.equal((await bob.get('/api/me')).status, 200)
  const suspended = await admin.post(`/api/members/${bobId}/suspend`)
  t.equal(suspended.status, 200)
  t.match(suspended.body.data, { suspended_at: /Z$/ })
  const refused = await bob.get('/api/me')
  t.equal(refused.status, 401, 'the very next request is refused')
  t.equal(refused.body.code, 'user_suspended')
  t.same((await admin.get('/api/members')).body.seats, { used: 1, limit: 2 })

  await withOwner(url, async (client) => {
    const { rows } = await client.query(`insert into crm.users (email, name) values ('cat@m3.test', 'Cat') returning id`)
    await client.query(
      `insert into crm.memberships (workspace_id, user_id, role_id) select $1, $2, id from crm.roles where workspace_id = $1 and name = 'member'`,
      [tenant.id, rows[0].id],
    )
  })
  const full = await admin.post(`/api/members/${bobId}/unsuspend`)
  t.equal(full.status, 422, full.text)
  t.equal(full.body.code, 'seat_limit_reached')
  await withOwner(url, (client) => client.query('update crm.workspaces set seat_limit = 3 where id = $1', [tenant.id]))
  const back = await admin.post(`/api/members/${bobId}/unsuspend`)
  t.equal(back.status, 200)
  t.equal(back.body.data.suspended_at, null)
  t.equal((await bob.get('/api/me')).status, 200, 'the same token works again')
  t.equal((await admin.post('/api/members/00000000-0000-7000-8000-000000000000/suspend')).status, 404)
})

t.test('removing a member: records are handed over or the removal is refused', async (t) => {
  const tenant = await createTenant(url, {
    slug: 'm4',
    members: { 'admin@m4.test': 'admin', 'bob@m4.test': 'member', 'cat@m4.test': 'member' },
  })
  const admin = as(tenant, 'admin@m4.test')
  const bobId = tenant.members['bob@m4.test'].id
  const catId = tenant.members['cat@m4.test'].id
  const deal = await admin.post('/api/deals', { name: 'Bob’s deal', owner_id: bobId })
  t.equal(deal.status, 201, deal.text)
  const refused = await admin.del(`/api/members/${bobId}`)
  t.equal(refused.status, 409)
  t.equal(refused.body.code, 'member_owns_records')
  t.equal((await admin.del(`/api/members/${bobId}?reassign_to=${bobId}`)).status, 400)
  t.equal((await admin.del(`/api/members/${bobId}?reassign_to=00000000-0000-7000-8000-000000000000`)).status, 400)
  t.equal((await admin.del(`/api/members/${bobId}?reassign_to=${tenant.members['admin@m4.test'].id}`)).status, 204)
  t.equal(
    (await admin.get(`/api/deals/${deal.body.data.id}`)).body.data.owner_id,
    tenant.members['admin@m4.test'].id,
    'the deal changed hands',
  )
  const gone = await as(tenant, 'bob@m4.test').get('/api/me')
  t.equal(gone.status, 404, 'a removed member no longer reaches the workspace')
  t.equal(gone.body.code, 'workspace_not_found')
  t.equal((await admin.del(`/api/members/${catId}`)).status, 204, 'a member without records is simply removed')
  t.equal((await admin.del(`/api/members/${catId}`)).status, 404)
  t.same(
    (await admin.get('/api/members')).body.data.map((row: any) => row.email),
    ['admin@m4.test'],
  )
})

t.test('roles: built-ins, custom roles, in use, problems', async (t) => {
  const tenant = await createTenant(url, { slug: 'r1', members: { 'admin@r1.test': 'admin', 'bob@r1.test': 'member' } })
  const admin = as(tenant, 'admin@r1.test')
  const bob = as(tenant, 'bob@r1.test')
  const list = await admin.get('/api/roles')
  t.equal(list.status, 200)
  t.same(
    list.body.data.map((role: any) => [role.name, role.is_admin, role.is_builtin, role.grants.length]),
    [
      ['admin', true, true, 18],
      ['member', false, true, 12],
      ['read_only', false, true, 3],
    ],
  )
  t.same(list.body.data[2].grants, ['companies:view:all', 'contacts:view:all', 'deals:view:all'])
  t.same(
    (await bob.get('/api/roles')).body.data.map((role: any) => role.name),
    ['member'],
    'a non-admin reads only their own role',
  )
  const builtin = list.body.data[1]
  t.equal((await bob.get(`/api/roles/${list.body.data[0].id}`)).status, 404)

  t.equal((await admin.patch(`/api/roles/${builtin.id}`, { grants: [] })).status, 422, 'built-in roles cannot be changed')
  t.equal((await admin.patch(`/api/roles/${builtin.id}`, {})).status, 422)
  t.equal((await admin.del(`/api/roles/${builtin.id}`)).status, 422, '... nor deleted')

  const created = await admin.post('/api/roles', { name: 'sales', grants: ['deals:view:team', 'contacts:view:all', 'deals:create:own'] })
  t.equal(created.status, 201, created.text)
  t.match(created.body.data, {
    name: 'sales',
    is_admin: false,
    is_builtin: false,
    grants: ['contacts:view:all', 'deals:create:own', 'deals:view:team'],
    member_count: 0,
  })
  t.equal(created.headers.get('location'), `/api/roles/${created.body.data.id}`)
  const id = created.body.data.id
  t.same((await admin.get(`/api/roles/${id}`)).body.data, created.body.data)

  for (const [body, pointer, status] of [
    [{ name: 'sales' }, '/name', 409],
    [{ name: 'Sales Team' }, '/name', 422],
    [{ name: 'x', grants: ['deals:fly:all'] }, '/grants/0', 422],
    [{ name: 'x', grants: ['deals:view:all', 'deals:view:own'] }, '/grants/1', 422],
    [{ grants: [] }, '/name', 422],
    [{ name: 'x', admin: true }, '/admin', 422],
  ] as const) {
    const response = await admin.post('/api/roles', body)
    t.equal(response.status, status, JSON.stringify(body))
    t.equal(response.body.errors?.[0]?.pointer, pointer)
  }
  t.equal((await bob.post('/api/roles', { name: 'mine' })).status, 403)
  t.equal((await bob.patch(`/api/roles/${id}`, { name: 'mine' })).status, 403)
  t.equal((await bob.del(`/api/roles/${id}`)).status, 403)

  const renamed = await admin.patch(`/api/roles/${id}`, { name: 'sellers', grants: ['deals:view:all'] })
  t.match(renamed.body.data, { name: 'sellers', grants: ['deals:view:all'] })
  t.equal((await admin.patch(`/api/roles/${id}`, { name: 'member' })).status, 409)

  t.equal((await admin.patch(`/api/members/${tenant.members['bob@r1.test'].id}`, { role: 'sellers' })).status, 200)
  const inUse = await admin.del(`/api/roles/${id}`)
  t.equal(inUse.status, 409, 'a role in use cannot be deleted')
  t.equal(inUse.body.code, 'role_in_use')
  t.equal((await admin.patch(`/api/members/${tenant.members['bob@r1.test'].id}`, { role: 'member' })).status, 200)
  const invited = await admin.post('/api/invitations', { email: 'new@r1.test', role: 'sellers' })
  t.equal((await admin.del(`/api/roles/${id}`)).status, 409, 'a pending invitation holds it too')
  t.equal((await admin.del(`/api/invitations/${invited.body.data.id}`)).status, 204)
  t.equal((await admin.del(`/api/roles/${id}`)).status, 204)
  t.equal((await admin.get(`/api/roles/${id}`)).status, 404)
  t.equal((await admin.del(`/api/roles/${id}`)).status, 404)

  // A custom admin role: turning it off must leave the workspace an admin.
  const boss = await admin.post('/api/roles', { name: 'boss', is_admin: true })
  t.equal((await admin.patch(`/api/members/${tenant.members['bob@r1.test'].id}`, { role: 'boss' })).status, 200)
  t.equal((await admin.patch(`/api/members/${tenant.members['admin@r1.test'].id}`, { role: 'member' })).status, 200)
  const lastAdmin = await bob.patch(`/api/roles/${boss.body.data.id}`, { is_admin: false })
  t.equal(lastAdmin.status, 422, 'the last admin cannot be demoted through their role')
  t.match(lastAdmin.body.errors, [{ pointer: '/is_admin' }])
})

t.test('teams: create, rename, delete; non-admins read their own', async (t) => {
  const tenant = await createTenant(url, {
    slug: 't1',
    members: { 'admin@t1.test': 'admin', 'bob@t1.test': 'member' },
    teams: { east: ['bob@t1.test'] },
  })
  const admin = as(tenant, 'admin@t1.test')
  const bob = as(tenant, 'bob@t1.test')
  const created = await admin.post('/api/teams', { name: '  West ' })
  t.equal(created.status, 201)
  t.match(created.body.data, { name: 'West', members: [] })
  t.equal((await admin.post('/api/teams', { name: 'West' })).status, 409)
  t.equal((await admin.post('/api/teams', { name: '' })).status, 422)
  t.equal((await admin.post('/api/teams', { name: 'x'.repeat(101) })).status, 422)
  t.same(
    (await admin.get('/api/teams')).body.data.map((team: any) => team.name),
    ['east', 'West'],
  )
  const east = (await bob.get('/api/teams')).body.data
  t.same(
    east.map((team: any) => [team.name, team.members]),
    [['east', [tenant.members['bob@t1.test'].id]]],
    'a member reads only their teams',
  )
  t.equal((await bob.get(`/api/teams/${created.body.data.id}`)).status, 404)
  t.equal((await bob.post('/api/teams', { name: 'Mine' })).status, 403)
  t.equal((await bob.patch(`/api/teams/${east[0].id}`, { name: 'Mine' })).status, 403)
  t.equal((await bob.del(`/api/teams/${east[0].id}`)).status, 403)
  t.match((await admin.patch(`/api/teams/${created.body.data.id}`, { name: 'Westward' })).body.data, { name: 'Westward' })
  t.equal((await admin.patch(`/api/teams/${created.body.data.id}`, { name: 'east' })).status, 409)
  t.equal((await admin.del(`/api/teams/${east[0].id}`)).status, 204)
  t.same((await admin.get(`/api/members/${tenant.members['bob@t1.test'].id}`)).body.data.teams, [], 'members leave a deleted team')
  t.equal((await admin.del(`/api/teams/${east[0].id}`)).status, 404)
})

t.test('a narrowed role applies on the very next request: records, search, /api/me', async (t) => {
  const tenant = await createTenant(url, { slug: 'n1', members: { 'admin@n1.test': 'admin', 'bob@n1.test': 'member' } })
  const admin = as(tenant, 'admin@n1.test')
  const bob = as(tenant, 'bob@n1.test')
  t.equal((await admin.post('/api/deals', { name: 'Zanzibar expansion' })).status, 201)
  t.equal((await bob.get('/api/deals')).body.data.length, 1, 'member: views all deals')
  t.equal((await bob.get('/api/search?q=zanzibar')).body.data.length, 1)

  const narrow = await admin.post('/api/roles', { name: 'contacts_only', grants: ['contacts:view:all'] })
  t.equal((await admin.patch(`/api/members/${tenant.members['bob@n1.test'].id}`, { role: 'contacts_only' })).status, 200)
  t.same((await bob.get('/api/deals')).body.data, [], 'the next list sees no deal')
  t.same((await bob.get('/api/search?q=zanzibar')).body.data, [], 'nor does search')
  t.same((await bob.get('/api/me')).body.data.role, { name: 'contacts_only', is_admin: false, permissions: ['contacts:view:all'] })

  t.equal((await admin.patch(`/api/roles/${narrow.body.data.id}`, { grants: ['contacts:view:all', 'deals:view:all'] })).status, 200)
  t.equal((await bob.get('/api/deals')).body.data.length, 1, 'widening the role’s grants applies at once too')
  t.equal((await admin.patch(`/api/roles/${narrow.body.data.id}`, { grants: [] })).status, 200)
  t.same((await bob.get('/api/search?q=zanzibar')).body.data, [])
})

t.test('an integration user with deals:view:own and deals:update:own, through the API and crm.act_as', async (t) => {
  const tenant = await createTenant(url, { slug: 'i1', seats: 3, members: { 'admin@i1.test': 'admin', 'bob@i1.test': 'member' } })
  const admin = as(tenant, 'admin@i1.test')
  const role = await admin.post('/api/roles', { name: 'integration', grants: ['deals:view:own', 'deals:update:own'] })
  t.equal(role.status, 201)
  const invitation = await admin.post('/api/invitations', { email: 'erp@i1.test', role: 'integration' })
  const secret = new URL(invitation.body.data.accept_url).searchParams.get('token')
  const accepted = await server.request('POST', '/api/invitations/accept', {
    body: { token: secret, password: 'a long erp password', name: 'ERP sync' },
  })
  t.equal(accepted.status, 200, accepted.text)
  const erpToken = accepted.body.token
  const erpId = (await server.request('GET', '/api/me', { token: erpToken })).body.data.user.id
  t.same((await admin.get('/api/members')).body.seats, { used: 3, limit: 3 }, 'the integration user takes a seat')

  const mine = await admin.post('/api/deals', { name: 'ERP deal', owner_id: erpId })
  const theirs = await admin.post('/api/deals', { name: 'Bob deal', owner_id: tenant.members['bob@i1.test'].id })
  const erp = (method: string, path: string, body?: unknown) => server.request(method, path, { token: erpToken, body })
  t.same(
    (await erp('GET', '/api/deals')).body.data.map((deal: any) => deal.id),
    [mine.body.data.id],
    'sees only its own deal',
  )
  t.equal((await erp('PATCH', `/api/deals/${mine.body.data.id}`, { amount: '10.00' })).status, 200, 'updates its own deal')
  t.equal((await erp('GET', `/api/deals/${theirs.body.data.id}`)).status, 404)
  t.equal((await erp('PATCH', `/api/deals/${theirs.body.data.id}`, { amount: '10.00' })).status, 404, 'cannot touch what it cannot see')
  t.equal((await erp('POST', '/api/deals', { name: 'New' })).status, 403, 'no create grant')
  t.equal((await erp('DELETE', `/api/deals/${mine.body.data.id}`)).status, 403, 'no delete grant')
  t.same((await erp('GET', '/api/contacts')).body.data, [], 'no contacts')
  t.equal((await erp('GET', '/api/members')).body.data.length, 1)

  await withOwner(url, async (client) => {
    await client.query('begin')
    try {
      await client.query(`select crm.act_as('erp@i1.test', 'i1')`)
      const { rows } = await client.query(`select id from crm.deals`)
      t.same(
        rows.map((row) => row.id),
        [mine.body.data.id],
        'crm.act_as sees the same deal',
      )
      const { rows: scopes } = await client.query(`
        select crm.grant_scope('deals', 'view') as view, crm.grant_scope('deals', 'update') as update,
               crm.grant_scope('deals', 'create') as create, crm.grant_scope('contacts', 'view') as contacts`)
      t.same(scopes[0], { view: 'own', update: 'own', create: null, contacts: null })
      const updated = await client.query(`update crm.deals set amount = 1 where id = any($1::uuid[])`, [
        [mine.body.data.id, theirs.body.data.id],
      ])
      t.equal(updated.rowCount, 1, 'and updates only its own')
      await client.query('savepoint s')
      await client.query(
        `insert into crm.memberships (workspace_id, user_id, role_id) select workspace_id, user_id, role_id from crm.memberships limit 0`,
      )
      const refused = await client
        .query(`insert into crm.teams (workspace_id, name) values ($1, 'sneaky')`, [tenant.id])
        .catch((error) => error)
      t.equal(refused.code, '42501', 'RLS refuses admin-only writes to a non-admin')
    } finally {
      await client.query('rollback')
    }
  })

  // Audit views reflect API changes at once.
  const matrix = async () =>
    withOwner(url, async (client) =>
      (
        await client.query(
          `select resource || ':' || action || ':' || scope as grant from crm.permission_matrix where workspace = 'i1' and role = 'integration' order by 1`,
        )
      ).rows.map((row) => row.grant),
    )
  const access = async () =>
    withOwner(
      url,
      async (client) =>
        (
          await client.query(
            `select role, resource || ':' || action || ':' || scope as grant from crm.member_access where workspace = 'i1' and email = 'erp@i1.test' order by 2`,
          )
        ).rows,
    )
  t.same(await matrix(), ['deals:update:own', 'deals:view:own'])
  t.same(await access(), [
    { role: 'integration', grant: 'deals:update:own' },
    { role: 'integration', grant: 'deals:view:own' },
  ])
  await admin.patch(`/api/roles/${role.body.data.id}`, { grants: ['deals:view:own'] })
  t.same(await matrix(), ['deals:view:own'], 'permission_matrix follows PATCH /api/roles')
  t.equal(
    (await erp('PATCH', `/api/deals/${mine.body.data.id}`, { amount: '11.00' })).status,
    403,
    'the update grant is gone on the next request',
  )
  await admin.post(`/api/members/${erpId}/suspend`)
  t.same(await access(), [], 'member_access drops a suspended member')
  t.equal((await erp('GET', '/api/deals')).status, 401)
})

t.test('the operator CLI keeps working beside the API', async (t) => {
  const tenant = await createTenant(url, { slug: 'cli1', members: { 'admin@cli1.test': 'admin', 'bob@cli1.test': 'member' } })
  const admin = as(tenant, 'admin@cli1.test')
  const role = crm(url, ['role', 'create', '--workspace', 'cli1', '--name', 'auditor', '--grant', 'deals:view:all', '--json'])
  t.equal(role.status, 0, role.stderr)
  t.match((await admin.get(`/api/roles/${role.json.id}`)).body.data, { name: 'auditor', grants: ['deals:view:all'] })
  t.equal(crm(url, ['member', 'suspend', '--workspace', 'cli1', '--email', 'bob@cli1.test', '--json']).status, 0)
  t.match((await admin.get(`/api/members/${tenant.members['bob@cli1.test'].id}`)).body.data, { suspended_at: /Z$/ })
  t.equal(crm(url, ['member', 'unsuspend', '--workspace', 'cli1', '--email', 'bob@cli1.test', '--json']).status, 0)
  await withOwner(url, async (client) => {
    const { rows } = await client.query(`insert into crm.users (email, name) values ('dan@cli1.test', 'Dan') returning id`)
    await mintToken(client, rows[0].id)
  })
  t.equal(crm(url, ['member', 'add', '--workspace', 'cli1', '--email', 'dan@cli1.test', '--role', 'auditor', '--json']).status, 0)
  t.match(
    (await admin.get('/api/members')).body.data.find((row: any) => row.email === 'dan@cli1.test'),
    { role: 'auditor' },
  )
})
