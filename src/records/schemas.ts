// Request and response schemas of the three record types (typebox), built from the field lists of
// fields.ts. The same objects validate bodies (the route definitions) and describe the API in
// /api/openapi.json. The database repeats every rule as a constraint (sql/migrations/000003_records.sql), so
// imports and psql obey them too.
import Type, { type TSchema } from 'typebox'
import { named } from '../schema-names.ts'
import { Uuid } from '../uuid.ts'
import { COMPANY, CONTACT, DEAL, type FieldSpec, type RecordType, requiredOnCreate } from './fields.ts'

export const nullable = (schema: TSchema) => Type.Union([schema, Type.Null()])

export const MONEY_PATTERN = '^\\d{1,16}(\\.\\d{1,2})?$'
/** The host's first character, then anything but white space: equal to [^\\s/?#]+[^\\s]* without its ambiguity. */
export const WEBSITE_PATTERN = '^[Hh][Tt][Tt][Pp][Ss]?://[^\\s/?#]\\S*$'

/** Money in requests: numeric(18, 2), so at most 16 digits before the point and 2 after. */
const Money = (description: string) =>
  Type.Union([Type.String({ maxLength: 19, pattern: MONEY_PATTERN }), Type.Number({ minimum: 0, maximum: 10_000_000_000_000_000 })], {
    description: `${description}: a decimal string with at most two places ("12500.00"); a JSON number is accepted too`,
  })
const DateOnly = Type.String({ format: 'date', maxLength: 10, pattern: '^\\d{4}-\\d{2}-\\d{2}$' })
export const Time = Type.String({ format: 'date-time', description: 'RFC 3339, UTC, milliseconds' })

export const CustomFields = Type.Record(
  Type.String({ pattern: '^[a-z][a-z0-9_]{0,62}$' }),
  Type.Union([Type.String({ maxLength: 10_000 }), Type.Number(), Type.Boolean(), Type.Null()]),
  {
    maxProperties: 50,
    additionalProperties: false,
    description: 'At most 50 keys matching ^[a-z][a-z0-9_]{0,62}$; values are strings, numbers, booleans or null',
  },
)

/** The field's own rules as JSON Schema keywords, in a fixed order and without the ones it does not set. */
function rulesOf(field: FieldSpec, keywords: readonly (keyof FieldSpec)[]): Record<string, unknown> {
  return Object.fromEntries(keywords.flatMap((keyword) => (field[keyword] === undefined ? [] : [[keyword, field[keyword]]])))
}

/** What a request body may hold for a writable field, null aside. */
function inputValue(field: FieldSpec): TSchema {
  switch (field.kind) {
    case 'text':
    case 'lowercase':
      return Type.String(rulesOf(field, ['minLength', 'maxLength', 'pattern', 'format', 'description']))
    case 'uuid':
      return Uuid
    case 'integer':
      return Type.Integer(rulesOf(field, ['minimum', 'maximum']))
    case 'numeric':
      return Money(field.description ?? field.name)
    case 'date':
      return DateOnly
    case 'json':
      return CustomFields
    case 'timestamp':
      throw new Error(`${field.name}: a timestamp field is kept by the database and cannot be writable`)
  }
}

/** What a response holds for a field (crm.<type>_json renders it), null aside. */
function outputValue(field: FieldSpec): TSchema {
  switch (field.kind) {
    case 'text':
    case 'lowercase':
      return Type.String()
    case 'uuid':
      return Uuid
    case 'integer':
      return Type.Integer()
    case 'numeric':
      return Type.String({ description: 'Decimal string with two places' })
    case 'date':
      return DateOnly
    case 'timestamp':
      return Time
    case 'json':
      return CustomFields
  }
}

const inputSchema = (field: FieldSpec) => (field.nullable ? nullable(inputValue(field)) : inputValue(field))
const outputSchema = (field: FieldSpec) => (field.nullable ? nullable(outputValue(field)) : outputValue(field))

/** Accepted and ignored in bodies (docs/api.md section 1: read-only fields are ignored). */
const readOnlyInput = () => Type.Optional(Type.Unknown({ readOnly: true, description: 'Read-only: ignored when sent' }))

/** The body of a create (required: the non-null writable fields the database does not fill) or of an update (all optional). */
function bodySchema(type: RecordType, mode: 'create' | 'update', description: string): TSchema {
  const writable = type.fields.filter((field) => field.writable)
  const required = (field: FieldSpec) => mode === 'create' && requiredOnCreate(field)
  return Type.Object(
    {
      ...Object.fromEntries(
        writable.map((field) => [field.name, required(field) ? inputSchema(field) : Type.Optional(inputSchema(field))]),
      ),
      ...Object.fromEntries(type.fields.filter((field) => !field.writable).map((field) => [field.name, readOnlyInput()])),
    },
    { additionalProperties: false, description },
  )
}

function recordSchema(type: RecordType): TSchema {
  return Type.Object(Object.fromEntries(type.fields.map((field) => [field.name, outputSchema(field)])))
}

export const CompanySchema = named('Company', recordSchema(COMPANY))
export const ContactSchema = named('Contact', recordSchema(CONTACT))
export const DealSchema = named('Deal', recordSchema(DEAL))

export type RecordSchemas = {
  create: TSchema
  update: TSchema
  record: TSchema
  example: Record<string, unknown>
  exampleRecord: Record<string, unknown>
}

const UPDATE_DESCRIPTION = 'The fields to change; the others stay as they are'
const EXAMPLE_TIMES = { created_at: '2026-11-22T03:00:21.123Z', updated_at: '2026-11-22T03:00:21.123Z' }
const EXAMPLE_USER = '01935f3c-8a41-7cc2-9b1e-5d2f0c6a7e11'
const EXAMPLE_AUDIT = {
  owner_id: EXAMPLE_USER,
  custom_fields: { tier: 'gold' },
  ...EXAMPLE_TIMES,
  created_by: EXAMPLE_USER,
  updated_by: EXAMPLE_USER,
}

export const SCHEMAS: Record<RecordType['name'], RecordSchemas> = {
  company: {
    create: named('CompanyCreate', bodySchema(COMPANY, 'create', 'A new company: name is required')),
    update: named('CompanyUpdate', bodySchema(COMPANY, 'update', UPDATE_DESCRIPTION)),
    record: CompanySchema,
    example: { name: 'Globex', domain: 'globex.com', employee_count: 120, annual_revenue: '2500000.00', custom_fields: { tier: 'gold' } },
    exampleRecord: {
      id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a',
      name: 'Globex',
      domain: 'globex.com',
      website: 'https://globex.com',
      industry: 'Manufacturing',
      phone: '+1 555 010 0199',
      city: 'Springfield',
      country: 'US',
      employee_count: 120,
      annual_revenue: '2500000.00',
      description: null,
      ...EXAMPLE_AUDIT,
    },
  },
  contact: {
    create: named('ContactCreate', bodySchema(CONTACT, 'create', 'A new contact: at least one of first_name, last_name or email')),
    update: named('ContactUpdate', bodySchema(CONTACT, 'update', UPDATE_DESCRIPTION)),
    record: ContactSchema,
    example: { first_name: 'Ann', last_name: 'Lee', email: 'ann@globex.com', job_title: 'CTO' },
    exampleRecord: {
      id: '01935f3c-9c00-7a11-9d2e-3c4b5a6f7e8d',
      first_name: 'Ann',
      last_name: 'Lee',
      email: 'ann@globex.com',
      phone: null,
      job_title: 'CTO',
      city: null,
      country: null,
      company_id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a',
      ...EXAMPLE_AUDIT,
    },
  },
  deal: {
    create: named('DealCreate', bodySchema(DEAL, 'create', 'A new deal: name is required')),
    update: named('DealUpdate', bodySchema(DEAL, 'update', UPDATE_DESCRIPTION)),
    record: DealSchema,
    example: { name: 'Globex renewal', amount: '12500.00', currency: 'USD', stage: 'proposal', close_date: '2026-12-31' },
    exampleRecord: {
      id: '01935f3c-9d00-7b22-8e3f-4d5c6b7a8f9e',
      name: 'Globex renewal',
      amount: '12500.00',
      currency: 'USD',
      stage: 'proposal',
      stage_changed_at: '2026-11-22T03:00:21.123Z',
      close_date: '2026-12-31',
      company_id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a',
      ...EXAMPLE_AUDIT,
    },
  },
}

export const DealStageSchema = named(
  'DealStage',
  Type.Object({
    key: Type.String(),
    label: Type.String(),
    position: Type.Integer(),
    is_closed: Type.Boolean(),
    is_won: Type.Boolean(),
  }),
)

export const one = (schema: TSchema) => Type.Object({ data: schema })
export const page = (schema: TSchema) =>
  Type.Object({
    data: Type.Array(schema),
    next_cursor: nullable(Type.String({ description: 'Pass as cursor= for the next page; null on the last page' })),
  })
