// The whitelist and the one description of every record type's fields: the name, its kind (how a
// query value is checked and cast), whether it may be written, filtered and sorted, and the rules a
// request body must meet. Everything dynamic in a records query (filters, sorts, cursors, the
// columns of an insert or update) is looked up here and becomes an sql.identifier; nothing a client
// sends is ever spliced into SQL text. The request and response schemas (schemas.ts) are built from
// these lists; test/records/record-shape.test.ts checks them against the database's JSON renderers,
// column grants and constraints.
import { sql } from '../db/pool.ts'

export type FieldKind = 'text' | 'lowercase' | 'uuid' | 'numeric' | 'integer' | 'date' | 'timestamp' | 'json'

export type FieldSpec = {
  name: string
  kind: FieldKind
  /** The client may set it on create and update; otherwise it is read-only and ignored when sent. */
  writable: boolean
  nullable: boolean
  /** Left out of a create, the database fills it (a column default or a trigger); otherwise a non-null writable field is required. */
  filledByDatabase: boolean
  /** filter[field] accepts it. */
  filterable: boolean
  /** sort= accepts it. */
  sortable: boolean
  /** Rules of a writable field in request bodies (JSON Schema keywords); the database repeats each as a constraint. */
  minLength?: number
  maxLength?: number
  pattern?: string
  format?: string
  minimum?: number
  maximum?: number
  /** For the OpenAPI document; for money, what the amount is ("Annual revenue"), the format is added. */
  description?: string
}

export type RecordTypeName = 'contact' | 'company' | 'deal'
export type RecordPath = 'contacts' | 'companies' | 'deals'

export type RecordType = {
  name: RecordTypeName
  path: RecordPath
  /** Human label for messages and the OpenAPI document. */
  label: string
  table: ReturnType<typeof sql.identifier>
  jsonFunction: ReturnType<typeof sql.identifier>
  /** In the order the JSON shows them (crm.<type>_json). */
  fields: FieldSpec[]
  byName: Map<string, FieldSpec>
}

const EMAIL_PATTERN = '^[^\\s@]+@[^\\s@]+\\.[^\\s@.]+$'
const DOMAIN_PATTERN = '^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)+[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.?$'
// Every pattern of a request schema runs in time linear in its input on a backtracking engine; the
// list of them, each with the reason it is linear, is in test/hostile/linear-validation.test.ts.
// The phone's first digit ends the leading punctuation, so there is one way to split the number.
const PHONE_PATTERN = '^\\+?[ ().\\-/]*[0-9][0-9 ().\\-/]*( ?([xX]|[eE][xX][tT]\\.?|#) ?[0-9]{1,10})?$'
/** The host's first character, then anything but white space: equal to [^\\s/?#]+[^\\s]* without its ambiguity. */
const WEBSITE_PATTERN = '^[Hh][Tt][Tt][Pp][Ss]?://[^\\s/?#]\\S*$'
const KEY_PATTERN = '^[a-z][a-z0-9_]{0,62}$'
const CURRENCY_PATTERN = '^[A-Z]{3}$'

/** What a value of each pattern is, in words, for validation messages (docs/api.md section 2). */
export const PATTERN_NAMES: Record<string, string> = {
  [EMAIL_PATTERN]: 'an email address',
  [DOMAIN_PATTERN]: 'a domain name such as example.com',
  [PHONE_PATTERN]: 'a phone number such as +1 555 0100',
  [KEY_PATTERN]: 'a key of lower-case letters, digits and _ (at most 63, starting with a letter)',
  [CURRENCY_PATTERN]: 'a three-letter currency code such as USD',
}

type FieldOptions = Partial<Omit<FieldSpec, 'name' | 'kind'>>

/** A writable, nullable field, filterable and sortable unless it is JSON; options override. */
function field(name: string, kind: FieldKind, options: FieldOptions = {}): FieldSpec {
  return {
    name,
    kind,
    writable: true,
    nullable: true,
    filledByDatabase: false,
    filterable: kind !== 'json',
    sortable: kind !== 'json',
    ...options,
  }
}

/** Kept by the database alone: ids, times and authors. */
const readOnly = (name: string, kind: FieldKind, nullable = false) =>
  field(name, kind, { writable: false, nullable, filledByDatabase: true })

/** A text of 1 to maxLength characters. */
const text = (name: string, maxLength: number, options: FieldOptions = {}) => field(name, 'text', { minLength: 1, maxLength, ...options })

/** Every type's primary key and the last tie-breaker of every sort. */
export const ID_FIELD = readOnly('id', 'uuid')

const common = (own: FieldSpec[]): FieldSpec[] => [
  ID_FIELD,
  ...own,
  field('owner_id', 'uuid', { nullable: false, filledByDatabase: true }),
  field('custom_fields', 'json', { nullable: false, filledByDatabase: true }),
  readOnly('created_at', 'timestamp'),
  readOnly('updated_at', 'timestamp'),
  readOnly('created_by', 'uuid', true),
  readOnly('updated_by', 'uuid', true),
]

function recordType(name: RecordTypeName, path: RecordPath, label: string, fields: FieldSpec[]): RecordType {
  return {
    name,
    path,
    label,
    table: sql.identifier(['crm', path]),
    jsonFunction: sql.identifier(['crm', `${name}_json`]),
    fields,
    byName: new Map(fields.map((field) => [field.name, field])),
  }
}

export const COMPANY = recordType(
  'company',
  'companies',
  'company',
  common([
    text('name', 255, { nullable: false }),
    field('domain', 'lowercase', {
      maxLength: 254,
      pattern: DOMAIN_PATTERN,
      description: 'Host name, stored lower-case; unique in the workspace',
    }),
    field('website', 'text', { maxLength: 2048, pattern: WEBSITE_PATTERN, format: 'uri' }),
    text('industry', 100),
    field('phone', 'text', { maxLength: 50, pattern: PHONE_PATTERN }),
    text('city', 100),
    text('country', 100),
    field('employee_count', 'integer', { minimum: 0, maximum: 2_147_483_647 }),
    field('annual_revenue', 'numeric', { description: 'Annual revenue' }),
    field('description', 'text', { maxLength: 10_000 }),
  ]),
)

export const CONTACT = recordType(
  'contact',
  'contacts',
  'contact',
  common([
    text('first_name', 100),
    text('last_name', 100),
    field('email', 'lowercase', { maxLength: 254, pattern: EMAIL_PATTERN, description: 'Stored lower-case; unique in the workspace' }),
    field('phone', 'text', { maxLength: 50, pattern: PHONE_PATTERN }),
    text('job_title', 200),
    text('city', 100),
    text('country', 100),
    field('company_id', 'uuid'),
  ]),
)

export const DEAL = recordType(
  'deal',
  'deals',
  'deal',
  common([
    text('name', 255, { nullable: false }),
    field('amount', 'numeric', { description: 'Amount' }),
    field('currency', 'text', {
      nullable: false,
      filledByDatabase: true,
      maxLength: 3,
      pattern: CURRENCY_PATTERN,
      description: 'ISO 4217 code; default USD',
    }),
    field('stage', 'text', {
      nullable: false,
      filledByDatabase: true,
      maxLength: 63,
      pattern: KEY_PATTERN,
      description: 'A key of GET /api/deal-stages; default the first stage',
    }),
    readOnly('stage_changed_at', 'timestamp'),
    field('close_date', 'date'),
    field('company_id', 'uuid'),
  ]),
)

export const RECORD_TYPES: RecordType[] = [CONTACT, COMPANY, DEAL]

/** A create (through the API or an import) must give it: writable, not null, and not filled by the database. */
export function requiredOnCreate(field: FieldSpec): boolean {
  return field.writable && !field.nullable && !field.filledByDatabase
}

export function recordTypeByPath(path: string): RecordType | undefined {
  return RECORD_TYPES.find((type) => type.path === path)
}
