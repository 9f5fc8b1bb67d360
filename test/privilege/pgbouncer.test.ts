// The API behind PgBouncer in transaction mode, configured to drop the startup parameters it
// cannot pool (options, statement_timeout), set up exactly as docs/operations.md's Connection poolers section says:
// the owner connects to PostgreSQL directly, `crm login-roles` prints the login roles for the
// pooler's auth_file, and RUNTIME_DATABASE_URL sends requests through the pooler as the runtime
// login role. The service starts, reads and writes, and one workspace still cannot read another's
// contact by id. Skipped when pgbouncer is not installed (.ci/run installs it).
import { type ChildProcess, spawn } from 'node:child_process'
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import t, { type Test } from 'tap'
import { freePort } from '../../src/db/provision.ts'
import { crm } from '../helpers/cli.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const PGBOUNCER = '/usr/sbin/pgbouncer'

if (!existsSync(PGBOUNCER)) {
  t.comment(`skipped: ${PGBOUNCER} is missing (apt-get install pgbouncer; .ci/run installs it)`)
  t.pass('pgbouncer is not installed')
} else {
  t.test('the API behind pgbouncer in transaction mode', behindPgBouncer)
}

async function behindPgBouncer(t: Test): Promise<void> {
  const direct = await createTestDatabase(t)
  const server = new URL(direct)
  const database = server.pathname.slice(1)
  // The recipe, step 1: the login roles and their passwords, in the auth_file's own format.
  const printed = crm(direct, ['login-roles'])
  t.equal(printed.status, 0, printed.stderr)
  const runtimeLine = printed.stdout.split('\n').find((line) => line.startsWith('"crm_runtime_'))
  t.ok(runtimeLine, `crm login-roles names the runtime login role (${printed.stdout.replace(/" "[^"]*"/g, '" "…"')})`)
  const [, runtimeRole, runtimePassword] = /^"([^"]*)" "([^"]*)"$/.exec(runtimeLine ?? '') ?? []

  const dir = mkdtempSync(join(tmpdir(), 'crm-pgbouncer-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const port = await freePort()
  // Step 2: its lines in the pooler's auth_file (the owner is not there: it connects directly).
  writeFileSync(join(dir, 'userlist.txt'), printed.stdout)
  writeFileSync(
    join(dir, 'pgbouncer.ini'),
    [
      '[databases]',
      `${database} = host=${server.hostname} port=${server.port} dbname=${database}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      `unix_socket_dir =`,
      'auth_type = scram-sha-256',
      `auth_file = ${join(dir, 'userlist.txt')}`,
      'pool_mode = transaction',
      'ignore_startup_parameters = extra_float_digits,options,statement_timeout',
      'default_pool_size = 10',
      'max_client_conn = 200',
      '',
    ].join('\n'),
  )
  // PgBouncer refuses to run as root: it then runs as the postgres system user.
  const asRoot = process.getuid?.() === 0
  if (asRoot) {
    chmodSync(dir, 0o755)
    chmodSync(join(dir, 'userlist.txt'), 0o644)
  }
  const bouncer: ChildProcess = spawn(PGBOUNCER, [...(asRoot ? ['-u', 'postgres'] : []), join(dir, 'pgbouncer.ini')], {
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  bouncer.stdout?.on('data', (chunk) => (output += chunk))
  bouncer.stderr?.on('data', (chunk) => (output += chunk))
  // SIGTERM: immediate shutdown (SIGINT would wait for every client to leave).
  t.teardown(() => void bouncer.kill('SIGTERM'))

  // Step 3: requests through the pooler as the runtime login role; the owner (migrations, start)
  // and the worker straight to PostgreSQL.
  const pooled = new URL(direct)
  pooled.hostname = '127.0.0.1'
  pooled.port = String(port)
  pooled.username = runtimeRole
  pooled.password = runtimePassword
  await waitUntilAnswers(pooled.toString(), () => output)

  const service = await startTestServer(t, { databaseUrl: direct, env: { RUNTIME_DATABASE_URL: pooled.toString() } })
  const a = await createTenant(direct, { slug: 'bounce-a', members: { 'admin@a.test': 'admin' } })
  const b = await createTenant(direct, { slug: 'bounce-b', members: { 'admin@b.test': 'admin' } })
  const tokenA = a.members['admin@a.test'].token
  const tokenB = b.members['admin@b.test'].token

  const created = await service.request('POST', '/api/contacts', { token: tokenA, body: { first_name: 'Ada', email: 'ada@a.test' } })
  t.equal(created.status, 201, 'a contact is created through the pooler')
  const id: string = created.body.data.id
  for (let i = 0; i < 5; i++) {
    const read = await service.request('GET', `/api/contacts/${id}`, { token: tokenA })
    t.equal(read.status, 200, `read ${i + 1} of the own contact`)
  }
  const list = await service.request('GET', '/api/contacts', { token: tokenA })
  t.equal(list.status, 200)
  t.same(
    list.body.data.map((contact: { id: string }) => contact.id),
    [id],
    'the list shows it',
  )
  for (let i = 0; i < 5; i++) {
    const foreign = await service.request('GET', `/api/contacts/${id}`, { token: tokenB })
    t.equal(foreign.status, 404, `another workspace reads nothing (${i + 1})`)
  }
  const foreignList = await service.request('GET', '/api/contacts', { token: tokenB })
  t.same(foreignList.body.data, [], 'nor lists it')
  t.match(output, new RegExp(`login attempt: db=${database} user=${runtimeRole}`), 'the requests came through the pooler')
  t.notOk(
    service.logLines.some((line) => line.includes('single-statement reads refused')),
    'reads ran as the confined runtime role',
  )
  for (const line of service.logLines.filter((line) => line.includes('named statements'))) t.comment(line)
}

async function waitUntilAnswers(url: string, output: () => string): Promise<void> {
  for (let attempt = 0; attempt < 100; attempt++) {
    const client = new pg.Client({ connectionString: url })
    client.on('error', () => {})
    try {
      await client.connect()
      await client.query('select 1')
      return
    } catch {
      await new Promise((resolve) => setTimeout(resolve, 100))
    } finally {
      await client.end().catch(() => {})
    }
  }
  throw new Error(`pgbouncer did not answer: ${output()}`)
}
