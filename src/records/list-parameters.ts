// The list grammar of docs/api.md section 5, checked against the whitelist of fields:
//   filter[field]=v, filter[field][op]=v, filter[custom_fields.key]=v, updated_since=<time>,
//   sort=-amount,name (id always the last tie-breaker), limit=1..200, cursor=<opaque>, q=<search>.
// Every value is checked for its field's kind here, so the SQL built from it cannot fail on a cast.

import { InvalidParameterError } from '../errors.ts'
import { type Cursor, type CursorColumn, DEFAULT_LIMIT, decodeCursor, limitOf } from '../paging.ts'
import { UUID_PATTERN } from '../uuid.ts'
import { type FieldKind, type FieldSpec, ID_FIELD, type RecordType } from './fields.ts'
import { safeName } from './query-string.ts'

export type FilterOperator = 'eq' | 'ne' | 'lt' | 'lte' | 'gt' | 'gte' | 'in' | 'contains' | 'starts_with' | 'is_null'

export const OPERATORS: FilterOperator[] = ['eq', 'ne', 'lt', 'lte', 'gt', 'gte', 'in', 'contains', 'starts_with', 'is_null']

const OPERATORS_BY_KIND: Record<FieldKind, FilterOperator[]> = {
  text: OPERATORS,
  lowercase: OPERATORS,
  uuid: ['eq', 'ne', 'in', 'is_null'],
  numeric: ['eq', 'ne', 'lt', 'lte', 'gt', 'gte', 'in', 'is_null'],
  integer: ['eq', 'ne', 'lt', 'lte', 'gt', 'gte', 'in', 'is_null'],
  date: ['eq', 'ne', 'lt', 'lte', 'gt', 'gte', 'in', 'is_null'],
  timestamp: ['eq', 'ne', 'lt', 'lte', 'gt', 'gte', 'in', 'is_null'],
  json: [],
}

export type FieldFilter = { kind: 'field'; field: FieldSpec; op: FilterOperator; values: string[]; isNull?: boolean }
export type CustomFieldFilter = { kind: 'custom'; key: string; value: string }
export type Filter = FieldFilter | CustomFieldFilter

/** A sort key: a field of the type, or the search score (search only). */
export type SortKey = { field: FieldSpec; descending: boolean }

export type ListRequest = {
  filters: Filter[]
  /** Explicit sort keys, id last; empty for search when no sort was given (score order). */
  sort: SortKey[]
  /** The canonical text of the sort, as cursors record it. */
  sortText: string
  limit: number
  cursor: Cursor | null
  q: string | null
}

export const MAX_IN_VALUES = 100
export const MAX_SORT_KEYS = 4
export const MAX_FILTERS = 20
export const MAX_Q_LENGTH = 200

const CUSTOM_KEY = /^[a-z][a-z0-9_]{0,62}$/
const FILTER_NAME = /^filter\[([^[\]]{1,80})\](?:\[([^[\]]{1,40})\])?$/

export type ParseOptions = { search?: boolean; extraParameters?: string[] }

export function parseListRequest(type: RecordType, parameters: Map<string, string>, options: ParseOptions = {}): ListRequest {
  const filters: Filter[] = []
  const seen = new Set<string>()
  let sortParameter: string | null = null
  let limit = DEFAULT_LIMIT
  let cursorText: string | null = null
  let q: string | null = null

  for (const [name, value] of parameters) {
    if (name === 'limit') limit = limitOf(value)
    else if (name === 'sort') sortParameter = value
    else if (name === 'cursor') cursorText = value
    else if (name === 'updated_since') {
      const field = type.byName.get('updated_at')!
      addFilter(filters, seen, { kind: 'field', field, op: 'gte', values: [checkValue(field.kind, value, 'updated_since')] })
    } else if (name === 'q' && options.search) q = parseSearchText(value)
    else if (name.startsWith('filter[')) {
      const match = FILTER_NAME.exec(name)
      if (!match) throw new InvalidParameterError(`${safeName(name)} is not a filter: use filter[field]=value or filter[field][op]=value`)
      addFilter(filters, seen, parseFilter(type, match[1], match[2] ?? 'eq', value, name))
    } else if (options.extraParameters?.includes(name)) continue
    else throw new InvalidParameterError(`Unknown query parameter ${safeName(name)}`)
  }
  if (options.search && q === null) throw new InvalidParameterError('q is required: the text to search for')
  if (filters.length > MAX_FILTERS) throw new InvalidParameterError(`At most ${MAX_FILTERS} filters are accepted`)

  const sort = parseSort(type, sortParameter, options.search === true)
  const sortText = sort.length === 0 ? 'score' : sort.map((key) => (key.descending ? '-' : '') + key.field.name).join(',')
  const cursor = cursorText === null ? null : decodeCursor(cursorText, sortText, cursorColumns(sort))
  return { filters, sort, sortText, limit, cursor, q }
}

function addFilter(filters: Filter[], seen: Set<string>, filter: Filter): void {
  const key = filter.kind === 'custom' ? `custom_fields.${filter.key}:eq` : `${filter.field.name}:${filter.op}`
  if (seen.has(key))
    throw new InvalidParameterError(
      `The filter on ${key.replace(':', ' ')} is given more than once (updated_since is filter[updated_at][gte])`,
    )
  seen.add(key)
  filters.push(filter)
}

/** What each value of a cursor for this sort holds; score-ordered search (no keys) is score, then id. */
export function cursorColumns(sort: SortKey[]): CursorColumn[] {
  if (sort.length === 0)
    return [
      { kind: 'score', nullable: false },
      { kind: 'uuid', nullable: false },
    ]
  return sort.map((key) => ({ kind: key.field.kind, nullable: key.field.nullable }))
}

export function parseSearchText(value: string): string {
  const text = value.trim()
  if (text.length === 0) throw new InvalidParameterError('q must not be empty')
  if (text.length > MAX_Q_LENGTH) throw new InvalidParameterError(`q is too long (at most ${MAX_Q_LENGTH} characters)`)
  return text
}

function parseFilter(type: RecordType, fieldName: string, op: string, value: string, parameter: string): Filter {
  if (fieldName.startsWith('custom_fields.')) {
    const key = fieldName.slice('custom_fields.'.length)
    if (!CUSTOM_KEY.test(key)) throw new InvalidParameterError(`${safeName(parameter)}: custom field keys match ^[a-z][a-z0-9_]{0,62}$`)
    if (op !== 'eq') throw new InvalidParameterError(`${safeName(parameter)}: custom fields can only be filtered by equality`)
    if (value.length > 1000) throw new InvalidParameterError(`${safeName(parameter)} is too long`)
    return { kind: 'custom', key, value }
  }
  const field = type.byName.get(fieldName)
  if (!field?.filterable)
    throw new InvalidParameterError(`${safeName(parameter)}: ${type.path} have no filterable field ${safeName(fieldName)}`)
  if (!(OPERATORS as string[]).includes(op)) {
    throw new InvalidParameterError(`${safeName(parameter)}: unknown operator ${safeName(op)} (use one of ${OPERATORS.join(', ')})`)
  }
  const operator = op as FilterOperator
  if (!OPERATORS_BY_KIND[field.kind].includes(operator)) {
    throw new InvalidParameterError(
      `${safeName(parameter)}: ${field.name} does not support ${operator} (use one of ${OPERATORS_BY_KIND[field.kind].join(', ')})`,
    )
  }
  if (operator === 'is_null') {
    if (value !== 'true' && value !== 'false') throw new InvalidParameterError(`${safeName(parameter)} must be true or false`)
    return { kind: 'field', field, op: operator, values: [], isNull: value === 'true' }
  }
  if (operator === 'in') {
    const items = value.split(',')
    if (items.length > MAX_IN_VALUES) throw new InvalidParameterError(`${safeName(parameter)} accepts at most ${MAX_IN_VALUES} values`)
    return { kind: 'field', field, op: operator, values: items.map((item) => checkValue(field.kind, item, parameter)) }
  }
  if ((operator === 'contains' || operator === 'starts_with') && value === '') {
    throw new InvalidParameterError(`${safeName(parameter)} must not be empty`)
  }
  return { kind: 'field', field, op: operator, values: [checkValue(field.kind, value, parameter)] }
}

const NUMERIC = /^-?\d{1,18}(\.\d{1,6})?$/
const INTEGER = /^-?\d{1,10}$/
const DATE = /^(\d{4})-(\d{2})-(\d{2})$/
const TIMESTAMP = /^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?$/i

export function isValidDate(text: string): boolean {
  const match = DATE.exec(text)
  if (!match) return false
  const [year, month, day] = [Number(match[1]), Number(match[2]), Number(match[3])]
  if (year < 1000 || year > 9999) return false
  const date = new Date(Date.UTC(year, month - 1, day))
  return date.getUTCFullYear() === year && date.getUTCMonth() === month - 1 && date.getUTCDate() === day
}

/** Checks a query value for a field kind and returns it in the form PostgreSQL will be given. */
export function checkValue(kind: FieldKind, value: string, parameter: string): string {
  const name = safeName(parameter)
  switch (kind) {
    case 'text':
      if (value.length > 1000) throw new InvalidParameterError(`${name} is too long (at most 1000 characters)`)
      return value
    case 'lowercase':
      if (value.length > 1000) throw new InvalidParameterError(`${name} is too long (at most 1000 characters)`)
      return value.toLowerCase()
    case 'uuid':
      if (!UUID_PATTERN.test(value)) throw new InvalidParameterError(`${name} must be a UUID`)
      return value.toLowerCase()
    case 'numeric':
      if (!NUMERIC.test(value)) throw new InvalidParameterError(`${name} must be a decimal number such as 12500.00`)
      return value
    case 'integer':
      if (!INTEGER.test(value) || Math.abs(Number(value)) > 2_147_483_647) throw new InvalidParameterError(`${name} must be a whole number`)
      return value
    case 'date':
      if (!isValidDate(value)) throw new InvalidParameterError(`${name} must be a date (YYYY-MM-DD)`)
      return value
    case 'timestamp': {
      const match = TIMESTAMP.exec(value)
      if (!match || !isValidDate(match[1]))
        throw new InvalidParameterError(`${name} must be an RFC 3339 time such as 2026-11-22T03:00:21.123Z`)
      const [hour, minute, second] = [Number(match[2] ?? 0), Number(match[3] ?? 0), Number(match[4] ?? 0)]
      if (hour > 23 || minute > 59 || second > 59)
        throw new InvalidParameterError(`${name} must be an RFC 3339 time such as 2026-11-22T03:00:21.123Z`)
      const zone = match[6] ? '' : match[2] ? 'Z' : 'T00:00:00Z'
      return value + zone
    }
    case 'json':
      throw new InvalidParameterError(`${name} cannot be compared`)
  }
}

function parseSort(type: RecordType, text: string | null, search: boolean): SortKey[] {
  if (text === null || text === '') {
    if (search) return []
    return [
      { field: type.byName.get('created_at')!, descending: false },
      { field: ID_FIELD, descending: false },
    ]
  }
  if (text.length > 200 || !/^-?[a-z_]{1,40}(,-?[a-z_]{1,40})*$/.test(text)) {
    throw new InvalidParameterError(
      'sort must be a comma-separated list of field names, each optionally prefixed with - (e.g. sort=-amount,name)',
    )
  }
  const keys: SortKey[] = []
  for (const part of text.split(',')) {
    const descending = part.startsWith('-')
    const name = descending ? part.slice(1) : part
    const field = type.byName.get(name)
    if (!field?.sortable) throw new InvalidParameterError(`sort: ${type.path} cannot be sorted by ${safeName(name)}`)
    if (keys.some((key) => key.field.name === name)) throw new InvalidParameterError(`sort: ${name} is given twice`)
    if (keys.some((key) => key.field.name === 'id'))
      throw new InvalidParameterError('sort: id is the last tie-breaker; nothing can follow it')
    keys.push({ field, descending })
  }
  if (keys.length > MAX_SORT_KEYS) throw new InvalidParameterError(`sort: at most ${MAX_SORT_KEYS} fields`)
  // id breaks ties in the direction of the last key, so "-created_at" walks its index backwards.
  if (keys[keys.length - 1].field.name !== 'id') keys.push({ field: ID_FIELD, descending: keys[keys.length - 1].descending })
  return keys
}
