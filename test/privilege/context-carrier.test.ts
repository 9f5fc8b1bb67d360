// The carrier of the request context (src/db/request-context.ts), tried on whatever PostgreSQL
// the suite runs on: only the owner's code can write it, crm_api is refused every way a setting can
// be set, policies see rows only after authentication, RESET ALL, DISCARD ALL and a rolled-back
// savepoint leave nothing, and a hand-made context sees nothing. Then the same database on the
// keyed-proof path (where GRANT SET ON PARAMETER cannot be made): requests work, forgeries do not.
import pg from 'pg'
import t from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { migrate } from '../../src/db/migrate.ts'
import { ensureRuntimeRole } from '../../src/db/runtime-role.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { createTenant, withOwner } from '../helpers/fixtures.ts'
import { startTestServer, TEST_APP_SECRET } from '../helpers/server.ts'

const url = await createTestDatabase(t)
const tenant = await createTenant(url, { slug: 'carry', members: { 'ada@carry.test': 'admin', 'bob@carry.test': 'member' } })
const ada = tenant.members['ada@carry.test']
await withOwner(url, async (client) => {
  await client.query(`insert into crm.deals (workspace_id, owner_id, name) values ($1, $2, 'Visible')`, [tenant.id, ada.id])
})
const runtimeUrl = await ensureRuntimeRole(url, TEST_APP_SECRET)

const connect = async (options: pg.ClientConfig) => {
  const client = new pg.Client(options)
  client.on('error', () => {})
  await client.connect()
  t.teardown(() => client.end())
  return client
}
const codeOf = (client: pg.Client, text: string, values: unknown[] = []) =>
  client.query(text, values).then(
    () => null,
    (error: { code?: string }) => error.code ?? 'no code',
  )
const authenticate = (client: pg.Client, token = ada.token) =>
  client.query("select a.failure, set_config('role', 'crm_api', true) from crm.authenticate($1, 'carry', 'api', 600) a", [hashToken(token)])
const SEEN = `select crm.current_user_id() as user_id, crm.grant_scope('deals', 'view') as deals_view,
  (select count(*)::int from crm.deals) as deals, (select count(*)::int from crm.memberships) as memberships`
const NOTHING = { user_id: null, deals_view: null, deals: 0, memberships: 0 }

/**
 * The writer on the path in use: whether it is inlined where its callers call it (EXPLAIN shows
 * set_config in its place, src/db/request-context.ts), and that crm_api and the runtime role cannot call it (it
 * is dropped and made again when the path changes).
 */
const writer = () =>
  withOwner(url, async (client) => {
    const { rows: plan } = await client.query("explain (verbose, costs off) select crm.write_context('crm_context x')")
    const text = plan.map((row) => row['QUERY PLAN']).join('\n')
    const { rows } = await client.query(`select has_function_privilege('crm_api', 'crm.write_context(text)', 'execute') as api,
      has_function_privilege('crm_runtime', 'crm.write_context(text)', 'execute') as runtime`)
    return { inlined: text.includes('set_config') && !text.includes('write_context'), api: rows[0].api, runtime: rows[0].runtime }
  })

const runtime = await connect({ connectionString: runtimeUrl })
const { rows: path } = await runtime.query(`select crm.context_text() is null as empty,
  not (select prosecdef from pg_proc where oid = 'crm.context_text()'::regprocedure) as carrier`)

t.test('the owner may set the carrier; the runtime role may not', async (t) => {
  const result = await migrate(url)
  t.equal(result.contextCarrier, 'parameter', 'migrations choose the parameter where the owner may set it')
  t.same(path[0], { empty: true, carrier: true }, 'the parameter path is in use, and empty outside a request')
  const { rows } = await runtime.query(`select has_parameter_privilege('crm_owner', 'backtrace_functions', 'SET') as owner,
    has_parameter_privilege('crm_api', 'backtrace_functions', 'SET') as api,
    has_parameter_privilege(current_user, 'backtrace_functions', 'SET') as runtime`)
  t.same(rows[0], { owner: true, api: false, runtime: false })
  t.same(await writer(), { inlined: true, api: false, runtime: false }, "the writer is inlined into its callers, and the owner's alone")
})

t.test('policies see rows only after authentication, in that transaction', async (t) => {
  await runtime.query('begin')
  await runtime.query("select set_config('role', 'crm_api', true)")
  t.same((await runtime.query(SEEN)).rows[0], NOTHING, 'before')
  await authenticate(runtime)
  t.same((await runtime.query(SEEN)).rows[0], { user_id: ada.id, deals_view: 'all', deals: 1, memberships: 2 }, 'after')
  const { rows } = await runtime.query(`select split_part(current_setting('backtrace_functions'), ' ', 1) as word`)
  t.equal(rows[0].word, 'crm_context', 'written in the parameter')
  await runtime.query('commit')
  t.same((await runtime.query(SEEN)).rows[0], NOTHING, 'gone after commit')
})

t.test('crm_api cannot set the carrier in any way a setting is set', async (t) => {
  const forged = (await withOwner(url, async (client) => {
    await client.query('begin')
    await authenticate(client)
    const { rows } = await client.query('select crm.context_text() as text')
    await client.query('rollback')
    return rows[0].text
  })) as string
  t.match(forged, /^crm_context [0-9a-f]{32} /)
  const attempts = [
    `set backtrace_functions = '${forged}'`,
    `set local backtrace_functions = '${forged}'`,
    `select set_config('backtrace_functions', '${forged}', true)`,
    `select set_config('backtrace_functions', '${forged}', false)`,
    `alter role current_user set backtrace_functions = '${forged}'`,
    'alter role crm_api set backtrace_functions = crm_context',
    'reset backtrace_functions',
  ]
  for (const role of ['crm_runtime', 'crm_api']) {
    for (const attempt of attempts) {
      await runtime.query('begin')
      if (role === 'crm_api') await runtime.query("select set_config('role', 'crm_api', true)")
      t.equal(await codeOf(runtime, attempt), '42501', `as ${role}: ${attempt.slice(0, 60)}`)
      await runtime.query('rollback')
    }
  }
  // A function of its own with a SET clause: refused where it is made or where it runs.
  await runtime.query('begin')
  const made = await codeOf(
    runtime,
    `create function pg_temp.forge() returns int language sql set backtrace_functions = '${forged}' as 'select (select count(*)::int from crm.deals)'`,
  )
  const ran = made === null ? await codeOf(runtime, 'select pg_temp.forge()') : made
  t.equal(ran, '42501', 'a pg_temp function with a SET clause')
  await runtime.query('rollback')
  // The startup packet.
  const viaStartup = new pg.Client({ connectionString: runtimeUrl, options: `-c backtrace_functions=crm_context` })
  viaStartup.on('error', () => {})
  const startupCode = await viaStartup.connect().then(
    async () => {
      await viaStartup.end()
      return null
    },
    (error: { code?: string }) => error.code,
  )
  t.equal(startupCode, '42501', 'a startup option')
})

t.test('RESET ALL, DISCARD ALL and a rolled-back savepoint leave nothing visible', async (t) => {
  await runtime.query('begin')
  await authenticate(runtime)
  await runtime.query('reset all')
  await runtime.query("select set_config('role', 'crm_api', true)")
  t.same((await runtime.query(SEEN)).rows[0], NOTHING, 'RESET ALL')
  await runtime.query('rollback')

  await runtime.query('begin')
  await runtime.query("select set_config('role', 'crm_api', true)")
  await runtime.query('savepoint before')
  await authenticate(runtime)
  await runtime.query('rollback to savepoint before')
  t.same((await runtime.query(SEEN)).rows[0], NOTHING, 'rolled back to a savepoint')
  await runtime.query('rollback')

  // One statement authenticates (its own implicit transaction), DISCARD ALL follows.
  const other = await connect({ connectionString: runtimeUrl })
  await other.query("select a.failure from crm.authenticate($1, 'carry', 'api', 600) a", [hashToken(ada.token)])
  await other.query('discard all')
  await other.query('begin')
  await other.query("select set_config('role', 'crm_api', true)")
  t.same((await other.query(SEEN)).rows[0], NOTHING, 'DISCARD ALL')
  await other.query('rollback')
})

t.test('a hand-made context sees nothing', async (t) => {
  // A well-formed context for Ada, made by hand, in the keyed proof's settings.
  const hand = [
    'crm_context',
    ada.id.replaceAll('-', ''),
    tenant.id.replaceAll('-', ''),
    '0',
    '617069',
    'n',
    '1',
    ',deals_view_all,',
    '0',
  ].join(' ')
  await runtime.query('begin')
  await runtime.query("select set_config('role', 'crm_api', true)")
  await runtime.query("select set_config('crm.context', $1, true), set_config('crm.context_proof', 'forged', true)", [hand])
  t.same((await runtime.query(SEEN)).rows[0], NOTHING)
  await runtime.query('rollback')
})

t.test('the keyed-proof path, where the grant cannot be made', async (t) => {
  const result = await migrate(url, { contextCarrier: 'keyed_proof' })
  t.equal(result.contextCarrier, 'keyed_proof')
  t.teardown(() => migrate(url))
  t.same(await writer(), { inlined: false, api: false, runtime: false }, "this path's writer is PL/pgSQL, the owner's alone")
  const client = await connect({ connectionString: runtimeUrl })

  await client.query('begin')
  await authenticate(client)
  t.same((await client.query(SEEN)).rows[0], { user_id: ada.id, deals_view: 'all', deals: 1, memberships: 2 }, 'a proven context sees')
  const { rows: written } = await client.query(
    "select current_setting('crm.context') as text, current_setting('crm.context_proof') as proof, current_setting('backtrace_functions') as parameter",
  )
  t.equal(written[0].parameter, '', 'the parameter is not used')
  await client.query('commit')

  // The text and proof of that transaction, replayed by hand on the same backend, prove nothing.
  await client.query('begin')
  await client.query("select set_config('role', 'crm_api', true)")
  await client.query("select set_config('crm.context', $1, true), set_config('crm.context_proof', $2, true)", [
    written[0].text,
    written[0].proof,
  ])
  t.same((await client.query(SEEN)).rows[0], NOTHING, 'a replayed proof')
  await client.query('rollback')

  const server = await startTestServer(t, { databaseUrl: url, env: { CONTEXT_CARRIER: 'keyed_proof' }, migrate: true })
  t.equal(
    server.logLines.filter((line) => line.includes('the request context is carried by the keyed proof')).length,
    1,
    'one start-up line says so',
  )
  const list = await server.request('GET', '/api/deals', { token: ada.token, headers: { 'x-tenant-slug': 'carry' } })
  t.equal(list.status, 200)
  t.same(
    list.body.data.map((deal: { name: string }) => deal.name),
    ['Visible'],
  )
  const created = await server.request('POST', '/api/deals', {
    token: ada.token,
    headers: { 'x-tenant-slug': 'carry' },
    body: { name: 'Made' },
  })
  t.equal(created.status, 201)
})
