// Two deployments in one PostgreSQL cluster: two databases, each migrated and served by its own
// owner with its own password. Roles are cluster-wide, so when both logged in as crm_runtime and
// crm_worker, the second to start set passwords derived from its owner's and the first one's next
// connection failed. Each database now has login roles of its own: after both started, and after
// every connection of the first was cut, both still log in and answer.
// Grants are per database but the groups holding them (crm_runtime, crm_worker) are cluster-wide:
// with PUBLIC's CONNECT, one deployment's runtime login called the other's crm.claim_sign_in and
// its worker login the other's crm.begin_import_batch. Each database now admits its own logins
// alone (sql/definitions/10_foundation.sql), also once `crm migrate` has run on a database that admitted everyone.
import pg from 'pg'
import t, { type Test } from 'tap'
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

/** The error of connecting with a login's URL to a database and running a statement there; null when it ran. */
async function attempt(loginUrl: string, database: string, statement: string): Promise<{ code?: string; message: string } | null> {
  const url = new URL(loginUrl)
  url.pathname = `/${database}`
  const client = new pg.Client({ connectionString: url.toString() })
  client.on('error', () => {})
  try {
    await client.connect()
    await client.query(statement)
    return null
  } catch (error) {
    return error as { code?: string; message: string }
  } finally {
    await client.end().catch(() => {})
  }
}

/** What one deployment's logins did to the other's database in the review, and what its own logins may do there. */
const ATTACKS = [
  {
    login: 'requests',
    what: 'locks a user out and uses up their rate limit: crm.claim_sign_in',
    statement: "select * from crm.claim_sign_in('ada@two.test')",
  },
  {
    login: 'worker',
    what: 'opens an import batch: crm.begin_import_batch',
    statement: 'select crm.begin_import_batch(gen_random_uuid(), gen_random_uuid())',
  },
  { login: 'worker', what: 'reads contacts as crm_api', statement: 'set role crm_api; select count(*) from crm.contacts' },
] as const

async function assertIsolated(t: Test, deployments: Deployment[]): Promise<void> {
  for (const from of deployments) {
    const logins = await loginsOf(from)
    for (const to of deployments) {
      for (const { login, what, statement } of ATTACKS) {
        const error = await attempt(logins[login], to.database, statement)
        if (from === to) {
          // Its own logins get in and reach the function (which may refuse the made-up arguments).
          t.not(error?.code, '42501', `${from.database}'s ${login} login ${what} in its own database: ${error?.message ?? 'ran'}`)
        } else {
          t.match(
            error,
            { code: '42501', message: /permission denied for database/ },
            `${from.database}'s ${login} login is refused by ${to.database} before it ${what}`,
          )
        }
      }
    }
  }
}

t.test("one deployment's login roles cannot get into the other's database", async (t) => {
  await assertIsolated(t, [first, second])
  const { rows } = await adminQuery(
    `select has_database_privilege('public', $1, 'CONNECT') as public, has_database_privilege($2, $1, 'CONNECT') as own_runtime,
            has_database_privilege($3, $1, 'CONNECT') as own_worker, has_database_privilege($4, $1, 'CONNECT') as other_runtime`,
    [
      second.database,
      new URL((await loginsOf(second)).requests).username,
      new URL((await loginsOf(second)).worker).username,
      new URL((await loginsOf(first)).requests).username,
    ],
  )
  t.same(rows[0], { public: false, own_runtime: true, own_worker: true, other_runtime: false }, 'in SQL: CONNECT is granted by name')
})

/** Ways a database lets another deployment's logins in that `crm migrate` closes. */
const OPENINGS = [
  // As a database migrated before the service admitted its own logins alone: PUBLIC connects, the login roles by it alone.
  {
    what: 'PUBLIC connects (a database migrated before the service admitted its own logins alone)',
    grantTo: 'public',
    ownLoginsRevoked: true,
  },
  // A DBA's slip: CONNECT is inherited, so the shared groups let every deployment's logins in.
  { what: 'the shared groups were granted CONNECT', grantTo: 'crm_runtime, crm_worker', ownLoginsRevoked: false },
] as const

for (const { what, grantTo, ownLoginsRevoked } of OPENINGS) {
  t.test(`crm migrate closes a database where ${what}`, async (t) => {
    const secondLogins = await loginsOf(second)
    await adminQuery(`grant connect on database ${second.database} to ${grantTo}`)
    if (ownLoginsRevoked)
      for (const login of [secondLogins.requests, secondLogins.worker])
        await adminQuery(`revoke connect on database ${second.database} from ${new URL(login).username}`)
    t.equal(
      await attempt((await loginsOf(first)).requests, second.database, 'select 1'),
      null,
      'the hole, as it was: the first deployment gets in',
    )

    const migrated = crm(second.ownerUrl, ['migrate'])
    t.equal(migrated.status, 0, migrated.stderr)
    await assertIsolated(t, [first, second])
  })
}

t.test('a login role the operator names (RUNTIME_DATABASE_URL) is admitted by crm migrate, to its own database only', async (t) => {
  const role = `crm_test_own_runtime_${process.pid}`
  await adminQuery(`drop role if exists ${role}`)
  await adminQuery(`create role ${role} login password 'own-runtime-password' in role crm_runtime`)
  // DROP OWNED takes its privileges on every database too (shared objects).
  t.teardown(() => adminQuery(`drop owned by ${role}; drop role ${role}`))
  const url = new URL(second.ownerUrl)
  url.username = role
  url.password = 'own-runtime-password'
  t.equal(await canLogIn(url.toString()), false, 'refused while nobody granted it CONNECT')

  const migrated = crm(second.ownerUrl, ['migrate'], { RUNTIME_DATABASE_URL: url.toString() })
  t.equal(migrated.status, 0, migrated.stderr)
  t.equal(await canLogIn(url.toString()), true, 'admitted to the database whose URL names it')
  t.match(
    await attempt(url.toString(), first.database, 'select 1'),
    { code: '42501', message: /permission denied for database/ },
    "and not to the other deployment's",
  )
})

t.test('processes of a new deployment starting at once all admit its login roles', async (t) => {
  const third = await deployment('three')
  // Each start grants CONNECT on the same database row; unserialised, all but one failed with
  // "tuple concurrently updated".
  const starts = await Promise.allSettled(Array.from({ length: 6 }, () => loginsOf(third)))
  t.same(
    starts.filter((start) => start.status === 'rejected').map((start) => String((start as PromiseRejectedResult).reason)),
    [],
    'every start set up its login roles',
  )
  await assertIsolated(t, [first, third])
})
