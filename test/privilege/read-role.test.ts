// Single-statement reads cannot switch their role, so each one proves that its connection is
// confined by row-level security: run as the owner (a pooler that dropped the role, a wrong
// RUNTIME_DATABASE_URL) it refuses, and the API answers through a request transaction instead,
// never with another workspace's record.
import type { IncomingMessage } from 'node:http'
import pg from 'pg'
import { sql } from 'slonik'
import t from 'tap'
import { createStatementAuthenticator } from '../../src/auth/authenticate.ts'
import { pgQueryText } from '../../src/db/pool.ts'
import { ensureRuntimeRole, loginRoleName, RUNTIME_ROLE } from '../../src/db/runtime-role.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t, { countQueries: true })
const url = server.databaseUrl
const a = await createTenant(url, { slug: 'read-a', members: { 'admin@a.test': 'admin' } })
const b = await createTenant(url, { slug: 'read-b', members: { 'admin@b.test': 'admin' } })
const tokenA = a.members['admin@a.test'].token
const tokenB = b.members['admin@b.test'].token

const created = await server.request('POST', '/api/contacts', { token: tokenA, body: { first_name: 'Ada', email: 'ada@a.test' } })
t.equal(created.status, 201)
const contactId: string = created.body.data.id

/**
 * Workspace B's token asks for workspace A's contact in one read statement, sent on `client`: the
 * rows it answered, or the error it was refused with. In both shapes of the statement: for many
 * rows, and for one row at most (a record by id).
 */
function readAsB(client: pg.Client, singleRow: boolean): Promise<unknown> {
  const request = { headers: { authorization: `Bearer ${tokenB}`, 'x-tenant-slug': 'read-b' } } as unknown as IncomingMessage
  return createStatementAuthenticator(server.config)(request)
    .send(
      sql.unsafe`select id from crm.contacts where id = ${contactId}`,
      async (wrapped) => {
        return (await client.query(pgQueryText(wrapped.sql), [...wrapped.values])).rows
      },
      { singleRow },
    )
    .then(
      (answer) => answer.rows,
      (error: unknown) => error,
    )
}

t.test('the runtime role reads in one statement, its own workspace only', async (t) => {
  server.queries.length = 0
  t.equal((await server.request('GET', `/api/contacts/${contactId}`, { token: tokenA })).status, 200)
  t.equal((await server.request('GET', `/api/contacts/${contactId}`, { token: tokenB })).status, 404)
  t.equal(server.queries.filter((text) => text.includes('crm.require_confined_role()')).length, 2, 'both reads were single statements')
  t.notOk(
    server.logLines.some((line) => line.includes('single-statement reads refused')),
    'no read was refused',
  )
})

t.test('the runtime role carries its limits without startup parameters', async (t) => {
  const runtime = new pg.Client({ connectionString: await ensureRuntimeRole(url, server.config.appSecret) })
  await runtime.connect()
  t.teardown(() => runtime.end())
  const { rows } = await runtime.query(
    `select current_user as role, current_setting('statement_timeout') as statement_timeout,
       current_setting('idle_in_transaction_session_timeout') as idle_timeout, crm.require_confined_role() as confined`,
  )
  t.same(rows[0], {
    role: loginRoleName(RUNTIME_ROLE, new URL(url).pathname.slice(1)),
    statement_timeout: '30s',
    idle_timeout: '1min',
    confined: true,
  })
})

t.test('as the owner, the read statement refuses to run', async (t) => {
  const owner = new pg.Client({ connectionString: url })
  await owner.connect()
  t.teardown(() => owner.end())
  for (const singleRow of [false, true]) {
    t.match(await readAsB(owner, singleRow), { code: '42501', hint: 'role_not_confined' }, `refused, no rows (single row: ${singleRow})`)
  }
})

t.test('a server whose read connections are the owner answers 404 across workspaces', async (t) => {
  // RUNTIME_DATABASE_URL naming the owner stands for a pooler that dropped the role the
  // connection was meant to have: the read pool's connections are the (superuser) owner.
  const misconfigured = await startTestServer(t, { databaseUrl: url, env: { RUNTIME_DATABASE_URL: url } })
  const foreign = await misconfigured.request('GET', `/api/contacts/${contactId}`, { token: tokenB })
  t.equal(foreign.status, 404, 'another workspace reads nothing')
  t.equal(foreign.body.code, 'not_found')
  const own = await misconfigured.request('GET', `/api/contacts/${contactId}`, { token: tokenA })
  t.equal(own.status, 200, 'the owner of the record still reads it')
  t.equal(own.body.data.id, contactId)
  const list = await misconfigured.request('GET', '/api/contacts', { token: tokenB })
  t.equal(list.status, 200)
  t.same(list.body.data, [], 'the list of another workspace is empty')
  t.ok(
    misconfigured.logLines.some((line) => line.includes('single-statement reads refused')),
    'the refusal is logged',
  )
})

t.test('a login role granted crm_owner besides crm_api is refused, not handed every workspace', async (t) => {
  // A DBA's slip: the read role also made a member of crm_owner. The `_all_owner` policies apply to
  // any member of crm_owner, so such a role would read every workspace's rows; the check refuses it.
  const name = `careless_${Math.random().toString(36).slice(2, 10)}`
  const password = `pw-${Math.random().toString(36).slice(2)}`
  const owner = new pg.Client({ connectionString: url })
  await owner.connect()
  t.teardown(() => owner.end())
  await owner.query(`create role ${name} login password '${password}' in role crm_api, crm_owner`)
  // A role of the DBA's own connects only once granted (PUBLIC has no CONNECT, sql/definitions/10_foundation.sql).
  const database = new URL(url).pathname.slice(1)
  await owner.query(`grant connect on database ${database} to ${name}`)
  t.teardown(async () => {
    await careless.end()
    await owner.query(`drop owned by ${name}`)
    await owner.query(`drop role ${name}`)
  })
  const address = new URL(url)
  address.username = name
  address.password = password
  const careless = new pg.Client({ connectionString: address.toString() })
  await careless.connect()
  for (const singleRow of [false, true]) {
    t.match(
      await readAsB(careless, singleRow),
      { code: '42501', hint: 'role_not_confined' },
      `refused: workspace A's contact is not read with B's token (single row: ${singleRow})`,
    )
  }
  const { rows } = await careless.query('select count(*)::int as n from crm.contacts')
  t.ok(rows[0].n > 0, 'the role does reach every row outside the checked statement: the refusal is what protects')
})

t.test('read in one statement or in a transaction, a record is the same text and a list pages alike', async (t) => {
  // The statement pool answers json as its text, so one statement selects the record's JSON
  // without a cast; a transaction casts it (slonik would parse json). A server whose one-statement
  // reads are refused answers through transactions: both must send the same bytes and ETags.
  const second = await server.request('POST', '/api/contacts', { token: tokenA, body: { first_name: 'Grace', email: 'grace@a.test' } })
  t.equal(second.status, 201)
  const inTransactions = await startTestServer(t, { databaseUrl: url, env: { RUNTIME_DATABASE_URL: url } })
  await inTransactions.request('GET', '/api/contacts', { token: tokenA }) // refused once, then transactions
  t.ok(inTransactions.logLines.some((line) => line.includes('single-statement reads refused')))

  const oneStatement = await server.request('GET', `/api/contacts/${contactId}`, { token: tokenA })
  const transaction = await inTransactions.request('GET', `/api/contacts/${contactId}`, { token: tokenA })
  t.equal(oneStatement.status, 200)
  t.equal(transaction.text, oneStatement.text, 'the same body')
  t.equal(transaction.headers.get('etag'), oneStatement.headers.get('etag'), 'the same ETag')

  for (const side of [server, inTransactions]) {
    const first = await side.request('GET', '/api/contacts?limit=1&sort=first_name', { token: tokenA })
    t.equal(first.status, 200)
    t.same(
      first.body.data.map((contact: { first_name: string }) => contact.first_name),
      ['Ada'],
    )
    t.type(first.body.next_cursor, 'string', 'a next cursor')
    const next = await side.request('GET', `/api/contacts?limit=1&sort=first_name&cursor=${first.body.next_cursor}`, { token: tokenA })
    t.same(
      next.body.data.map((contact: { first_name: string }) => contact.first_name),
      ['Grace'],
    )
    t.equal(next.body.next_cursor, null)
  }
})
