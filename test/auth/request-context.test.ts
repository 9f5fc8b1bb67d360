// The settings policies trust: set transaction-locally with bound values, gone after commit on the
// same pooled connection, and worthless when set by hand without the proof.
import t from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { createDatabasePool, sql } from '../../src/db/pool.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'

const url = await createTestDatabase(t)
const tenant = await createTenant(url, { slug: 'acme', members: { 'ada@acme.test': 'admin', 'bob@acme.test': 'member' } })
const ada = tenant.members['ada@acme.test']

t.test('request settings are transaction-local and gone after commit on the same connection', async (t) => {
  const pool = await createDatabasePool(url, { maxPoolSize: 1 })
  t.teardown(() => pool.end())
  const inside = await pool.transaction(async (db) => {
    await db.one(
      sql.unsafe`select a.*, set_config('role', 'crm_api', true) from crm.authenticate(${sql.binary(hashToken(ada.token))}, ${'acme'}, ${'api'}, ${600}) a`,
    )
    return (await db.one(sql.unsafe`
      select current_user as role, crm.current_user_id() as user_id, crm.current_workspace_id() as workspace_id,
             crm.current_via() as via, crm.context_text() as context, pg_backend_pid() as pid`)) as Record<string, unknown>
  })
  t.match(inside, { role: 'crm_api', user_id: ada.id, workspace_id: tenant.id, via: 'api' })
  t.ok(inside.context, 'a context was written')
  const after = (await pool.one(sql.unsafe`
    select current_user as role, crm.context_text() as context, crm.current_user_id() as proven_user, pg_backend_pid() as pid`)) as Record<
    string,
    unknown
  >
  t.equal(after.pid, inside.pid, 'the same pooled connection')
  t.not(after.role, 'crm_api', 'the role switch ended with the transaction')
  t.equal(after.context, null, 'the context is gone')
  t.equal(after.proven_user, null)
})

t.test('settings set by hand as crm_api prove nothing: zero rows', async (t) => {
  const client = await ownerClient(t, url)
  await client.query('begin')
  await client.query("select set_config('role', 'crm_api', true)")
  await client.query(
    "select set_config('crm.user_id', $1, true), set_config('crm.workspace_id', $2, true), set_config('crm.context_proof', 'forged', true)",
    [ada.id, tenant.id],
  )
  const { rows } = await client.query(`select crm.current_user_id() as user_id,
    (select count(*)::int from crm.memberships) as memberships, (select count(*)::int from crm.tokens) as tokens,
    (select count(*)::int from crm.roles) as roles, (select count(*)::int from crm.workspaces) as workspaces`)
  t.same(rows[0], { user_id: null, memberships: 0, tokens: 0, roles: 0, workspaces: 0 })
  for (const statement of [
    `select crm.set_context('${ada.id}', '${tenant.id}', 'api', null, null)`,
    // the context's internal pieces (src/db/request-context.ts): no EXECUTE for crm_api
    `select crm.put_context('${ada.id}', '${tenant.id}', 'api', null, null)`,
    "select crm.write_context('crm_context')",
    `select crm.team_user_ids('${ada.id}', '${tenant.id}')`,
    `select crm.touch_caller('${ada.id}', '${tenant.id}', true, '${ada.id}', true)`,
    'select * from crm.internal_secrets',
    `select crm.act_as('ada@acme.test', 'acme')`,
    `insert into crm.teams (workspace_id, name) values ('${tenant.id}', 'intruders')`,
  ]) {
    await client.query('savepoint probe')
    const error = await client.query(statement).then(
      () => null,
      (caught) => caught,
    )
    t.ok(error, `refused: ${statement.slice(0, 50)}`)
    await client.query('rollback to savepoint probe')
  }
  await client.query('rollback')
})

// Every helper the policies call checks the proof in its own body (sql/definitions/20_tenancy_and_access.sql): each answers the
// member's own rights under a proven context, and nothing under hand-set settings, even with the
// settings and the proof of a real context copied from an earlier transaction of the same backend.
const CONTEXT_HELPERS = `select crm.current_user_id() as user_id, crm.current_workspace_id() as workspace_id,
  crm.current_oauth_app_id() as oauth_app_id, crm.current_scopes() as scopes,
  crm.grant_scope('deals', 'view') as deals_view, crm.scope_owner_ids('deals', 'view') as deals_view_owners,
  crm.is_admin() as is_admin, crm.is_admin_for('workspace:admin') as is_admin_for,
  cardinality(crm.colleague_ids()) as colleagues,
  crm.my_workspace_ids() as workspaces`

t.test('the policy helpers answer for a proven context only; a replayed context proves nothing', async (t) => {
  const client = await ownerClient(t, url)
  const bob = tenant.members['bob@acme.test']
  const { rows: expected } = await client.query(
    `select (select g.scope from crm.memberships m join crm.role_grants g using (workspace_id, role_id)
              where m.user_id = $1 and m.workspace_id = $2 and g.resource = 'deals' and g.action = 'view') as deals_view,
            crm.team_user_ids($1, $2) as team`,
    [bob.id, tenant.id],
  )
  const proven = async (token: string) => {
    await client.query('begin')
    await client.query("select a.failure, set_config('role', 'crm_api', true) from crm.authenticate($1, 'acme', 'api', 600) a", [
      hashToken(token),
    ])
    const { rows } = await client.query(`${CONTEXT_HELPERS}, crm.context_text() as context_text,
      current_setting('crm.context_proof', true) as proof`)
    await client.query('commit')
    return rows[0]
  }
  const asAda = await proven(ada.token)
  t.match(asAda, {
    user_id: ada.id,
    workspace_id: tenant.id,
    oauth_app_id: null,
    scopes: null,
    deals_view: 'all',
    deals_view_owners: [],
    is_admin: true,
    is_admin_for: true,
    colleagues: 2,
    workspaces: [tenant.id],
  })
  const asBob = await proven(bob.token)
  const bobOwners = expected[0].deals_view === 'own' ? [bob.id] : expected[0].deals_view === 'team' ? expected[0].team : []
  t.match(asBob, {
    user_id: bob.id,
    deals_view: expected[0].deals_view,
    deals_view_owners: bobOwners,
    is_admin: false,
    is_admin_for: false,
    colleagues: 2,
  })

  // The same backend, a later transaction: Ada's context and proof set by hand, in the keyed proof's
  // settings and in the carrier (which crm_api may not set at all).
  await client.query('begin')
  await client.query("select set_config('role', 'crm_api', true)")
  await client.query("select set_config('crm.context', $1, true), set_config('crm.context_proof', $2, true)", [
    asAda.context_text,
    asAda.proof ?? 'forged',
  ])
  await client.query('savepoint carrier')
  const carrierRefused = await client.query("select set_config('backtrace_functions', $1, true)", [asAda.context_text]).then(
    () => null,
    (error: { code?: string }) => error.code,
  )
  t.equal(carrierRefused, '42501', 'crm_api cannot set the carrier')
  await client.query('rollback to savepoint carrier')
  const { rows: replayed } = await client.query(CONTEXT_HELPERS)
  t.same(replayed[0], {
    user_id: null,
    workspace_id: null,
    oauth_app_id: null,
    scopes: [],
    deals_view: null,
    deals_view_owners: [],
    is_admin: false,
    is_admin_for: false,
    colleagues: 0,
    workspaces: [],
  })
  await client.query('rollback')
})

t.test('crm.act_as shows a DBA exactly what the member sees', async (t) => {
  const client = await ownerClient(t, url)
  await client.query('begin')
  const {
    rows: [said],
  } = await client.query("select crm.act_as('BOB@acme.test', 'acme') as said")
  t.match(said.said, /acting as bob@acme\.test in acme/)
  const { rows } = await client.query(`select current_user as role, crm.current_user_id() as user_id, crm.is_admin() as admin,
    crm.grant_scope('deals', 'update') as deals_update, crm.grant_scope('deals', 'export') as deals_export,
    (select count(*)::int from crm.tokens) as own_tokens, (select count(*)::int from crm.memberships) as memberships`)
  t.same(rows[0], {
    role: 'crm_api',
    user_id: tenant.members['bob@acme.test'].id,
    admin: false,
    deals_update: 'own',
    deals_export: null,
    own_tokens: 1,
    memberships: 2,
  })
  await client.query('rollback')
  const error = await client.query("select crm.act_as('nobody@acme.test', 'acme')").then(
    () => null,
    (caught) => caught,
  )
  t.match(error?.message, /is not a member of workspace acme/)
})

t.test('crm.authenticate records the last use of a token at most once a minute, and the last workspace', async (t) => {
  const client = await ownerClient(t, url)
  await client.query('update crm.tokens set last_used_at = null where user_id = $1', [ada.id])
  await client.query('update crm.users set last_workspace_id = null where id = $1', [ada.id])
  const call = () => client.query("select a.failure from crm.authenticate($1, 'acme', 'api', 600) a", [hashToken(ada.token)])
  t.equal((await call()).rows[0].failure, null)
  const first = (
    await client.query(
      'select t.last_used_at, u.last_workspace_id from crm.tokens t join crm.users u on u.id = t.user_id where t.token_hash = $1',
      [hashToken(ada.token)],
    )
  ).rows[0]
  t.ok(first.last_used_at, 'last use recorded')
  t.equal(first.last_workspace_id, tenant.id, 'last workspace recorded')
  await client.query("update crm.tokens set last_used_at = now() - interval '30 seconds' where token_hash = $1", [hashToken(ada.token)])
  const before = (await client.query('select last_used_at from crm.tokens where token_hash = $1', [hashToken(ada.token)])).rows[0]
    .last_used_at
  await call()
  t.same(
    (await client.query('select last_used_at from crm.tokens where token_hash = $1', [hashToken(ada.token)])).rows[0].last_used_at,
    before,
    'not rewritten within the minute',
  )
  await client.query("update crm.tokens set last_used_at = now() - interval '2 minutes' where token_hash = $1", [hashToken(ada.token)])
  await call()
  const after = (await client.query('select last_used_at from crm.tokens where token_hash = $1', [hashToken(ada.token)])).rows[0]
    .last_used_at
  t.ok(after > before, 'rewritten after a minute')
})
