// A scoped credential only narrows (docs/decisions.md, "A scoped credential only narrows"), in SQL:
// as crm_api with a scoped context (crm.act_as with scopes, as a token with workspace:admin would
// be), every write that could widen anyone's access or mint a credential fails with CR403
// forbidden, whatever code makes it (the owner's too, inside a scoped request); what narrows
// succeeds; the same writes unscoped succeed. A property test draws two roles' grants and checks a
// scoped role change against the subset rule.
import fc from 'fast-check'
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { registerApp } from '../oauth/helpers.ts'

const server = await startTestServer(t)
const owner = await ownerClient(t, server.databaseUrl)
const tenant = await createTenant(server.databaseUrl, {
  slug: 'narrow-co',
  members: { 'ada@narrow.test': 'admin', 'bob@narrow.test': 'member', 'sam@narrow.test': 'member' },
  teams: { east: ['bob@narrow.test'], west: [] },
})
const ada = tenant.members['ada@narrow.test']
const bob = tenant.members['bob@narrow.test']
const sam = tenant.members['sam@narrow.test']
const app = await registerApp(server, ada.token, { name: 'Mail merge' })
const stranger = (await createTenant(server.databaseUrl, { members: { 'eve@elsewhere.test': 'member' } })).members['eve@elsewhere.test']
const {
  rows: [ids],
} = await owner.query(
  `select (select id from crm.teams where workspace_id = $1 and name = 'east') as east,
          (select id from crm.teams where workspace_id = $1 and name = 'west') as west,
          (select id from crm.roles where workspace_id = $1 and name = 'admin') as admin,
          (select id from crm.roles where workspace_id = $1 and name = 'member') as member,
          (select id from crm.roles where workspace_id = $1 and name = 'read_only') as read_only`,
  [tenant.id],
)
// Sam: suspended, read_only (which has no grant to update anything).
await owner.query('update crm.memberships set suspended_at = now(), role_id = $3 where workspace_id = $1 and user_id = $2', [
  tenant.id,
  sam.id,
  ids.read_only,
])
const {
  rows: [custom],
} = await owner.query(`insert into crm.roles (workspace_id, name) values ($1, 'closer') returning id`, [tenant.id])
await owner.query(
  `insert into crm.role_grants (workspace_id, role_id, resource, action, scope) values ($1, $2, 'deals', 'view', 'team'), ($1, $2, 'deals', 'update', 'own')`,
  [tenant.id, custom.id],
)
const {
  rows: [pending],
} = await owner.query(
  `insert into crm.invitations (workspace_id, email, role_id, token_hash, expires_at)
   values ($1, 'new@narrow.test', $2, sha256('inv'), now() + interval '1 day') returning id`,
  [tenant.id, ids.member],
)

const WIDENING: [string, string, unknown[]][] = [
  [
    'an invitation',
    `insert into crm.invitations (workspace_id, email, role_id, token_hash, expires_at) values ($1, 'x@narrow.test', $2, sha256('x'), now() + interval '1 day')`,
    [tenant.id, ids.read_only],
  ],
  [
    "an invitation's team",
    'insert into crm.invitation_teams (workspace_id, invitation_id, team_id) values ($1, $2, $3)',
    [tenant.id, pending.id, ids.east],
  ],
  ['a member', 'insert into crm.memberships (workspace_id, user_id, role_id) values ($1, $2, $3)', [tenant.id, stranger.id, ids.read_only]],
  [
    'an admin role for a member',
    'update crm.memberships set role_id = $2 where workspace_id = $1 and user_id = $3',
    [tenant.id, ids.admin, bob.id],
  ],
  [
    'a role granting more (deals:update:own where read_only has none)',
    'update crm.memberships set role_id = $2 where workspace_id = $1 and user_id = $3',
    [tenant.id, custom.id, sam.id],
  ],
  ['an unsuspension', 'update crm.memberships set suspended_at = null where workspace_id = $1 and user_id = $2', [tenant.id, sam.id]],
  ['an admin role', `insert into crm.roles (workspace_id, name, is_admin) values ($1, 'boss', true)`, [tenant.id]],
  ['a role made admin', 'update crm.roles set is_admin = true where workspace_id = $1 and id = $2', [tenant.id, custom.id]],
  [
    'a grant added to a role',
    `insert into crm.role_grants (workspace_id, role_id, resource, action, scope) values ($1, $2, 'contacts', 'view', 'own')`,
    [tenant.id, custom.id],
  ],
  [
    'a grant widened',
    `update crm.role_grants set scope = 'all' where workspace_id = $1 and role_id = $2 and resource = 'deals' and action = 'view'`,
    [tenant.id, custom.id],
  ],
  [
    'a grant moved to another action',
    `update crm.role_grants set action = 'delete' where workspace_id = $1 and role_id = $2 and resource = 'deals' and action = 'update'`,
    [tenant.id, custom.id],
  ],
  [
    'a member added to a team',
    'insert into crm.team_members (workspace_id, team_id, user_id) values ($1, $2, $3)',
    [tenant.id, ids.west, bob.id],
  ],
  [
    'a member moved to another team',
    'update crm.team_members set team_id = $2 where workspace_id = $1 and user_id = $3',
    [tenant.id, ids.west, bob.id],
  ],
  [
    'an OAuth app',
    `insert into crm.oauth_apps (name, client_id, confidential, redirect_uris) values ('Evil', $1, false, array['https://evil.example/cb'])`,
    [`crmapp_${'A'.repeat(22)}`],
  ],
  [
    "an OAuth app's redirect URIs",
    `update crm.oauth_apps set redirect_uris = redirect_uris || 'https://evil.example/cb'::text where workspace_id = $1 and id = $2`,
    [tenant.id, app.id],
  ],
]
/** crm_api has no update of the column at all (000035); the trigger guards code that runs as the owner. */
const A_PASSWORD: [string, string, unknown[]] = ['a password', `update crm.users set password_hash = 'x' where id = $1`, [ada.id]]

const NARROWING: [string, string, unknown[]][] = [
  ['a suspension', 'update crm.memberships set suspended_at = now() where workspace_id = $1 and user_id = $2', [tenant.id, bob.id]],
  [
    'a demotion to a role within',
    'update crm.memberships set role_id = $2 where workspace_id = $1 and user_id = $3',
    [tenant.id, ids.read_only, bob.id],
  ],
  ['a removal', 'delete from crm.memberships where workspace_id = $1 and user_id = $2', [tenant.id, bob.id]],
  ['a role without grants', `insert into crm.roles (workspace_id, name) values ($1, 'empty')`, [tenant.id]],
  ['a renamed role', `update crm.roles set name = 'dealer' where workspace_id = $1 and id = $2`, [tenant.id, custom.id]],
  [
    'a grant narrowed',
    `update crm.role_grants set scope = 'own' where workspace_id = $1 and role_id = $2 and resource = 'deals' and action = 'view'`,
    [tenant.id, custom.id],
  ],
  ['a grant removed', 'delete from crm.role_grants where workspace_id = $1 and role_id = $2', [tenant.id, custom.id]],
  ['a member out of a team', 'delete from crm.team_members where workspace_id = $1 and user_id = $2', [tenant.id, bob.id]],
  ['a team', `insert into crm.teams (workspace_id, name) values ($1, 'north')`, [tenant.id]],
  ['a withdrawn invitation', 'delete from crm.invitations where workspace_id = $1 and id = $2', [tenant.id, pending.id]],
  ['a renamed app', `update crm.oauth_apps set name = 'Mail merge 2' where workspace_id = $1 and id = $2`, [tenant.id, app.id]],
  ['a deleted app', 'delete from crm.oauth_apps where workspace_id = $1 and id = $2', [tenant.id, app.id]],
]

/** Runs a statement as the given context, rolled back: its SQLSTATE and hint, or 'ok'. */
async function outcome(scopes: string[] | null, statement: string, values: unknown[]): Promise<string> {
  await owner.query('begin')
  try {
    await owner.query(`select crm.act_as('ada@narrow.test', 'narrow-co', scopes => $1::text[])`, [scopes])
    await owner.query(statement, values)
    return 'ok'
  } catch (error) {
    const { code, hint, message } = error as { code?: string; hint?: string; message: string }
    return code === 'CR403' && /unscoped session or personal token/.test(message) ? `${code} ${hint}` : `${code}: ${message}`
  } finally {
    await owner.query('rollback')
  }
}

t.test('SQL: as a workspace:admin token, every widening write is refused with CR403 forbidden', async (t) => {
  for (const scopes of [['workspace:admin'], ['workspace:admin', 'contacts:write', 'deals:write', 'webhooks:manage']]) {
    for (const [what, statement, values] of WIDENING) {
      t.equal(await outcome(scopes, statement, values), 'CR403 forbidden', `${scopes.join(' ')}: ${what}`)
    }
  }
})

t.test('SQL: as a workspace:admin token, narrowing writes succeed', async (t) => {
  for (const [what, statement, values] of NARROWING) {
    t.equal(await outcome(['workspace:admin'], statement, values), 'ok', what)
  }
})

t.test('SQL: the same writes unscoped (a session or an unscoped token) succeed', async (t) => {
  for (const [what, statement, values] of [...WIDENING, ...NARROWING]) {
    t.equal(await outcome(null, statement, values), 'ok', what)
  }
})

t.test('SQL: code running as the owner inside a scoped request (a SECURITY DEFINER function) is refused the same way', async (t) => {
  const {
    rows: [grant],
  } = await owner.query(
    `insert into crm.oauth_grants (workspace_id, app_id, user_id, scopes, expires_at) values ($1, $2, $3, array['contacts:read'], now() + interval '1 day') returning id`,
    [tenant.id, app.id, ada.id],
  )
  const asOwner = async (scopes: string[] | null, statement: string, values: unknown[]) => {
    await owner.query('begin')
    try {
      await owner.query(`select crm.act_as('ada@narrow.test', 'narrow-co', scopes => $1::text[])`, [scopes])
      // Back to the owner, as a definer function runs, with the request's context still written.
      await owner.query('reset role')
      await owner.query(statement, values)
      return 'ok'
    } catch (error) {
      return (error as { code?: string }).code
    } finally {
      await owner.query('rollback')
    }
  }
  const statements: [string, string, unknown[]][] = [
    [
      'an OAuth grant',
      `insert into crm.oauth_grants (workspace_id, app_id, user_id, scopes, expires_at) values ($1, $2, $3, array['contacts:read'], now() + interval '1 day')`,
      [tenant.id, app.id, bob.id],
    ],
    [
      'a grant with more scopes',
      `update crm.oauth_grants set scopes = array['contacts:read', 'workspace:admin'] where id = $1`,
      [grant.id],
    ],
    ['a grant living longer', `update crm.oauth_grants set expires_at = expires_at + interval '1 year' where id = $1`, [grant.id]],
    ['an invitation', WIDENING[0][1], WIDENING[0][2]],
    A_PASSWORD,
  ]
  for (const [what, statement, values] of statements) {
    t.equal(await asOwner(['workspace:admin'], statement, values), 'CR403', `scoped: ${what}`)
    t.equal(await asOwner(null, statement, values), 'ok', `unscoped: ${what}`)
  }
  t.equal(
    await asOwner(['workspace:admin'], 'update crm.oauth_grants set revoked_at = now() where id = $1', [grant.id]),
    'ok',
    'a revocation',
  )
})

const RANK = ['own', 'team', 'all']
const PAIRS = ['contacts', 'deals'].flatMap((resource) => ['view', 'update'].map((action) => `${resource}:${action}`))
/** A role's grants: for each resource:action, no grant or one of the three scopes. */
const grantsArbitrary = fc.tuple(...PAIRS.map(() => fc.integer({ min: -1, max: 2 })))

t.test('property: a scoped role change succeeds exactly when the new role grants nothing the old one does not', async (t) => {
  await fc.assert(
    fc.asyncProperty(grantsArbitrary, grantsArbitrary, fc.boolean(), async (from, to, toAdmin) => {
      const grantRows = (ranks: number[]) =>
        PAIRS.flatMap((pair, index) => (ranks[index] < 0 ? [] : [[...pair.split(':'), RANK[ranks[index]]]]))
      await owner.query('begin')
      try {
        const roleIds: string[] = []
        for (const [name, ranks, admin] of [
          ['from_role', from, false],
          ['to_role', to, toAdmin],
        ] as const) {
          const {
            rows: [role],
          } = await owner.query('insert into crm.roles (workspace_id, name, is_admin) values ($1, $2, $3) returning id', [
            tenant.id,
            name,
            admin,
          ])
          for (const [resource, action, scope] of grantRows([...ranks]))
            await owner.query('insert into crm.role_grants (workspace_id, role_id, resource, action, scope) values ($1, $2, $3, $4, $5)', [
              tenant.id,
              role.id,
              resource,
              action,
              scope,
            ])
          roleIds.push(role.id)
        }
        await owner.query('update crm.memberships set role_id = $3 where workspace_id = $1 and user_id = $2', [
          tenant.id,
          bob.id,
          roleIds[0],
        ])
        await owner.query(`select crm.act_as('ada@narrow.test', 'narrow-co', scopes => array['workspace:admin'])`)
        const within = !toAdmin && to.every((rank, index) => rank < 0 || from[index] >= rank)
        let refused: string | undefined
        try {
          await owner.query('savepoint change')
          await owner.query('update crm.memberships set role_id = $3 where workspace_id = $1 and user_id = $2', [
            tenant.id,
            bob.id,
            roleIds[1],
          ])
        } catch (error) {
          refused = (error as { code?: string }).code
          await owner.query('rollback to savepoint change')
        }
        if (within !== (refused === undefined)) throw new Error(`from ${from} to ${to} (admin ${toAdmin}): refused ${refused}`)
        if (refused !== undefined && refused !== 'CR403') throw new Error(`refused with ${refused}`)
      } finally {
        await owner.query('rollback')
      }
    }),
    { numRuns: 120 },
  )
  t.pass('120 role pairs')
})
