// A named read statement that its connection no longer knows (a pooler in transaction mode hands
// each statement to any server connection) is sent again unnamed, and so is every later read.
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
