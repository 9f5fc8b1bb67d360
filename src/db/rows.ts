// Column shapes that rows of several areas are read with, through sql.type(rowSchema(...)).
import Type from 'typebox'
import { rowSchema } from './pool.ts'

export const NullableString = Type.Union([Type.String(), Type.Null()])

/** bytea, as pg hands it over. */
export const Bytes = Type.Unsafe<Buffer>(Type.Refine(Type.Unknown(), (value) => Buffer.isBuffer(value)))

/** A row holding just an id (`returning id`). */
export const IdRow = rowSchema(Type.Object({ id: Type.String() }))
