// A named read statement that its connection no longer knows (a pooler in transaction mode hands
// each statement to any server connection) is sent again unnamed, and so is every later read.
import fc from 'fast-check'
import pg from 'pg'
import t from 'tap'
import { createStatementPool } from '../../src/db/request/statement-pool.ts'
import { createTestDatabase } from '../helpers/database.ts'

t.test('a lost named statement is sent again unnamed', async (t) => {
  const url = await createTestDatabase(t)
  const warnings: string[] = []
  // One connection, so the statement prepared first is the one DEALLOCATE ALL takes away.
  const pool = createStatementPool(url, { maxPoolSize: 1, onWarning: (message) => warnings.push(message) })
  t.teardown(() => pool.end())

  const read = { sql: 'select $1::int + 1 as n', values: [1], name: 'read_statement_pool_test' }
  t.same(await pool.rows(read), [{ n: 2 }], 'named and prepared')
  await pool.rows({ sql: 'deallocate all', values: [] })
  t.same(await pool.rows(read), [{ n: 2 }], 'the lost name is sent again unnamed')
  t.equal(warnings.length, 1, 'and said once')
  t.match(warnings[0], /prepared statement "read_statement_pool_test" does not exist/)
  t.same(await pool.rows(read), [{ n: 2 }], 'later reads go unnamed')
  t.equal(warnings.length, 1)
})

// pg's own Pool.query closes a connection after any error; this pool keeps one that PostgreSQL
// answered with an error of the statement, since each statement runs in its own implicit
// transaction and leaves nothing behind: a request the database refuses must not cost the next one a
// new backend. Any sequence of reads, named or not, answered or refused (at parse, at bind, while
// running), runs on the one connection it started on, and every statement gets its own answer.
t.test('an error of the statement keeps the connection, whatever came before', async (t) => {
  const url = await createTestDatabase(t)
  const warnings: string[] = []
  const pool = createStatementPool(url, { maxPoolSize: 1, onWarning: (message) => warnings.push(message) })
  t.teardown(() => pool.end())
  const backend = async () => (await pool.rows({ sql: 'select pg_backend_pid() as pid', values: [] }))[0].pid
  const first = await backend()

  type Step = { sql: string; values: unknown[]; named: boolean; answer: { rows: unknown[] } | { code: string } }
  const steps: fc.Arbitrary<Step>[] = [
    fc
      .integer({ min: -1000, max: 1000 })
      .map((n) => ({ sql: 'select $1::int + 1 as n', values: [n], named: true, answer: { rows: [{ n: n + 1 }] } })),
    fc
      .integer({ min: 1, max: 9 })
      .map((n) => ({ sql: 'select 10 / $1::int as n', values: [n], named: true, answer: { rows: [{ n: Math.trunc(10 / n) }] } })),
    fc.constant({ sql: 'select 10 / $1::int as n', values: [0], named: true, answer: { code: '22012' } }),
    fc.constant({ sql: 'select $1::int as n', values: ['not a number'], named: false, answer: { code: '22P02' } }),
    fc.constant({ sql: 'select from from nowhere', values: [], named: true, answer: { code: '42601' } }),
    fc.constant({ sql: 'select * from no_such_table', values: [], named: false, answer: { code: '42P01' } }),
  ]
  // One name per text: pg refuses a name given to two texts (and closes the connection, rightly).
  const NAMES = ['select $1::int + 1 as n', 'select 10 / $1::int as n', 'select from from nowhere']
  await fc.assert(
    fc.asyncProperty(fc.array(fc.oneof(...steps), { minLength: 1, maxLength: 12 }), async (sequence) => {
      for (const step of sequence) {
        const query = { sql: step.sql, values: step.values, ...(step.named ? { name: `pool_keep_${NAMES.indexOf(step.sql)}` } : {}) }
        const outcome = await pool.rows(query).then(
          (rows) => ({ rows }),
          (error: { code?: string }) => ({ code: error.code ?? 'none' }),
        )
        if (JSON.stringify(outcome) !== JSON.stringify(step.answer)) return false
      }
      return (await backend()) === first
    }),
    { numRuns: 40 },
  )
  t.equal(await backend(), first, 'one backend for every statement')
  t.same(warnings, [], 'and named statements stayed named')
})

t.test('a connection that broke is replaced', async (t) => {
  const url = await createTestDatabase(t)
  const pool = createStatementPool(url, { maxPoolSize: 1 })
  t.teardown(() => pool.end())
  const other = new pg.Client({ connectionString: url })
  await other.connect()
  t.teardown(() => other.end())
  const backend = async () => (await pool.rows({ sql: 'select pg_backend_pid() as pid', values: [] }))[0].pid
  const first = await backend()
  await other.query('select pg_terminate_backend($1)', [first])
  // The terminated backend's last word reaches the pool as an error, now or at the next statement.
  let replaced: unknown = null
  for (let attempt = 0; attempt < 3 && replaced === null; attempt++) replaced = await backend().catch(() => null)
  t.not(replaced, null, 'a statement runs again')
  t.not(replaced, first, 'on a new connection')
})
