// Row types for slonik's sql.type(schema). Slonik 49 takes any Standard Schema (v1) as a query's
// row parser and types the query's result from its output; typebox 1.x schemas do not implement
// that interface, so rowType wraps one. The slonik pool's row-schema interceptor (src/db/pool.ts)
// checks every row of a typed query against it: the schema states what the SQL returns, in one
// place, instead of an `as` cast at each read, and a row of another shape is a bug (500).
import type { StandardSchemaV1 } from '@standard-schema/spec'
import Type, { type Static, type TSchema } from 'typebox'
import { Compile } from 'typebox/compile'

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

/** A text column that may be null. */
export const NullableString = Type.Union([Type.String(), Type.Null()])

/** A bytea column: pg gives a Buffer. */
export const Bytes = Type.Unsafe<Buffer>(
  Type.Refine(
    Type.Unknown(),
    (value) => Buffer.isBuffer(value),
    () => 'must be bytes',
  ),
)

/** `returning id` and `select t.id`: one uuid (pg reads it as text). */
export const IdRow = rowType(Type.Object({ id: Type.String() }))

/** `select exists (...)`. */
export const ExistsRow = rowType(Type.Object({ exists: Type.Boolean() }))

/** `select crm.grant_scope(resource, action) is not null as granted`: the caller's role holds the grant. */
export const GrantedRow = rowType(Type.Object({ granted: Type.Boolean() }))
