// The whitelist: every field of every record type, with its kind (how a query value is checked and
// cast), whether it may be written, filtered and sorted. Everything dynamic in a records query
// (filters, sorts, cursors, the columns of an insert or update) is looked up here and becomes an
// sql.identifier; nothing a client sends is ever spliced into SQL text.
import { sql } from '../db/pool.ts'

export type FieldKind = 'text' | 'lowercase' | 'uuid' | 'numeric' | 'integer' | 'date' | 'timestamp' | 'json'

export type FieldSpec = {
  name: string
  kind: FieldKind
  /** The client may set it on create and update. */
  writable: boolean
  nullable: boolean
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
  /** crm.read_<type>(id): one record by id through a PL/pgSQL function whose plan is cached per session. */
  fields: FieldSpec[]
  byName: Map<string, FieldSpec>
}

const common = (before: FieldSpec[]): FieldSpec[] => [
  { name: 'id', kind: 'uuid', writable: false, nullable: false },
  ...before,
  { name: 'owner_id', kind: 'uuid', writable: true, nullable: false },
  { name: 'custom_fields', kind: 'json', writable: true, nullable: false },
  { name: 'created_at', kind: 'timestamp', writable: false, nullable: false },
  { name: 'updated_at', kind: 'timestamp', writable: false, nullable: false },
  { name: 'created_by', kind: 'uuid', writable: false, nullable: true },
  { name: 'updated_by', kind: 'uuid', writable: false, nullable: true },
]

const text = (name: string, nullable = true): FieldSpec => ({ name, kind: 'text', writable: true, nullable })

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

export const COMPANY = recordType('company', 'companies', 'company', common([
  text('name', false),
  { name: 'domain', kind: 'lowercase', writable: true, nullable: true },
  text('website'),
  text('industry'),
  text('phone'),
  text('city'),
  text('country'),
  { name: 'employee_count', kind: 'integer', writable: true, nullable: true },
  { name: 'annual_revenue', kind: 'numeric', writable: true, nullable: true },
  text('description'),
]))

export const CONTACT = recordType('contact', 'contacts', 'contact', common([
  text('first_name'),
  text('last_name'),
  { name: 'email', kind: 'lowercase', writable: true, nullable: true },
  text('phone'),
  text('job_title'),
  text('city'),
  text('country'),
  { name: 'company_id', kind: 'uuid', writable: true, nullable: true },
]))

export const DEAL = recordType('deal', 'deals', 'deal', common([
  text('name', false),
  { name: 'amount', kind: 'numeric', writable: true, nullable: true },
  text('currency', false),
  text('stage', false),
  { name: 'stage_changed_at', kind: 'timestamp', writable: false, nullable: false },
  { name: 'close_date', kind: 'date', writable: true, nullable: true },
  { name: 'company_id', kind: 'uuid', writable: true, nullable: true },
]))

export const RECORD_TYPES: RecordType[] = [CONTACT, COMPANY, DEAL]

export function recordTypeByPath(path: string): RecordType | undefined {
  return RECORD_TYPES.find((type) => type.path === path)
}

/** Fields that are part of the JSON but never written by the client (ignored when sent). */
export const READ_ONLY_FIELDS = ['id', 'created_at', 'updated_at', 'created_by', 'updated_by', 'stage_changed_at']
