// The login role requests run as, tried by hand: whatever it sets in its session it sees no row of
// any workspace without a proven context, cannot become the owner, and cannot call what only the
// owner or the worker calls (housekeeping, the heartbeat, the attempt counters themselves).
import pg from 'pg'
import t from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { ensureRuntimeRole, loginRoleName, RUNTIME_ROLE } from '../../src/db/runtime-role.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { addMember, createTenant, withOwner } from '../helpers/fixtures.ts'
import { TEST_APP_SECRET } from '../helpers/server.ts'

const url = await createTestDatabase(t)
const a = await createTenant(url, { slug: 'runtime-a', plan: 'pro', members: { 'admin@a.test': 'admin' } })
const b = await createTenant(url, { slug: 'runtime-b', members: { 'admin@b.test': 'admin' } })
const ownerName = decodeURIComponent(new URL(url).username)
const contactIds: Record<string, string> = {}
const ownScope = await withOwner(url, async (client) => {
  for (const tenant of [a, b]) {
    const owner = Object.values(tenant.members)[0].id
    const { rows } = await client.query(
      `insert into crm.contacts (workspace_id, owner_id, first_name) values ($1, $2, 'Someone') returning id`,
      [tenant.id, owner],
    )
    contactIds[tenant.slug] = rows[0].id
  }
  // A member of A who sees only the contacts they own.
  const { rows } = await client.query(`insert into crm.roles (workspace_id, name) values ($1, 'own_contacts') returning id`, [a.id])
  await client.query(
    `insert into crm.role_grants (workspace_id, role_id, resource, action, scope) values ($1, $2, 'contacts', 'view', 'own'), ($1, $2, 'contacts', 'update', 'own')`,
    [a.id, rows[0].id],
  )
  return addMember(client, a.id, 'own@a.test', 'own_contacts')
})

const runtime = new pg.Client({ connectionString: await ensureRuntimeRole(url, TEST_APP_SECRET) })
await runtime.connect()
t.teardown(() => runtime.end())
const contacts = async () => Number((await runtime.query('select count(*) as n from crm.contacts')).rows[0].n)
const refusal = (text: string, values: unknown[] = []) =>
  runtime.query(text, values).then(
    () => null,
    (error: { code?: string }) => error.code,
  )

t.test('the role is confined', async (t) => {
  const { rows } = await runtime.query(
    `select current_user as name, r.rolsuper, r.rolbypassrls,
       (select count(*) from pg_class c where c.relowner = r.oid)::int as owned_relations,
       (select count(*) from pg_proc p where p.proowner = r.oid)::int as owned_functions
     from pg_roles r where r.rolname = current_user`,
  )
  t.same(rows[0], {
    name: loginRoleName(RUNTIME_ROLE, new URL(url).pathname.slice(1)),
    rolsuper: false,
    rolbypassrls: false,
    owned_relations: 0,
    owned_functions: 0,
  })
})

t.test('no context, no rows, whatever the session sets', async (t) => {
  t.equal(await contacts(), 0, 'as the runtime role')
  await runtime.query('reset role')
  t.equal(await contacts(), 0, 'after RESET ROLE')
  t.equal(await refusal(`set role ${runtime.escapeIdentifier(ownerName)}`), '42501', 'SET ROLE to the owner is refused')
  t.equal(await contacts(), 0, 'still none')
  await runtime.query('begin')
  try {
    const admin = a.members['admin@a.test'].id
    await runtime.query(
      `select set_config('crm.user_id', $1, true), set_config('crm.workspace_id', $2, true), set_config('crm.via', 'api', true),
         set_config('crm.context_proof', repeat('0', 64), true)`,
      [admin, a.id],
    )
    t.equal(await contacts(), 0, 'hand-set context settings with a forged proof')
    await runtime.query(`select set_config('role', 'crm_api', true)`)
    t.equal(await contacts(), 0, 'nor as crm_api')
  } finally {
    await runtime.query('rollback')
  }
})

t.test('owner-only functions refuse the runtime role', async (t) => {
  t.equal(await refusal('select crm.prune_imports(1)'), '42501', 'housekeeping of imports')
  t.equal(await refusal('select crm.housekeeping(1)'), '42501', 'housekeeping')
  t.equal(await refusal(`select crm.worker_heartbeat('w', 'h', '1 minute')`), '42501', 'the worker heartbeat')
  t.equal(await refusal(`select crm.worker_stopped('w')`), '42501', 'a worker stopping')
  t.equal(await refusal('select crm.webhooks_enabled($1)', [a.id]), '42501', "another workspace's plan")
  t.equal(await refusal(`select crm.claim_attempt('sign_in', 'admin@a.test')`), '42501', 'sign-in throttling')
  t.equal(await refusal(`select crm.act_as('admin@a.test', 'runtime-a')`), '42501', 'crm.act_as')
})

t.test('an association event only for a record the caller may view', async (t) => {
  await runtime.query('begin')
  try {
    const { rows } = await runtime.query(
      `select a.failure, set_config('role', 'crm_api', true) from crm.authenticate($1, 'runtime-a', 'api', 600) a`,
      [hashToken(ownScope.token)],
    )
    t.equal(rows[0].failure, null, 'authenticated as a member who sees only their own contacts')
    t.equal(await contacts(), 0, "the admin's contact is not visible to them")
    const error = await runtime
      .query(`select crm.write_associations_changed_event('contact', $1, '{"companies": {"added": [], "removed": []}}')`, [
        contactIds['runtime-a'],
      ])
      .then(
        () => null,
        (error: { code?: string }) => error.code,
      )
    t.equal(error, 'CR404', 'nor written into an event')
  } finally {
    await runtime.query('rollback')
  }
})
