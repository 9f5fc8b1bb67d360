// The authorization matrix, generated from crm.permission_matrix and checked against the API: for
// every role and every resource × action, the API allows exactly what the database says.
import t from 'tap'
import { createTenant, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const url = server.databaseUrl
const tenant = await createTenant(url, {
  slug: 'matrix',
  members: {
    'admin@m.test': 'admin',
    'member@m.test': 'member',
    'reader@m.test': 'read_only',
    'custom@m.test': 'read_only',
    'other@m.test': 'member',
  },
})
await withOwner(url, async (client) => {
  const {
    rows: [role],
  } = await client.query("insert into crm.roles (workspace_id, name) values ($1, 'erp_sync') returning id", [tenant.id])
  for (const grant of ['deals:view:own', 'deals:update:own', 'contacts:create:all', 'companies:delete:all', 'companies:view:all']) {
    const [resource, action, scope] = grant.split(':')
    await client.query('insert into crm.role_grants (workspace_id, role_id, resource, action, scope) values ($1, $2, $3, $4, $5)', [
      tenant.id,
      role.id,
      resource,
      action,
      scope,
    ])
  }
  await client.query('update crm.memberships set role_id = $2 where user_id = $1', [tenant.members['custom@m.test'].id, role.id])
})
const matrix = await withOwner(
  url,
  async (client) =>
    (
      await client.query(
        "select m.email, p.resource, p.action, p.scope from crm.member_access m join crm.permission_matrix p on p.workspace = m.workspace and p.role = m.role and p.resource = m.resource and p.action = m.action where m.workspace = 'matrix'",
      )
    ).rows,
)
const scopeOf = (email: string, resource: string, action: string) =>
  matrix.find((row) => row.email === email && row.resource === resource && row.action === action)?.scope ?? null

const BODIES: Record<string, Record<string, unknown>> = {
  contacts: { first_name: 'Matrix' },
  companies: { name: 'Matrix Co' },
  deals: { name: 'Matrix deal' },
}
const admin = tenant.members['admin@m.test'].token
const otherId = tenant.members['other@m.test'].id

let checks = 0
for (const email of Object.keys(tenant.members).filter((email) => email !== 'other@m.test')) {
  const member = tenant.members[email]
  for (const resource of ['contacts', 'companies', 'deals']) {
    t.test(`${email} on ${resource}`, async (t) => {
      // One record owned by the member, one by someone else (created by the admin).
      const mine = await server.request('POST', `/api/${resource}`, { token: admin, body: { ...BODIES[resource], owner_id: member.id } })
      const theirs = await server.request('POST', `/api/${resource}`, { token: admin, body: { ...BODIES[resource], owner_id: otherId } })
      t.equal(mine.status, 201)
      const view = scopeOf(email, resource, 'view')
      const expectVisible = (scope: string | null, own: boolean) => scope === 'all' || (scope !== null && own)
      for (const [record, own] of [
        [mine.body.data, true],
        [theirs.body.data, false],
      ] as const) {
        const read = await server.request('GET', `/api/${resource}/${record.id}`, { token: member.token })
        t.equal(read.status, expectVisible(view, own) ? 200 : 404, `view ${own ? 'own' : 'other'} (${view})`)
        const update = await server.request('PATCH', `/api/${resource}/${record.id}`, { token: member.token, body: BODIES[resource] })
        const canUpdate = expectVisible(scopeOf(email, resource, 'update'), own)
        t.equal(update.status, canUpdate ? 200 : expectVisible(view, own) ? 403 : 404, `update ${own ? 'own' : 'other'}`)
        checks += 2
      }
      const created = await server.request('POST', `/api/${resource}`, { token: member.token, body: BODIES[resource] })
      t.equal(created.status, scopeOf(email, resource, 'create') ? 201 : 403, `create (${scopeOf(email, resource, 'create')})`)
      const doomed = await server.request('POST', `/api/${resource}`, { token: admin, body: { ...BODIES[resource], owner_id: otherId } })
      const removed = await server.request('DELETE', `/api/${resource}/${doomed.body.data.id}`, { token: member.token })
      const deleteScope = scopeOf(email, resource, 'delete')
      t.equal(removed.status, deleteScope === 'all' ? 204 : view === 'all' ? 403 : 404, `delete other (${deleteScope})`)
      const list = await server.request('GET', `/api/${resource}?limit=200`, { token: member.token })
      const expected = await withOwner(url, async (client) => {
        await client.query('begin')
        await client.query('select crm.act_as($1, $2)', [email, 'matrix'])
        const { rows } = await client.query(`select count(*)::int as n from crm.${resource}`)
        await client.query('rollback')
        return rows[0].n
      })
      t.equal(list.body.data.length, expected, 'the API lists exactly what crm.act_as sees')
      checks += 3
    })
  }
}

t.test('summary', async (t) => {
  t.ok(checks > 50, `${checks} API answers checked against crm.permission_matrix`)
})
