// How the import job runs its statements: built with slonik's sql tag, run on the plain pg client
// the job holds a batch's transaction on (graphile-worker's, or a test's). A statement whose rows
// are not read is a fragment; a read is sql.type(rowType(...)) (src/db/typed-rows.ts), and every row it returns is
// checked against that schema by the one row contract every connection keeps (src/db/request/rows.ts).
import type { FragmentSqlToken, QuerySqlToken } from 'slonik'
import { pgQueryText, sql } from '../db/pool.ts'
import { checkedRows, maybeOne, one, type Row } from '../db/request/rows.ts'

/** What the job needs from a pg client: the worker hands in a graphile-worker/pg client. */
export type Queryable = { query: (text: string, values?: unknown[]) => Promise<{ rows: unknown[]; rowCount: number | null }> }

type RowOf<Query extends QuerySqlToken> = NonNullable<Query['parser']['~standard']['types']>['output']

/** Runs a statement whose rows are not read; answers how many rows it wrote. */
export async function execute(db: Queryable, statement: FragmentSqlToken): Promise<number> {
  return (await db.query(pgQueryText(statement.sql), [...statement.values])).rowCount ?? 0
}

/** The rows of a typed query, each checked against its schema. */
export async function readRows<Query extends QuerySqlToken>(db: Queryable, query: Query): Promise<RowOf<Query>[]> {
  const { rows } = await db.query(pgQueryText(query.sql), [...query.values])
  return checkedRows(query, rows as Row[]) as RowOf<Query>[]
}

/** The row of a typed query that answers at most one, or null. */
export async function readMaybeOne<Query extends QuerySqlToken>(db: Queryable, query: Query): Promise<RowOf<Query> | null> {
  return maybeOne(query, await readRows(db, query))
}

/** The one row of a typed query (an aggregate, a function call). */
export async function readOne<Query extends QuerySqlToken>(db: Queryable, query: Query): Promise<RowOf<Query>> {
  return one(query, await readRows(db, query))
}

// Pieces the batch's statements share. Identifiers come from the record type's field whitelist.
export const ident = (name: string) => sql.identifier([name])
export const commaList = (members: FragmentSqlToken[]) => sql.join(members, sql.fragment`, `)
export const workspace = sql.fragment`(select crm.current_workspace_id())`
/** The typed row t has no problem so far. */
export const rowIsClean = sql.fragment`not exists (select from import_problems p where p.row = t.row)`
