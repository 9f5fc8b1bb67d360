// Row-level security in SQL, scope by scope and action by action, through crm.act_as: what a
// DBA sees is what the API enforces. Ann holds one custom role at a time; Ben shares her team,
// Cat does not.
import t from 'tap'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'

const url = await createTestDatabase(t)
const tenant = await createTenant(url, {
  slug: 'acme',
  members: { 'admin@acme.test': 'admin', 'ann@acme.test': 'read_only', 'ben@acme.test': 'member', 'cat@acme.test': 'member' },
  teams: { sales: ['ann@acme.test', 'ben@acme.test'] },
})
const other = await createTenant(url, { slug: 'globex', members: { 'gus@globex.test': 'admin' } })
const client = await ownerClient(t, url)
const id = (email: string) => tenant.members[email].id
const ann = id('ann@acme.test')
const ben = id('ben@acme.test')
const cat = id('cat@acme.test')

const RESOURCES = {
  contacts: { column: 'first_name' },
  companies: { column: 'name' },
  deals: { column: 'name' },
} as const
type Resource = keyof typeof RESOURCES

async function seed(): Promise<void> {
  for (const [resource, { column }] of Object.entries(RESOURCES)) {
    await client.query(`delete from crm.${resource}`)
    for (const [owner, label] of [
      [ann, 'ann'],
      [ben, 'ben'],
      [cat, 'cat'],
    ]) {
      await client.query(`insert into crm.${resource} (workspace_id, owner_id, ${column}) values ($1, $2, $3)`, [
        tenant.id,
        owner,
        `${label}'s`,
      ])
    }
    await client.query(`insert into crm.${resource} (workspace_id, owner_id, ${column}) values ($1, $2, 'foreign')`, [
      other.id,
      other.members['gus@globex.test'].id,
    ])
  }
}

async function giveAnn(grants: string[]): Promise<void> {
  const name = `r_${Math.random().toString(36).slice(2, 10)}`
  const {
    rows: [role],
  } = await client.query('insert into crm.roles (workspace_id, name) values ($1, $2) returning id', [tenant.id, name])
  for (const grant of grants) {
    const [resource, action, scope] = grant.split(':')
    await client.query('insert into crm.role_grants (workspace_id, role_id, resource, action, scope) values ($1, $2, $3, $4, $5)', [
      tenant.id,
      role.id,
      resource,
      action,
      scope,
    ])
  }
  await client.query('update crm.memberships set role_id = $3 where workspace_id = $1 and user_id = $2', [tenant.id, ann, role.id])
}

/** Runs statements as Ann inside a rolled-back transaction; returns row counts or the error code. */
async function asAnn(statement: string, values: unknown[] = []): Promise<number | string> {
  await client.query('begin')
  try {
    await client.query("select crm.act_as('ann@acme.test', 'acme')")
    const result = await client.query(statement, values)
    return result.command === 'SELECT' ? Number(result.rows[0]?.n ?? result.rowCount) : (result.rowCount ?? 0)
  } catch (error) {
    return (error as { code: string }).code
  } finally {
    await client.query('rollback')
  }
}

const expected = {
  own: { view: 1, update: 1, delete: 1, createForBen: '42501', createForCat: '42501' },
  team: { view: 2, update: 2, delete: 2, createForBen: 1, createForCat: '42501' },
  all: { view: 3, update: 3, delete: 3, createForBen: 1, createForCat: 1 },
} as const

for (const resource of Object.keys(RESOURCES) as Resource[]) {
  const { column } = RESOURCES[resource]
  for (const scope of ['own', 'team', 'all'] as const) {
    t.test(`${resource} with scope ${scope}`, async (t) => {
      await seed()
      await giveAnn(['view', 'create', 'update', 'delete'].map((action) => `${resource}:${action}:${scope}`))
      const want = expected[scope]
      t.equal(await asAnn(`select count(*)::int as n from crm.${resource}`), want.view, 'view')
      t.equal(await asAnn(`update crm.${resource} set ${column} = ${column} || '!'`), want.update, 'update')
      t.equal(await asAnn(`delete from crm.${resource}`), want.delete, 'delete')
      t.equal(await asAnn(`insert into crm.${resource} (owner_id, ${column}) values ($1, 'new')`, [ann]), 1, 'create own')
      t.equal(
        await asAnn(`insert into crm.${resource} (owner_id, ${column}) values ($1, 'new')`, [ben]),
        want.createForBen,
        'create for a team mate',
      )
      t.equal(
        await asAnn(`insert into crm.${resource} (owner_id, ${column}) values ($1, 'new')`, [cat]),
        want.createForCat,
        'create for someone outside the team',
      )
      if (scope !== 'all') {
        t.equal(await asAnn(`update crm.${resource} set owner_id = $1`, [cat]), '42501', 'an owner change must stay within the scope')
      }
    })
  }

  t.test(`${resource}: a member with no grant sees zero rows and cannot write`, async (t) => {
    await seed()
    await giveAnn([])
    t.equal(await asAnn(`select count(*)::int as n from crm.${resource}`), 0)
    t.equal(await asAnn(`update crm.${resource} set ${column} = 'x'`), 0)
    t.equal(await asAnn(`delete from crm.${resource}`), 0)
    t.equal(await asAnn(`insert into crm.${resource} (owner_id, ${column}) values ($1, 'new')`, [ann]), '42501')
  })

  t.test(`${resource}: view without update sees rows it cannot change`, async (t) => {
    await seed()
    await giveAnn([`${resource}:view:all`])
    t.equal(await asAnn(`select count(*)::int as n from crm.${resource}`), 3)
    t.equal(await asAnn(`update crm.${resource} set ${column} = 'x'`), 0)
    t.equal(await asAnn(`delete from crm.${resource}`), 0)
  })
}

t.test('the views show the same rules', async (t) => {
  await giveAnn(['deals:view:team', 'deals:update:own'])
  const { rows } = await client.query("select resource, action, scope from crm.member_access where email = 'ann@acme.test' order by action")
  t.same(rows, [
    { resource: 'deals', action: 'update', scope: 'own' },
    { resource: 'deals', action: 'view', scope: 'team' },
  ])
  const { rows: matrix } = await client.query(
    "select count(*)::int as n from crm.permission_matrix where workspace = 'acme' and role = 'admin'",
  )
  t.equal(matrix[0].n, 18, 'admin: 3 resources × 6 actions, all')
  await client.query('update crm.memberships set suspended_at = now() where user_id = $1', [ann])
  const { rows: suspended } = await client.query("select count(*)::int as n from crm.member_access where email = 'ann@acme.test'")
  t.equal(suspended[0].n, 0, 'a suspended member has no access')
  t.equal(await asAnn('select count(*)::int as n from crm.deals'), 0, 'and sees nothing')
})
