// One contract for reading rows, whichever connection answered them (src/db/request/rows.ts): the
// single-statement connection of GET one and the other single-statement routes, and the import
// job's pg client, answer the same rows alike. A typed query's row of another shape than its
// schema is refused (SchemaValidationError, a 500), `one` wants exactly one row (NotFoundError
// for none), `maybeOne` at most one (DataIntegrityError for more), on every path.
import fc from 'fast-check'
import { DataIntegrityError, NotFoundError, SchemaValidationError } from 'slonik'
import t from 'tap'
import Type from 'typebox'
import { sql } from '../../src/db/pool.ts'
import { SingleStatementConnection, type StatementAuthentication } from '../../src/db/request/statement-connection.ts'
import type { StatementPool } from '../../src/db/request/statement-pool.ts'
import { rowType } from '../../src/db/typed-rows.ts'
import { readMaybeOne, readOne } from '../../src/imports/batch-statements.ts'

const RecordRow = rowType(Type.Object({ record: Type.String() }))
const query = sql.type(RecordRow)`select crm.contact_json(t) as record from crm.contacts t where t.id = ${'x'}::uuid`

/** A statement connection whose one statement answers `rows` (authentication answers a caller). */
function statementAnswering(rows: Record<string, unknown>[]): SingleStatementConnection<{ userId: string }> {
  const authentication: StatementAuthentication<{ userId: string }> = {
    send: async (_query, run) => {
      await run({ sql: 'select', values: [] })
      return { caller: { userId: 'u' }, rows, visible: null }
    },
    callerCountedBeforeFailure: () => null,
  }
  const pool: StatementPool = { rows: async () => [], end: async () => {} }
  return new SingleStatementConnection(pool, authentication, () => {})
}

/** The import job's client answering `rows`. */
const jobClient = (rows: Record<string, unknown>[]) => ({ query: async () => ({ rows, rowCount: rows.length }) })

/** What a read answered: its row, or the class of its error. */
async function outcome(read: () => Promise<unknown>): Promise<unknown> {
  try {
    return { row: await read() }
  } catch (error) {
    for (const type of [SchemaValidationError, NotFoundError, DataIntegrityError]) if (error instanceof type) return type.name
    throw error
  }
}

t.test("a single-statement read's row of another shape than its schema is refused", async (t) => {
  t.equal(await outcome(() => statementAnswering([{ record: 5 }]).maybeOneFirst(query)), 'SchemaValidationError')
  t.equal(await outcome(() => statementAnswering([{ other: 'x' }]).one(query)), 'SchemaValidationError')
  t.equal(await statementAnswering([{ record: '{}' }]).maybeOneFirst(query), '{}')
})

t.test('the statement connection and the import job keep the same one and maybeOne contract', async (t) => {
  const row = fc.oneof(
    fc.record({ record: fc.string() }),
    fc.record({ record: fc.oneof(fc.integer(), fc.constant(null), fc.boolean()) }),
    fc.record({ other: fc.string() }),
  )
  await fc.assert(
    fc.asyncProperty(fc.array(row, { maxLength: 3 }), async (rows) => {
      const expectedOne = rows.length === 0 ? 'NotFoundError' : rows.length > 1 ? 'DataIntegrityError' : null
      const expectedMaybe = rows.length > 1 ? 'DataIntegrityError' : null
      const valid = rows.every((candidate) => 'record' in candidate && typeof candidate.record === 'string')
      const viaStatement = {
        one: await outcome(() => statementAnswering(rows).one(query)),
        maybeOne: await outcome(() => statementAnswering(rows).maybeOne(query)),
      }
      const viaJob = {
        one: await outcome(() => readOne(jobClient(rows), query)),
        maybeOne: await outcome(() => readMaybeOne(jobClient(rows), query)),
      }
      t.same(viaStatement, viaJob, JSON.stringify(rows))
      // Rows are checked before they are counted: a bad row is refused whatever their number.
      if (!valid) t.equal(viaStatement.one, 'SchemaValidationError')
      else {
        t.same(viaStatement.one, expectedOne ?? { row: rows[0] })
        t.same(viaStatement.maybeOne, expectedMaybe ?? { row: rows[0] ?? null })
      }
    }),
    { numRuns: 200 },
  )
})
