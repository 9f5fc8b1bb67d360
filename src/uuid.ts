// What a UUID looks like wherever the API accepts one (path ids, filters, cursors, bodies).
import Type from 'typebox'

export const UUID_PATTERN = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

/** The same, for JSON Schema (no flags there). */
export const UUID_SCHEMA_PATTERN = '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'

/** A UUID in a body or an answer (typebox). */
export const Uuid = Type.String({ format: 'uuid', maxLength: 36, pattern: UUID_SCHEMA_PATTERN })
