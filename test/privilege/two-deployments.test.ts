// Two deployments in one PostgreSQL cluster: two databases, each migrated and served by its own
// owner with its own password. Roles are cluster-wide, so when both logged in as crm_runtime and
// crm_worker, the second to start set passwords derived from its owner's and the first one's next
// connection failed. Each database now has login roles of its own: after both started, and after
// every connection of the first was cut, both still log in and answer.
import t from 'tap'
import { migrate } from '../../src/db/migrate.ts'
import { canLogIn, ensureRuntimeRole, ensureWorkerRole } from '../../src/db/runtime-role.ts'
import { crm } from '../helpers/cli.ts'
import { adminQuery, databaseUrl } from '../helpers/database.ts'
import { TEST_PASSWORD } from '../helpers/fixtures.ts'
import { startTestServer, TEST_APP_SECRET, type TestServer } from '../helpers/server.ts'

type Deployment = { database: string; ownerUrl: string }

async function deployment(name: string): Promise<Deployment> {
  const owner = `crm_test_${name}_owner_${process.pid}`
  const database = `crm_test_${name}_${process.pid}`
  await adminQuery(`drop database if exists ${database} with (force)`)
  await adminQuery(`drop role if exists ${owner}`)
  // A superuser owner, as with the embedded database; each with a password of its own.
  await adminQuery(`create role ${owner} login superuser password '${name}-owner-password'`)
  await adminQuery(`create database ${database} owner ${owner}`)
  t.teardown(async () => {
    await adminQuery(`drop database if exists ${database} with (force)`)
    await adminQuery(`alter role ${owner} nologin`)
  })
  const ownerUrl = new URL(databaseUrl(database))
  ownerUrl.username = owner
  ownerUrl.password = `${name}-owner-password`
  await migrate(ownerUrl.toString())
  return { database, ownerUrl: ownerUrl.toString() }
}

/** Signs up until the service answers (its pool replaces the connections that were cut). */
async function signUp(server: TestServer, email: string): Promise<number> {
  let status = 0
  for (let attempt = 0; attempt < 20 && status !== 201; attempt++) {
    status = (
      await server.request('POST', '/api/signup', {
        body: { email, password: TEST_PASSWORD, name: 'Ada', workspace_name: email.split('@')[1] },
      })
    ).status
  }
  return status
}

const first = await deployment('one')
const second = await deployment('two')
/** The URLs a deployment's processes log in with: what its start set up. */
const loginsOf = async ({ ownerUrl }: Deployment) => ({
  requests: await ensureRuntimeRole(ownerUrl, TEST_APP_SECRET),
  worker: await ensureWorkerRole(ownerUrl, TEST_APP_SECRET),
})

t.test('two deployments in one cluster both start and keep working', async (t) => {
  const firstServer = await startTestServer(t, { databaseUrl: first.ownerUrl, worker: true })
  t.equal(await signUp(firstServer, 'ada@one.test'), 201, 'the first deployment answers')
  const firstLogins = await loginsOf(first)
  const secondServer = await startTestServer(t, { databaseUrl: second.ownerUrl, worker: true })
  t.equal(await signUp(secondServer, 'ada@two.test'), 201, 'the second deployment answers')
  const secondLogins = await loginsOf(second)

  t.not(new URL(firstLogins.requests).username, new URL(secondLogins.requests).username, 'each database has login roles of its own')
  for (const [label, logins] of [
    ['first', firstLogins],
    ['second', secondLogins],
  ] as const) {
    t.ok(await canLogIn(logins.requests), `after both started, the ${label} deployment's requests still log in`)
    t.ok(await canLogIn(logins.worker), `and its worker`)
  }

  // Every connection of the first deployment is cut: its pool logs in again.
  await adminQuery('select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()', [
    first.database,
  ])
  t.equal(await signUp(firstServer, 'bob@one.test'), 201, 'the first deployment answers on new connections')
  t.equal(await signUp(secondServer, 'bob@two.test'), 201, 'and so does the second')
})

t.test('a login role of that name made for another database is refused at start, saying why', async (t) => {
  const role = new URL(await ensureRuntimeRole(first.ownerUrl, TEST_APP_SECRET)).username
  const { rows } = await adminQuery(`select shobj_description(oid, 'pg_authid') as comment from pg_roles where rolname = $1`, [role])
  await adminQuery(`comment on role ${role} is 'The crm_runtime login of the database "elsewhere" (made by the service at start).'`)
  t.teardown(() => adminQuery(`comment on role ${role} is '${rows[0].comment.replaceAll("'", "''")}'`))
  await t.rejects(ensureRuntimeRole(first.ownerUrl, TEST_APP_SECRET), /belongs to another database .*"elsewhere".*would reset its password/)
})

t.test('crm login-roles prints what the service logs in as', async (t) => {
  const printed = crm(second.ownerUrl, ['login-roles', '--json'])
  t.equal(printed.status, 0, printed.stderr)
  t.equal(printed.json.runtime.url, await ensureRuntimeRole(second.ownerUrl, TEST_APP_SECRET))
  t.equal(printed.json.worker.url, await ensureWorkerRole(second.ownerUrl, TEST_APP_SECRET))
  t.ok(await canLogIn(printed.json.runtime.url), 'its runtime login logs in')
})
