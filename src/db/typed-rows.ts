// Row types the areas share, for slonik's sql.type(schema): rowType (src/db/request/rows.ts) makes
// one from a typebox schema, and every connection checks each row of a typed query against it.
import Type from 'typebox'
import { rowType } from './request/rows.ts'

export { type RowType, rowType } from './request/rows.ts'

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
