// Sentences a person understands for a body that fails its schema (docs/api.md section 2): one per
// field, said from the field's schema rather than from the validator's keyword, so no message
// names anyOf, a pattern's regular expression or "must match a schema".
import type { TSchema } from 'typebox'
import { PATTERN_NAMES } from '../records/fields.ts'

type Schema = {
  anyOf?: Schema[]
  type?: string
  const?: unknown
  enum?: unknown[]
  format?: string
  pattern?: string
  description?: string
  maxLength?: number
  minLength?: number
  minimum?: number
  maximum?: number
  properties?: Record<string, Schema>
  additionalProperties?: Schema | boolean
  patternProperties?: Record<string, Schema>
  items?: Schema
}

const FORMATS: Record<string, string> = {
  email: 'an email address',
  date: 'a date such as 2026-12-31',
  'date-time': 'a date and time such as 2026-11-22T03:00:21Z',
  uri: 'a URL such as https://example.com',
  uuid: 'an id (a UUID)',
}

/** The sub-schema at a JSON pointer of the value, through nullable unions, records and lists. */
export function schemaAt(schema: TSchema, pointer: string): Schema | undefined {
  let current: Schema | undefined = schema as Schema
  for (const raw of pointer.split('/').slice(1)) {
    const name = raw.replaceAll('~1', '/').replaceAll('~0', '~')
    current = current && withoutNull(current)
    if (!current) return undefined
    if (current.properties?.[name]) current = current.properties[name]
    else if (current.items && /^\d+$/.test(name)) current = current.items
    else if (current.patternProperties) current = Object.values(current.patternProperties)[0]
    else if (typeof current.additionalProperties === 'object') current = current.additionalProperties
    else return undefined
  }
  return current
}

function withoutNull(schema: Schema): Schema {
  const choices = schema.anyOf?.filter((choice) => choice.type !== 'null')
  return choices?.length === 1 ? withoutNull(choices[0]) : schema
}

const quoted = (values: unknown[]) => values.map((value) => String(value)).join(', ')

/** What a value of the schema must be, as the end of "FIELD must be ...". */
export function describeSchema(schema: Schema): string {
  if (schema.anyOf) {
    const choices = schema.anyOf.filter((choice) => choice.type !== 'null')
    const orNull = choices.length < schema.anyOf.length ? ' or null' : ''
    if (choices.every((choice) => 'const' in choice)) return `one of ${quoted(choices.map((choice) => choice.const))}${orNull}`
    // A decimal accepted as a string or a number is said once, as the decimal it is.
    if (choices.some((choice) => choice.type === 'number') && choices.some((choice) => choice.type === 'string' && choice.pattern)) {
      return `a decimal number such as 1200.50${orNull}`
    }
    return `${choices.map(describeSchema).join(' or ')}${orNull}`
  }
  if ('const' in schema) return `exactly ${String(schema.const)}`
  if (schema.enum) return `one of ${quoted(schema.enum)}`
  switch (schema.type) {
    case 'string': {
      if (schema.format && FORMATS[schema.format]) return FORMATS[schema.format]
      if (schema.pattern && PATTERN_NAMES[schema.pattern]) return PATTERN_NAMES[schema.pattern]
      const length = schema.maxLength === undefined ? '' : ` of at most ${schema.maxLength} characters`
      const text = (schema.minLength ?? 0) > 0 ? `non-empty text${length}` : `text${length}`
      return schema.pattern ? `${text} in the expected form` : text
    }
    case 'integer':
      return `a whole number${bounds(schema)}`
    case 'number':
      return `a number${bounds(schema)}`
    case 'boolean':
      return 'true or false'
    case 'array':
      return 'a list'
    case 'object':
      return 'an object'
    case 'null':
      return 'null'
    default:
      return 'a valid value'
  }
}

function bounds(schema: Schema): string {
  if (schema.minimum !== undefined && schema.maximum !== undefined) return ` from ${schema.minimum} to ${schema.maximum}`
  if (schema.minimum !== undefined) return ` of at least ${schema.minimum}`
  if (schema.maximum !== undefined) return ` of at most ${schema.maximum}`
  return ''
}

/** "must be ..." for the value at the pointer, or a plain sentence when the schema there is unknown. */
export function fieldMessage(schema: TSchema, pointer: string): string {
  const at = schemaAt(schema, pointer)
  return at ? `must be ${describeSchema(at)}` : 'is not a valid value'
}
