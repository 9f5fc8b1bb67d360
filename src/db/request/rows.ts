// The one contract for reading rows, whichever connection answered them: slonik's pool (through its
// row interceptor, src/db/pool.ts), the single-statement connection (statement-connection.ts) and
// the import job's pg client (src/imports/batch-statements.ts). A typed query
// (`sql.type(rowType(Schema))`, src/db/typed-rows.ts) carries its row schema, a compiled typebox
// check, and every row it returns is checked against it: a row of another shape is a bug (500), not
// something to pass on. `one` answers exactly one row, `maybeOne` at most one, with slonik's errors,
// so src/http/problem.ts answers them alike on every path.
import type { StandardSchemaV1 } from '@standard-schema/spec'
import { DataIntegrityError, NotFoundError, SchemaValidationError } from 'slonik'
import type { Static, TSchema } from 'typebox'
import { Compile } from 'typebox/compile'

export type Row = Record<string, unknown>

// Slonik 49 takes any Standard Schema (v1) as a query's row parser and types the query's result
// from its output; typebox 1.x schemas do not implement that interface, so rowType wraps one: the
// schema states what the SQL returns, in one place, instead of an `as` cast at each read.
export type RowType<T extends TSchema> = StandardSchemaV1<unknown, Static<T>>

/** A slonik row parser from a typebox schema: `db.any(sql.type(rowType(Schema))\`...\`)`. */
export function rowType<T extends TSchema>(schema: T): RowType<T> {
  let validator: ReturnType<typeof Compile<T>> | undefined
  return {
    '~standard': {
      version: 1,
      vendor: 'typebox',
      validate: (value) => {
        validator ??= Compile(schema)
        if (validator.Check(value)) return { value }
        return {
          issues: validator.Errors(value).map((error) => ({ message: error.message, path: error.instancePath.split('/').slice(1) })),
        }
      },
    },
  }
}

/** A query as every connection takes it; a typed one carries its row schema as `parser`. */
export type RowQuery = { sql: string; values: readonly unknown[]; parser?: StandardSchemaV1 }

/** The row of a typed query as its schema gives it back, or a SchemaValidationError; an untyped query's row as it is. */
export function checkedRow(query: RowQuery, row: Row): Row {
  return query.parser ? checkRow(query.parser, query, row) : row
}

/** checkedRow with the schema given apart (slonik's interceptor has it beside the query). */
export function checkRow(parser: StandardSchemaV1, query: Omit<RowQuery, 'parser'>, row: Row): Row {
  const result = parser['~standard'].validate(row)
  if (result instanceof Promise) throw new TypeError('row schemas must validate synchronously')
  if (result.issues) throw new SchemaValidationError(query as never, row as never, result.issues)
  return result.value as Row
}

/** Every row of a query, checked (see checkedRow). */
export function checkedRows(query: RowQuery, rows: readonly Row[]): Row[] {
  return query.parser ? rows.map((row) => checkedRow(query, row)) : (rows as Row[])
}

/** The one row of a query that must answer exactly one (a lookup by key, an aggregate). */
export function one<R>(query: RowQuery, rows: readonly R[]): R {
  if (rows.length === 0) throw new NotFoundError('Resource not found.', query as never)
  if (rows.length > 1) throw new DataIntegrityError('Query returns more than one row.', query as never)
  return rows[0]
}

/** The row of a query that answers at most one, or null. */
export function maybeOne<R>(query: RowQuery, rows: readonly R[]): R | null {
  if (rows.length > 1) throw new DataIntegrityError('Query returns more than one row.', query as never)
  return rows[0] ?? null
}

/** A row's first column (the `...First` methods). */
export function firstColumn(row: Row): unknown {
  for (const name in row) return row[name]
  return undefined
}
