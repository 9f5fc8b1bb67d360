// The one table from SQLSTATE to API problem, checked against errors PostgreSQL really raises.

import pg from 'pg'
import t from 'tap'
import { classifyDatabaseError, composeConstraintFields } from '../../src/db/database-errors.ts'
import { ApiError, toApiError as answerOf, CONSTRAINT_FIELDS } from '../../src/http/problem.ts'
import { MEMBER_CONSTRAINT_FIELDS } from '../../src/members/constraints.ts'
import { RECORD_CONSTRAINT_FIELDS } from '../../src/records/constraints.ts'
import { createTestDatabase } from '../helpers/database.ts'

const url = await createTestDatabase(t)
const client = new pg.Client({ connectionString: url })
await client.connect()
t.teardown(() => client.end())
await client.query(`create table crm.error_probe (id int primary key, email text constraint error_probe_email_key unique,
  n int constraint error_probe_n_positive check (n > 0), ref int references crm.error_probe (id))`)
await client.query(`insert into crm.error_probe (id, email, n) values (1, 'a@b.c', 1)`)
const PROBE_FIELDS = composeConstraintFields({ error_probe_email_key: '/email', error_probe_n_positive: '/n' })

/** The answer to a database error, with the probe table's constraints as the field map. */
function toApiError(error: unknown): ApiError {
  return answerOf(classifyDatabaseError(error, PROBE_FIELDS) ?? error)
}

async function errorOf(statement: string): Promise<unknown> {
  return client.query(statement).then(
    () => null,
    (error) => error,
  )
}

const cases: [string, string, number, string][] = [
  ['unique violation', `insert into crm.error_probe (id, email) values (2, 'a@b.c')`, 409, 'duplicate'],
  ['check violation', `insert into crm.error_probe (id, n) values (3, -1)`, 422, 'validation_failed'],
  ['not null', `insert into crm.error_probe (id) values (null)`, 422, 'validation_failed'],
  ['foreign key', `insert into crm.error_probe (id, ref) values (4, 999)`, 422, 'validation_failed'],
  ['bad uuid text', `select 'nope'::uuid`, 422, 'validation_failed'],
  ['insufficient privilege', `select 1 from crm.internal_secrets`, 403, 'forbidden'],
  [
    'our own CR code',
    `do $$ begin raise exception 'no seat left' using errcode = 'CR422', hint = 'seat_limit_reached'; end $$`,
    422,
    'seat_limit_reached',
  ],
  ['statement timeout', `set statement_timeout = 1; select pg_sleep(1)`, 503, 'unavailable'],
  ['a bug', `select * from no_such_table`, 500, 'internal_error'],
]

for (const [name, statement, status, code] of cases) {
  t.test(name, async (t) => {
    if (name === 'insufficient privilege') await client.query('set role crm_api')
    const error = await errorOf(statement)
    if (name === 'insufficient privilege') await client.query('reset role')
    if (name === 'statement timeout') await client.query('reset statement_timeout')
    const apiError = toApiError(error)
    t.type(apiError, ApiError)
    t.equal(apiError.status, status)
    t.equal(apiError.code, code)
  })
}

t.test('field pointers come from constraint names', async (t) => {
  const duplicate = toApiError(await errorOf(`insert into crm.error_probe (id, email) values (5, 'a@b.c')`))
  t.same(duplicate.errors, [{ pointer: '/email', code: 'duplicate', message: 'is already taken' }])
  const check = toApiError(await errorOf(`insert into crm.error_probe (id, n) values (6, 0)`))
  t.same(check.errors, [{ pointer: '/n', code: 'invalid', message: 'is invalid' }])
})

t.test('connection failures are 503', async (t) => {
  const refused = new pg.Client({ connectionString: 'postgres://x@127.0.0.1:1/none', connectionTimeoutMillis: 500 })
  const error = await refused.connect().then(
    () => null,
    (caught) => caught,
  )
  t.equal(toApiError(error).status, 503)
})

t.test("the constraint map is every area's list, and cannot be changed", async (t) => {
  t.equal(CONSTRAINT_FIELDS.size, Object.keys(RECORD_CONSTRAINT_FIELDS).length + Object.keys(MEMBER_CONSTRAINT_FIELDS).length)
  t.equal(CONSTRAINT_FIELDS.get('contacts_email_unique'), '/email')
  t.equal(CONSTRAINT_FIELDS.get('teams_name_key'), '/name')
  t.throws(() => ((RECORD_CONSTRAINT_FIELDS as Record<string, string>).contacts_email_unique = '/other'))
  t.throws(() => composeConstraintFields({ a_key: '/a' }, { a_key: '/b' }), /a_key/)
})
