// The request context kept with the token (sql/definitions/20_tenancy_and_access.sql):
// crm.authenticate stores the text it wrote on the token's row, keyed by workspace, access version
// and via, and a cached identity's request writes it back instead of computing it again. Checked
// here: crm_api can neither read nor write it; it is what a cached identity's request uses; every
// change to what it holds (grants, role, suspension, team) is seen by the very next request, which a
// property compares with crm.act_as computing the context afresh.
import fc from 'fast-check'
import t from 'tap'
import { createRole, startWorld } from '../records/helpers.ts'

const world = await startWorld(t, {
  roles: { seller: ['deals:view:own'] },
  members: { 'carol@acme.test': 'seller', 'dave@acme.test': 'member' },
  teams: { east: ['carol@acme.test'] },
  // The property sends about 1,500 requests as one user within a minute.
  env: { RATE_LIMIT_PER_MINUTE: '1000000' },
})
const carol = world.as('carol@acme.test')
const id = (email: string) => world.tenant.members[email].id
const seller = (await world.owner("select id from crm.roles where workspace_id = $1 and name = 'seller'", [world.tenant.id])).rows[0]
  .id as string
const east = (await world.owner("select id from crm.teams where workspace_id = $1 and name = 'east'", [world.tenant.id])).rows[0]
  .id as string
await createRole(world.server.databaseUrl, world.tenant.id, 'spare', ['deals:view:all'])

// One deal per owner: carol, dave (a team mate when the property puts him in east), the admin.
const deals: Record<string, string> = {}
for (const email of ['carol@acme.test', 'dave@acme.test', 'admin@acme.test']) {
  const { rows } = await world.owner(
    "insert into crm.deals (workspace_id, owner_id, created_by, updated_by, name) values ($1, $2, $2, $2, 'Kept') returning id",
    [world.tenant.id, id(email)],
  )
  deals[email] = rows[0].id
}

async function stored(email: string) {
  const { rows } = await world.owner('select context, context_key from crm.tokens where user_id = $1', [id(email)])
  return rows[0] as { context: string | null; context_key: string | null }
}

async function visibleOverHttp(): Promise<string[]> {
  const answer = await carol.get('/api/deals?limit=200')
  // A suspended member is refused (401): sees nothing, as crm.act_as's context without grants.
  if (answer.status === 401) return []
  if (answer.status !== 200) throw new Error(`the list answered ${answer.status}`)
  return answer.body.data.map((row: { id: string }) => row.id).sort()
}

async function visibleAfresh(): Promise<string[]> {
  await world.owner('begin')
  try {
    await world.owner('select crm.act_as($1, $2)', ['carol@acme.test', 'acme'])
    return (await world.owner('select id from crm.deals order by id')).rows.map((row) => row.id)
  } finally {
    await world.owner('rollback')
  }
}

t.test('crm.authenticate keeps the context on the token; crm_api cannot reach it', async (t) => {
  t.equal((await world.as('dave@acme.test').get('/api/deals')).status, 200)
  const kept = await stored('dave@acme.test')
  t.match(kept.context, /^crm_context /, 'the text the context was written with')
  t.match(kept.context_key, new RegExp(`^${world.tenant.id} \\d+ api$`), 'under workspace, access version and via')
  await world.owner('begin')
  await world.owner("select set_config('role', 'crm_api', true)")
  await t.rejects(world.owner('select context from crm.tokens limit 1'), { code: '42501' }, 'crm_api cannot read it')
  await world.owner('rollback')
  await world.owner('begin')
  await world.owner("select set_config('role', 'crm_api', true)")
  await t.rejects(world.owner("update crm.tokens set context = 'x'"), { code: '42501' }, 'nor write it')
  await world.owner('rollback')
})

t.test("a cached identity's request writes the kept context, and a moved access version computes it again", async (t) => {
  const dave = world.as('dave@acme.test')
  t.equal((await dave.get(`/api/deals/${deals['admin@acme.test']}`)).status, 200, 'a member views every deal')
  // The owner narrows the kept text by hand (a DBA can; crm_api cannot): the member's view grant goes.
  await world.owner("update crm.tokens set context = regexp_replace(context, 'deals_view_all', 'deals_view_own') where user_id = $1", [
    id('dave@acme.test'),
  ])
  t.equal((await dave.get(`/api/deals/${deals['admin@acme.test']}`)).status, 404, 'the next request used the kept text')
  // Any change to the membership, its role or the role's grants moves the access version.
  await world.owner('update crm.memberships set access_version = access_version + 1 where workspace_id = $1 and user_id = $2', [
    world.tenant.id,
    id('dave@acme.test'),
  ])
  t.equal((await dave.get(`/api/deals/${deals['admin@acme.test']}`)).status, 200, 'computed again from the role')
  t.match((await stored('dave@acme.test')).context, /deals_view_all/, 'and kept again')
})

t.test('a context that names a team is never kept', async (t) => {
  await world.owner("update crm.role_grants set scope = 'team' where workspace_id = $1 and role_id = $2 and resource = 'deals'", [
    world.tenant.id,
    seller,
  ])
  t.equal((await carol.get('/api/deals')).status, 200)
  t.same(await stored('carol@acme.test'), { context: null, context_key: null })
  await world.owner("update crm.role_grants set scope = 'own' where workspace_id = $1 and role_id = $2 and resource = 'deals'", [
    world.tenant.id,
    seller,
  ])
})

type Step =
  | { kind: 'grant'; scope: 'own' | 'team' | 'all' }
  | { kind: 'revoke' }
  | { kind: 'role'; name: 'seller' | 'spare' }
  | { kind: 'suspend'; suspended: boolean }
  | { kind: 'team'; dave: boolean }

const scope = fc.constantFrom<'own' | 'team' | 'all'>('own', 'team', 'all')
const step: fc.Arbitrary<Step> = fc.oneof(
  fc.record({ kind: fc.constant<'grant'>('grant'), scope }),
  fc.record({ kind: fc.constant<'revoke'>('revoke') }),
  fc.record({ kind: fc.constant<'role'>('role'), name: fc.constantFrom<'seller' | 'spare'>('seller', 'spare') }),
  fc.record({ kind: fc.constant<'suspend'>('suspend'), suspended: fc.boolean() }),
  fc.record({ kind: fc.constant<'team'>('team'), dave: fc.boolean() }),
)

async function apply(change: Step): Promise<void> {
  const workspace = world.tenant.id
  if (change.kind === 'grant')
    await world.owner(
      `insert into crm.role_grants (workspace_id, role_id, resource, action, scope) values ($1, $2, 'deals', 'view', $3)
       on conflict (workspace_id, role_id, resource, action) do update set scope = excluded.scope`,
      [workspace, seller, change.scope],
    )
  if (change.kind === 'revoke')
    await world.owner("delete from crm.role_grants where workspace_id = $1 and role_id = $2 and resource = 'deals' and action = 'view'", [
      workspace,
      seller,
    ])
  if (change.kind === 'role')
    await world.owner(
      'update crm.memberships set role_id = (select id from crm.roles where workspace_id = $1 and name = $2) where workspace_id = $1 and user_id = $3',
      [workspace, change.name, id('carol@acme.test')],
    )
  if (change.kind === 'suspend')
    await world.owner('update crm.memberships set suspended_at = $3 where workspace_id = $1 and user_id = $2', [
      workspace,
      id('carol@acme.test'),
      change.suspended ? new Date() : null,
    ])
  if (change.kind === 'team')
    await world.owner(
      change.dave
        ? 'insert into crm.team_members (workspace_id, team_id, user_id) values ($1, $2, $3) on conflict do nothing'
        : 'delete from crm.team_members where workspace_id = $1 and team_id = $2 and user_id = $3',
      [workspace, east, id('dave@acme.test')],
    )
}

t.test('property: after any change, the next request sees what a context computed afresh sees', async (t) => {
  await fc.assert(
    fc.asyncProperty(fc.array(step, { minLength: 1, maxLength: 6 }), async (steps) => {
      for (const change of steps) {
        await visibleOverHttp() // the identity is cached, and its context kept when it can be
        await apply(change)
        const overHttp = await visibleOverHttp()
        const afresh = await visibleAfresh()
        if (JSON.stringify(overHttp) !== JSON.stringify(afresh))
          throw new Error(`after ${JSON.stringify(change)}: HTTP saw ${overHttp.length} deals, afresh ${afresh.length}`)
      }
      await apply({ kind: 'suspend', suspended: false })
    }),
    { numRuns: 200 },
  )
  t.pass('200 sequences of changes, each seen by the next request')
})
