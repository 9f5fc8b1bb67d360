// The whole service with an owner that is no superuser (as on a managed PostgreSQL): a role with
// CREATEROLE that owns its database migrates it, the service starts with it, and then the owner
// can no longer log in at all. Sign-up, sign-in, an invitation, records, a webhook delivery and an
// import all still work: after start, requests run as crm_runtime and jobs as crm_worker, and the
// SECURITY DEFINER functions work under FORCE ROW LEVEL SECURITY through the owner's policy.
import pg from 'pg'
import t from 'tap'
import { migrate } from '../../src/db/migrate.ts'
import { loginRoleName, RUNTIME_ROLE, WORKER_ROLE } from '../../src/db/runtime-role.ts'
import { adminQuery, databaseUrl, testServerUrl } from '../helpers/database.ts'
import { TEST_PASSWORD } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { importCsv } from '../imports/helpers.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from '../webhooks/receiver.ts'

const OWNER = 'crm_test_plain_owner'
const database = `crm_test_plain_${process.pid}`
// The login roles' passwords derive from the owner's: the same password as the test cluster's
// owner keeps them what every other test file's server expects (roles are cluster-wide).
const password = decodeURIComponent(new URL(testServerUrl()).password)
const superuser = decodeURIComponent(new URL(testServerUrl()).username)

await adminQuery(`do $$ begin
  if not exists (select from pg_roles where rolname = '${OWNER}') then create role ${OWNER}; end if;
end $$`)
await adminQuery(`alter role ${OWNER} login nosuperuser nobypassrls createrole password '${password.replaceAll("'", "''")}'`)
// The cluster's crm roles were created by the test run's template migration. A role with
// CREATEROLE administers the roles it creates (PostgreSQL 16 and later ask for ADMIN OPTION):
// the grant stands for having created them, without membership.
const { rows: version } = await adminQuery(`select current_setting('server_version_num')::int as number`)
if (version[0].number >= 160000) {
  for (const role of ['crm_api', 'crm_runtime', 'crm_worker', 'crm_owner'])
    await adminQuery(`grant ${role} to ${OWNER} with admin true, inherit false, set false`)
}
await adminQuery(`drop database if exists ${database} with (force)`)
await adminQuery(`create database ${database} owner ${OWNER}`)
t.teardown(async () => {
  await adminQuery(`drop database if exists ${database} with (force)`)
  await adminQuery(`alter role ${OWNER} nologin`)
})

const ownerUrl = (() => {
  const parsed = new URL(databaseUrl(database))
  parsed.username = OWNER
  parsed.password = password
  return parsed.toString()
})()

await migrate(ownerUrl)

const receiver = await startReceiver(t)
const server = await startTestServer(t, { databaseUrl: ownerUrl, worker: true, env: WEBHOOK_TEST_ENV })

// From here on the owner cannot log in: whatever still works, works without it.
await adminQuery(`alter role ${OWNER} nologin`)
await adminQuery('select pg_terminate_backend(pid) from pg_stat_activity where usename = $1', [OWNER])

const inDatabase = async (text: string, values: unknown[] = []) => {
  const client = new pg.Client({ connectionString: databaseUrl(database) })
  await client.connect()
  try {
    return (await client.query(text, values)).rows
  } finally {
    await client.end()
  }
}

t.test('the owner is no superuser and cannot bypass row-level security', async (t) => {
  const { rows } = await adminQuery('select rolsuper, rolbypassrls from pg_roles where rolname = $1', [OWNER])
  t.same(rows[0], { rolsuper: false, rolbypassrls: false })
})

t.test('the owner cannot log in any more', async (t) => {
  const client = new pg.Client({ connectionString: ownerUrl })
  client.on('error', () => {})
  await t.rejects(client.connect(), { code: '28000' })
})

t.test('sign-up, sign-in, an invitation, records, a webhook and an import, without the owner', async (t) => {
  const signedUp = await server.request('POST', '/api/signup', {
    body: { email: 'ada@plain.test', password: TEST_PASSWORD, name: 'Ada', workspace_name: 'Plain' },
  })
  t.equal(signedUp.status, 201, signedUp.text)
  const wrong = await server.request('POST', '/api/token', {
    body: { email: 'ada@plain.test', password: 'not the password', device_name: 'test' },
  })
  t.equal(wrong.status, 401)
  const signedIn = await server.request('POST', '/api/token', {
    body: { email: 'ada@plain.test', password: TEST_PASSWORD, device_name: 'test' },
  })
  t.equal(signedIn.status, 200, signedIn.text)
  const token: string = signedIn.body.token

  const invited = await server.request('POST', '/api/invitations', { token, body: { email: 'grace@plain.test', role: 'member' } })
  t.equal(invited.status, 201, invited.text)
  const secret = new URL(invited.body.data.accept_url).searchParams.get('token')
  const accepted = await server.request('POST', '/api/invitations/accept', {
    body: { token: secret, password: TEST_PASSWORD, name: 'Grace' },
  })
  t.equal(accepted.status, 200, accepted.text)

  // The workspace is on its trial: webhooks work.
  const subscribed = await server.request('POST', '/api/webhook-subscriptions', {
    token,
    body: { name: 'Sync', url: `${receiver.url}/hook`, events: ['contact.*'] },
  })
  t.equal(subscribed.status, 201, subscribed.text)
  const created = await server.request('POST', '/api/contacts', { token, body: { first_name: 'Lin', email: 'lin@plain.test' } })
  t.equal(created.status, 201, created.text)
  const read = await server.request('GET', `/api/contacts/${created.body.data.id}`, { token })
  t.equal(read.status, 200, 'a single-statement read')
  await receiver.waitFor((received) => received.some((request) => request.body?.data?.object?.id === created.body.data.id))
  t.pass('the worker delivered the webhook')

  const { job } = await importCsv(server, token, 'contacts', 'first_name,email\nMo,mo@plain.test\nJo,jo@plain.test\n')
  t.equal(job.status, 'completed', JSON.stringify(job))
  t.equal(job.counts.created, 2)

  const roles = await inDatabase(
    `select distinct usename::text as name from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid() order by 1`,
  )
  t.same(
    roles
      .map((row) => row.name)
      .filter((name) => name !== superuser)
      .sort(),
    [loginRoleName(RUNTIME_ROLE, database), loginRoleName(WORKER_ROLE, database)].sort(),
    'the service is connected as the login roles of this database only',
  )
})

t.test('every table forces row-level security, and the owner reaches rows through its policy', async (t) => {
  const unforced = await inDatabase(
    `select relname from pg_class where relnamespace = 'crm'::regnamespace and relkind = 'r' and not (relrowsecurity and relforcerowsecurity)
       and relname not in ('schema_migrations', 'schema_definitions')`,
  )
  t.same(unforced, [])
  const { rows } = await adminQuery(`select pg_has_role($1, 'crm_owner', 'usage') as member`, [OWNER])
  t.equal(rows[0].member, true, 'the migrating owner is a member of crm_owner')
})
