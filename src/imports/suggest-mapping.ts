// Which CSV column goes into which field. The upload answers a suggestion; the import job is
// given the user's mapping and checks it with validateMapping before reading a single row.
//
// Choices the API contract leaves open:
// - The suggestion lists every column; a column with no suggestion maps to null, so the client
//   gets a complete mapping it can edit and send back as it is.
// - Headers are compared after normalising: accents and case dropped, everything but letters and
//   digits removed, trailing digits removed ("E-mail", "Email 1" and "email_2" all read "email").
// - A field is suggested at most once; the first column wins ("Phone 1" gets phone, "Phone 2" null).
// - `id`, `company_id` and `owner_id` hold this service's UUIDs. An exported "Id" column usually
//   holds another tool's identifiers, and importing those as ours would update the wrong record or
//   fail every row. So they are suggested only when the header says exactly that field ("ID",
//   "Company ID", "owner_id", also HubSpot's "Record ID" for id) and every sampled value is a UUID.
// - In a mapping, a column left out is the same as null (not imported).
import type { FieldProblem } from '../errors.ts'
import { UUID_PATTERN } from '../uuid.ts'

export const IMPORT_TYPES = ['contacts', 'companies', 'deals'] as const
export type ImportType = (typeof IMPORT_TYPES)[number]

/**
 * Fields a column may map to (besides `custom_fields.<key>`); company_name is a pseudo-field;
 * custom_fields takes a JSON object (the export's column) merged into the record's custom fields.
 */
export const IMPORTABLE_FIELDS: Readonly<Record<ImportType, readonly string[]>> = {
  contacts: [
    'first_name',
    'last_name',
    'email',
    'phone',
    'job_title',
    'city',
    'country',
    'company_id',
    'owner_id',
    'id',
    'company_name',
    'custom_fields',
  ],
  companies: [
    'name',
    'domain',
    'website',
    'industry',
    'phone',
    'city',
    'country',
    'employee_count',
    'annual_revenue',
    'description',
    'owner_id',
    'id',
    'custom_fields',
  ],
  deals: ['name', 'amount', 'currency', 'stage', 'close_date', 'company_id', 'owner_id', 'id', 'company_name', 'custom_fields'],
}

export const CUSTOM_FIELD_PREFIX = 'custom_fields.'
export const CUSTOM_FIELD_KEY = /^[a-z][a-z0-9_]{0,62}$/

const COMPANY_REFERENCE = [
  'company',
  'companyname',
  'organization',
  'organisation',
  'organizationname',
  'organisationname',
  'account',
  'accountname',
]
const PHONE = ['phone', 'phonenumber', 'telephone', 'telephonenumber', 'tel']
const CITY = ['city', 'town']
const COUNTRY = ['country', 'countryregion', 'countryname']
/** The export's column of custom fields, one JSON object a row. */
const CUSTOM_FIELDS = ['customfields']

// Normalised header → field. Fields holding our UUIDs are not here: see UUID_FIELD_HEADERS.
const HEADER_ALIASES: Record<ImportType, Record<string, readonly string[]>> = {
  contacts: {
    first_name: ['firstname', 'givenname', 'forename', 'first'],
    last_name: ['lastname', 'surname', 'familyname', 'last'],
    email: ['email', 'emailaddress', 'mail', 'workemail', 'businessemail'],
    phone: [...PHONE, 'mobile', 'mobilephone', 'mobilenumber', 'cellphone', 'cell', 'workphone', 'businessphone'],
    job_title: ['jobtitle', 'title', 'position', 'jobposition'],
    city: CITY,
    country: COUNTRY,
    company_name: [...COMPANY_REFERENCE, 'employer'],
    custom_fields: CUSTOM_FIELDS,
  },
  companies: {
    name: [...COMPANY_REFERENCE, 'name', 'businessname'],
    domain: ['domain', 'domainname', 'companydomain', 'companydomainname'],
    website: ['website', 'websiteurl', 'companywebsite', 'web', 'url', 'homepage'],
    industry: ['industry', 'sector'],
    phone: [...PHONE, 'companyphone'],
    city: CITY,
    country: COUNTRY,
    employee_count: ['numberofemployees', 'noofemployees', 'employees', 'employeecount', 'headcount'],
    annual_revenue: ['annualrevenue', 'revenue', 'yearlyrevenue'],
    description: ['description', 'companydescription', 'about'],
    custom_fields: CUSTOM_FIELDS,
  },
  deals: {
    name: ['dealname', 'name', 'dealtitle', 'opportunityname', 'opportunity', 'deal'],
    amount: ['amount', 'value', 'dealvalue', 'dealamount', 'opportunityamount'],
    currency: ['currency', 'currencycode', 'dealcurrency'],
    stage: ['stage', 'dealstage', 'pipelinestage', 'opportunitystage'],
    close_date: ['closedate', 'expectedclosedate', 'closingdate', 'dealclosedate', 'dealexpectedclosedate'],
    company_name: [...COMPANY_REFERENCE, 'dealorganization'],
    custom_fields: CUSTOM_FIELDS,
  },
}

const UUID_FIELD_HEADERS: Record<string, readonly string[]> = {
  id: ['id', 'recordid'],
  company_id: ['companyid'],
  owner_id: ['ownerid'],
}

const FIELD_BY_HEADER: Record<ImportType, Map<string, string>> = {
  contacts: invertAliases(HEADER_ALIASES.contacts),
  companies: invertAliases(HEADER_ALIASES.companies),
  deals: invertAliases(HEADER_ALIASES.deals),
}

function invertAliases(aliases: Record<string, readonly string[]>): Map<string, string> {
  const fieldByHeader = new Map<string, string>()
  for (const [field, headers] of Object.entries(aliases)) for (const header of headers) fieldByHeader.set(header, field)
  return fieldByHeader
}

export function normaliseHeader(header: string): string {
  return withoutTrailingDigits(
    header
      .normalize('NFKD')
      .replace(/\p{M}/gu, '')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}]/gu, ''),
  )
}

// A loop rather than /\d+$/: a backtracking engine tries that pattern from every digit of a run
// that does not end the text, so `a` + 60,000 digits + `x` cost 60,000² steps (docs/architecture.md, "Request data").
function withoutTrailingDigits(text: string): string {
  let end = text.length
  while (end > 0 && text.charCodeAt(end - 1) >= 0x30 && text.charCodeAt(end - 1) <= 0x39) end--
  return text.slice(0, end)
}

/**
 * Suggests a field for each column (null when none). Pass the sample rows so that columns of our
 * own UUIDs (a re-imported export) can be recognised; without them no id field is suggested.
 */
export function suggestMapping(type: ImportType, columns: string[], sampleRows: string[][] = []): Record<string, string | null> {
  const taken = new Set<string>()
  const mapping: Record<string, string | null> = {}
  columns.forEach((column, index) => {
    const header = normaliseHeader(column)
    let field = FIELD_BY_HEADER[type].get(header) ?? null
    if (field === null) {
      const uuidField = Object.keys(UUID_FIELD_HEADERS).find((candidate) => UUID_FIELD_HEADERS[candidate].includes(header))
      if (uuidField && IMPORTABLE_FIELDS[type].includes(uuidField) && holdsUuids(sampleRows, index)) field = uuidField
    }
    if (field !== null && taken.has(field)) field = null
    if (field !== null) taken.add(field)
    mapping[column] = field
  })
  return mapping
}

function holdsUuids(sampleRows: string[][], columnIndex: number): boolean {
  const values = sampleRows.map((row) => (row[columnIndex] ?? '').trim()).filter((value) => value !== '')
  return values.length > 0 && values.every((value) => UUID_PATTERN.test(value))
}

/** Problems with a user's mapping, each pointing at `/mapping/<column>`; empty when it is usable. */
export function validateMapping(type: ImportType, columns: string[], mapping: Record<string, unknown>): FieldProblem[] {
  const problems: FieldProblem[] = []
  const knownColumns = new Set(columns)
  const columnByTarget = new Map<string, string>()
  for (const [column, target] of Object.entries(mapping)) {
    const pointer = `/mapping/${escapeJsonPointer(column)}`
    const problem = (code: string, message: string) => problems.push({ pointer, code, message })
    if (!knownColumns.has(column)) {
      problem('unknown_column', `The file has no column "${column}"`)
      continue
    }
    if (target === null) continue
    if (typeof target !== 'string') {
      problem('invalid_type', 'Map a column to a field name (a string) or to null to skip it')
      continue
    }
    if (target.startsWith(CUSTOM_FIELD_PREFIX)) {
      const key = target.slice(CUSTOM_FIELD_PREFIX.length)
      if (!CUSTOM_FIELD_KEY.test(key)) {
        problem(
          'invalid_custom_field_key',
          `"${key}" is not a valid custom field key: use 1 to 63 lower-case letters, digits or _, starting with a letter`,
        )
        continue
      }
    } else if (!IMPORTABLE_FIELDS[type].includes(target)) {
      problem(
        'unknown_field',
        `${type} have no field "${target}"; use one of ${IMPORTABLE_FIELDS[type].join(', ')} or ${CUSTOM_FIELD_PREFIX}<key>`,
      )
      continue
    }
    const earlierColumn = columnByTarget.get(target)
    if (earlierColumn !== undefined) {
      problem('duplicate_field', `"${target}" is already mapped from column "${earlierColumn}"`)
      continue
    }
    columnByTarget.set(target, column)
  }
  if (problems.length === 0 && columnByTarget.size === 0) {
    problems.push({ pointer: '/mapping', code: 'no_fields_mapped', message: 'Map at least one column to a field' })
  }
  return problems
}

// RFC 6901: column names may contain "/" (e.g. "Country/Region") or "~".
function escapeJsonPointer(token: string): string {
  return token.replace(/~/g, '~0').replace(/\//g, '~1')
}
