// Request and response schemas of the three record types (typebox). The same objects validate
// bodies (src/http/route.ts) and describe the API in /api/openapi.json. The database repeats every
// rule as a constraint (sql/000003_records.sql), so imports and psql obey them too.
import Type, { type TSchema } from 'typebox'
import { UUID_SCHEMA_PATTERN, type RecordType } from './fields.ts'

const nullable = (schema: TSchema) => Type.Union([schema, Type.Null()])
const Uuid = Type.String({ format: 'uuid', maxLength: 36, pattern: UUID_SCHEMA_PATTERN })
const text = (maxLength: number, description?: string) => Type.String({ minLength: 1, maxLength, ...(description ? { description } : {}) })

export const EMAIL_PATTERN = '^[^\\s@]+@[^\\s@]+\\.[^\\s@.]+$'
export const DOMAIN_PATTERN = '^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)+[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.?$'
// Every pattern of a request schema runs in time linear in its input on a backtracking engine; the
// list of them, each with the reason it is linear, is in test/hostile/linear-validation.test.ts.
// The phone's first digit ends the leading punctuation, so there is one way to split the number.
export const PHONE_PATTERN = '^\\+?[ ().\\-/]*[0-9][0-9 ().\\-/]*( ?([xX]|[eE][xX][tT]\\.?|#) ?[0-9]{1,10})?$'
export const MONEY_PATTERN = '^\\d{1,16}(\\.\\d{1,2})?$'
/** The host's first character, then anything but white space: equal to [^\\s/?#]+[^\\s]* without its ambiguity. */
export const WEBSITE_PATTERN = '^[Hh][Tt][Tt][Pp][Ss]?://[^\\s/?#]\\S*$'

const Money = (description: string) =>
  Type.Union([Type.String({ maxLength: 19, pattern: MONEY_PATTERN }), Type.Number({ minimum: 0, maximum: 9_999_999_999_999_999 })], {
    description: `${description}: a decimal string with at most two places ("12500.00"); a JSON number is accepted too`,
  })
const DateOnly = Type.String({ format: 'date', maxLength: 10, pattern: '^\\d{4}-\\d{2}-\\d{2}$' })
const Time = Type.String({ format: 'date-time', description: 'RFC 3339, UTC, milliseconds' })

export const CustomFields = Type.Record(
  Type.String({ pattern: '^[a-z][a-z0-9_]{0,62}$' }),
  Type.Union([Type.String({ maxLength: 10_000 }), Type.Number(), Type.Boolean(), Type.Null()]),
  { maxProperties: 50, additionalProperties: false, description: 'At most 50 keys matching ^[a-z][a-z0-9_]{0,62}$; values are strings, numbers, booleans or null' },
)

/** Accepted and ignored in bodies (API.md section 1: read-only fields are ignored). */
const readOnly = () => Type.Optional(Type.Unknown({ readOnly: true, description: 'Read-only: ignored when sent' }))
const READ_ONLY = { id: readOnly(), created_at: readOnly(), updated_at: readOnly(), created_by: readOnly(), updated_by: readOnly() }

const companyWritable = {
  name: text(255),
  domain: nullable(Type.String({ maxLength: 254, pattern: DOMAIN_PATTERN, description: 'Host name, stored lower-case; unique in the workspace' })),
  website: nullable(Type.String({ maxLength: 2048, pattern: WEBSITE_PATTERN, format: 'uri' })),
  industry: nullable(text(100)),
  phone: nullable(Type.String({ maxLength: 50, pattern: PHONE_PATTERN })),
  city: nullable(text(100)),
  country: nullable(text(100)),
  employee_count: nullable(Type.Integer({ minimum: 0, maximum: 2_147_483_647 })),
  annual_revenue: nullable(Money('Annual revenue')),
  description: nullable(Type.String({ maxLength: 10_000 })),
  owner_id: Uuid,
  custom_fields: CustomFields,
}

const contactWritable = {
  first_name: nullable(text(100)),
  last_name: nullable(text(100)),
  email: nullable(Type.String({ maxLength: 254, pattern: EMAIL_PATTERN, description: 'Stored lower-case; unique in the workspace' })),
  phone: nullable(Type.String({ maxLength: 50, pattern: PHONE_PATTERN })),
  job_title: nullable(text(200)),
  city: nullable(text(100)),
  country: nullable(text(100)),
  company_id: nullable(Uuid),
  owner_id: Uuid,
  custom_fields: CustomFields,
}

const dealWritable = {
  name: text(255),
  amount: nullable(Money('Amount')),
  currency: Type.String({ maxLength: 3, pattern: '^[A-Z]{3}$', description: 'ISO 4217 code; default USD' }),
  stage: Type.String({ maxLength: 63, pattern: '^[a-z][a-z0-9_]{0,62}$', description: 'A key of GET /api/deal-stages; default the first stage' }),
  close_date: nullable(DateOnly),
  company_id: nullable(Uuid),
  owner_id: Uuid,
  custom_fields: CustomFields,
}

function optionalAll(properties: Record<string, TSchema>): Record<string, TSchema> {
  return Object.fromEntries(Object.entries(properties).map(([name, schema]) => [name, Type.Optional(schema)]))
}

function createSchema(properties: Record<string, TSchema>, required: string[], description: string) {
  const entries = Object.entries(properties).map(([name, schema]) => [name, required.includes(name) ? schema : Type.Optional(schema)])
  return Type.Object({ ...Object.fromEntries(entries), ...READ_ONLY, ...(properties.stage ? { stage_changed_at: readOnly() } : {}) }, { additionalProperties: false, description })
}

function updateSchema(properties: Record<string, TSchema>, description: string) {
  return Type.Object({ ...optionalAll(properties), ...READ_ONLY, ...(properties.stage ? { stage_changed_at: readOnly() } : {}) }, { additionalProperties: false, description })
}

const audit = {
  owner_id: Uuid,
  custom_fields: CustomFields,
  created_at: Time,
  updated_at: Time,
  created_by: nullable(Uuid),
  updated_by: nullable(Uuid),
}

export const CompanySchema = Type.Object({
  id: Uuid,
  name: Type.String(),
  domain: nullable(Type.String()),
  website: nullable(Type.String()),
  industry: nullable(Type.String()),
  phone: nullable(Type.String()),
  city: nullable(Type.String()),
  country: nullable(Type.String()),
  employee_count: nullable(Type.Integer()),
  annual_revenue: nullable(Type.String({ description: 'Decimal string' })),
  description: nullable(Type.String()),
  ...audit,
})

export const ContactSchema = Type.Object({
  id: Uuid,
  first_name: nullable(Type.String()),
  last_name: nullable(Type.String()),
  email: nullable(Type.String()),
  phone: nullable(Type.String()),
  job_title: nullable(Type.String()),
  city: nullable(Type.String()),
  country: nullable(Type.String()),
  company_id: nullable(Uuid),
  ...audit,
})

export const DealSchema = Type.Object({
  id: Uuid,
  name: Type.String(),
  amount: nullable(Type.String({ description: 'Decimal string with two places' })),
  currency: Type.String(),
  stage: Type.String(),
  stage_changed_at: Time,
  close_date: nullable(DateOnly),
  company_id: nullable(Uuid),
  ...audit,
})

export type RecordSchemas = { create: TSchema; update: TSchema; record: TSchema; example: Record<string, unknown>; exampleRecord: Record<string, unknown> }

const EXAMPLE_TIMES = { created_at: '2026-11-22T03:00:21.123Z', updated_at: '2026-11-22T03:00:21.123Z' }
const EXAMPLE_USER = '01935f3c-8a41-7cc2-9b1e-5d2f0c6a7e11'
const EXAMPLE_AUDIT = { owner_id: EXAMPLE_USER, custom_fields: { tier: 'gold' }, ...EXAMPLE_TIMES, created_by: EXAMPLE_USER, updated_by: EXAMPLE_USER }

export const SCHEMAS: Record<RecordType['name'], RecordSchemas> = {
  company: {
    create: createSchema(companyWritable, ['name'], 'A new company: name is required'),
    update: updateSchema(companyWritable, 'The fields to change; the others stay as they are'),
    record: CompanySchema,
    example: { name: 'Globex', domain: 'globex.com', employee_count: 120, annual_revenue: '2500000.00', custom_fields: { tier: 'gold' } },
    exampleRecord: {
      id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a', name: 'Globex', domain: 'globex.com', website: 'https://globex.com', industry: 'Manufacturing',
      phone: '+1 555 010 0199', city: 'Springfield', country: 'US', employee_count: 120, annual_revenue: '2500000.00', description: null, ...EXAMPLE_AUDIT,
    },
  },
  contact: {
    create: createSchema(contactWritable, [], 'A new contact: at least one of first_name, last_name or email'),
    update: updateSchema(contactWritable, 'The fields to change; the others stay as they are'),
    record: ContactSchema,
    example: { first_name: 'Ann', last_name: 'Lee', email: 'ann@globex.com', job_title: 'CTO' },
    exampleRecord: {
      id: '01935f3c-9c00-7a11-9d2e-3c4b5a6f7e8d', first_name: 'Ann', last_name: 'Lee', email: 'ann@globex.com', phone: null, job_title: 'CTO',
      city: null, country: null, company_id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a', ...EXAMPLE_AUDIT,
    },
  },
  deal: {
    create: createSchema(dealWritable, ['name'], 'A new deal: name is required'),
    update: updateSchema(dealWritable, 'The fields to change; the others stay as they are'),
    record: DealSchema,
    example: { name: 'Globex renewal', amount: '12500.00', currency: 'USD', stage: 'proposal', close_date: '2026-12-31' },
    exampleRecord: {
      id: '01935f3c-9d00-7b22-8e3f-4d5c6b7a8f9e', name: 'Globex renewal', amount: '12500.00', currency: 'USD', stage: 'proposal',
      stage_changed_at: '2026-11-22T03:00:21.123Z', close_date: '2026-12-31', company_id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a', ...EXAMPLE_AUDIT,
    },
  },
}

export const DealStageSchema = Type.Object({
  key: Type.String(),
  label: Type.String(),
  position: Type.Integer(),
  is_closed: Type.Boolean(),
  is_won: Type.Boolean(),
})

export const one = (schema: TSchema) => Type.Object({ data: schema })
export const page = (schema: TSchema) =>
  Type.Object({ data: Type.Array(schema), next_cursor: nullable(Type.String({ description: 'Pass as cursor= for the next page; null on the last page' })) })
