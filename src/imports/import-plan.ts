// What an import lands and how: the plan the job reads from crm.imports, the key its rows are
// matched or checked for repeats on, and the columns of the target table its mapping fills. Every
// column name here comes from the record type's field whitelist (src/records/fields.ts).
import { COMPANY, CONTACT, DEAL, type FieldSpec, type RecordType } from '../records/fields.ts'
import { CUSTOM_FIELD_PREFIX, type ImportType } from './suggest-mapping.ts'

export type ImportPlan = {
  importId: string
  type: ImportType
  columns: string[]
  mapping: Record<string, string | null>
  mode: 'create' | 'upsert'
  matchOn: 'email' | 'domain' | 'id'
  dryRun: boolean
}

/** The natural key a row is matched (upsert) or checked for repeats (create) on. */
export function keyFieldOf(plan: Pick<ImportPlan, 'type' | 'mode' | 'matchOn' | 'mapping'>): string | null {
  const mapped = new Set(Object.values(plan.mapping).filter((field): field is string => typeof field === 'string'))
  if (plan.mode === 'upsert') return plan.matchOn
  if (plan.type === 'contacts' && mapped.has('email')) return 'email'
  if (plan.type === 'companies' && mapped.has('domain')) return 'domain'
  return mapped.has('id') ? 'id' : null
}

/**
 * The cell whose value repeated within the file makes a row a duplicate, and how it is compared
 * (crm.import_key): null when the key field is not mapped to a column.
 */
export function repeatKeyOf(
  plan: Pick<ImportPlan, 'type' | 'mode' | 'matchOn' | 'mapping' | 'columns'>,
): { kind: string; column: number } | null {
  const keyField = keyFieldOf(plan)
  if (!keyField) return null
  for (const [column, target] of Object.entries(plan.mapping)) {
    const index = plan.columns.indexOf(column) + 1 // PostgreSQL arrays count from 1
    if (target === keyField && index > 0) return { kind: keyField, column: index }
  }
  return null
}

/** The match_on a type accepts: contacts email or id, companies domain or id, deals id. */
export function matchOnAllowed(type: ImportType, matchOn: string): boolean {
  return matchOn === 'id' || (type === 'contacts' && matchOn === 'email') || (type === 'companies' && matchOn === 'domain')
}

const RECORD_TYPES: Record<ImportType, RecordType> = { contacts: CONTACT, companies: COMPANY, deals: DEAL }

/** A cell of the staged row: its 1-based index in crm.import_rows.cells. */
type MappedCell = { column: string; index: number }
export type MappedField = MappedCell & { field: FieldSpec }
export type MappedCustomField = MappedCell & { key: string }

/** A plan resolved against its record type: which cell fills which column. */
export type BatchMapping = {
  plan: ImportPlan
  type: RecordType
  fields: MappedField[]
  custom: MappedCustomField[]
  /** The column holding custom fields as one JSON object (an export's custom_fields column). */
  customObject: MappedCell | null
  companyName: MappedCell | null
  keyField: string | null
  /** Every column of the target table a typed row carries. */
  allColumns: string[]
  /** The columns the file sets on a matched record (id is the match, never set). */
  setColumns: string[]
  maps: (field: string) => boolean
}

export function batchMappingOf(plan: ImportPlan): BatchMapping {
  const type = RECORD_TYPES[plan.type]
  const fields: MappedField[] = []
  const custom: MappedCustomField[] = []
  let companyName: MappedCell | null = null
  let customObject: MappedCell | null = null
  for (const [column, target] of Object.entries(plan.mapping)) {
    if (target === null || target === undefined) continue
    const index = plan.columns.indexOf(column) + 1 // PostgreSQL arrays count from 1
    if (index === 0) continue
    if (target.startsWith(CUSTOM_FIELD_PREFIX)) custom.push({ key: target.slice(CUSTOM_FIELD_PREFIX.length), column, index })
    else if (target === 'company_name') companyName = { column, index }
    else if (target === 'custom_fields') customObject = { column, index }
    else {
      const field = type.byName.get(target)
      if (field) fields.push({ field, column, index })
    }
  }
  const mapped = new Set(fields.map((mapped) => mapped.field.name))
  const setColumns = [...mapped].filter((name) => name !== 'id')
  if (custom.length > 0 || customObject) setColumns.push('custom_fields')
  if (companyName && !mapped.has('company_id')) setColumns.push('company_id')
  return {
    plan,
    type,
    fields,
    custom,
    customObject,
    companyName,
    keyField: keyFieldOf(plan),
    allColumns: ['workspace_id', ...type.fields.map((field) => field.name)],
    setColumns,
    maps: (field) => mapped.has(field),
  }
}
