// Contacts, companies and deals in the browser (docs/api.md section 12): each type's list, a
// record's page with its associations and history, the new and edit forms, and delete with a
// confirmation. Every read and write goes through the API's own route handlers under the signed-in
// user, so row-level security decides what a page shows: nothing is filtered here.

import Type from 'typebox'
import { sql } from '../../db/pool.ts'
import { GrantedRow, rowType } from '../../db/typed-rows.ts'
import { NotFoundError, ValidationError } from '../../errors.ts'
import type { ApiError } from '../../http/problem.ts'
import { type FieldSpec, RECORD_TYPES, type RecordType } from '../../records/fields.ts'
import { checkId, etagOf, type RecordJson, readRecord } from '../../records/operations.ts'
import { ownerWithinGrant } from '../../records/owner-scope.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf, when } from '../layout.ts'
import type { PageContext, PageHandler, PageResult } from '../page-context.ts'
import { setFlash, takeFlash } from '../session.ts'

const PAGE_SIZE = 50
const FIRST_PAGE = '.'

/** The columns of each list, after the record's title. */
const LIST_COLUMNS: Record<RecordType['path'], string[]> = {
  contacts: ['email', 'phone', 'job_title', 'company_id', 'owner_id'],
  companies: ['domain', 'industry', 'city', 'country', 'owner_id'],
  deals: ['stage', 'amount', 'company_id', 'close_date', 'owner_id'],
}

/** The field a list sorts by when its title column is chosen. */
const TITLE_FIELD: Record<RecordType['path'], string> = { contacts: 'last_name', companies: 'name', deals: 'name' }

const OPERATORS: { value: string; label: string }[] = [
  { value: 'contains', label: 'contains' },
  { value: 'eq', label: 'is' },
  { value: 'ne', label: 'is not' },
  { value: 'starts_with', label: 'starts with' },
  { value: 'lt', label: 'less than' },
  { value: 'lte', label: 'at most' },
  { value: 'gt', label: 'greater than' },
  { value: 'gte', label: 'at least' },
  { value: 'in', label: 'is one of (comma-separated)' },
  { value: 'is_null', label: 'is empty (true/false)' },
]

type Stage = { key: string; label: string }
type Titles = Map<string, string>
const TypeGrantsRow = rowType(Type.Object({ create: Type.Boolean(), import: Type.Boolean(), export: Type.Boolean() }))
type Permissions = { create: boolean; import: boolean; export: boolean }

/** `first_name` -> `First name`, `company_id` -> `Company`. */
export function fieldLabel(name: string): string {
  const words = name.replace(/_id$/, '').replace(/_/g, ' ')
  return words.charAt(0).toUpperCase() + words.slice(1)
}

function singular(type: RecordType): string {
  return type.label
}

function heading(type: RecordType): string {
  return fieldLabel(type.path)
}

export function recordTitle(type: RecordType, record: Record<string, unknown>): string {
  if (type.name === 'contact') {
    const name = [record.first_name, record.last_name].filter((part) => typeof part === 'string' && part !== '').join(' ')
    return name || String(record.email ?? '') || 'Unnamed contact'
  }
  return String(record.name ?? '') || `Unnamed ${type.label}`
}

/** Whether the caller's role (narrowed by the session's scopes) grants the action on the type at all: the database answers. */
export async function typeGrants(context: PageContext, type: RecordType): Promise<Permissions> {
  return context.db.one(sql.type(TypeGrantsRow)`
    select crm.grant_scope(${type.path}, 'create') is not null as create,
           crm.grant_scope(${type.path}, 'import') is not null as import,
           crm.grant_scope(${type.path}, 'export') is not null as export`)
}

/** Whether the caller may do `action` on this record, as the row-level security policies decide it. */
async function permits(context: PageContext, type: RecordType, record: RecordJson, action: 'update' | 'delete'): Promise<boolean> {
  return context.db.oneFirst(sql.type(GrantedRow)`
    select ${ownerWithinGrant(type.path, action, sql.fragment`${String(record.owner_id)}::uuid`)} as granted`)
}

/** The titles of the records of `type` with these ids that the caller may see (batch read, as the API). */
async function titlesOf(context: PageContext, type: RecordType, ids: Iterable<string>): Promise<Titles> {
  const unique = [...new Set([...ids].filter((id) => id))].slice(0, 100)
  const titles: Titles = new Map()
  if (unique.length === 0) return titles
  // A record the caller may not see is a 404 in its item, not a refusal of the call: no savepoint needed.
  const answer = (await context.api('POST', `/api/${type.path}/batch/read`, { body: { ids: unique } })) as {
    results: { status: number; data?: RecordJson }[]
  }
  for (const result of answer.results) if (result.status === 200 && result.data) titles.set(result.data.id, recordTitle(type, result.data))
  return titles
}

/** Owner names: the caller as "You", the workspace's members for admins (the members list is theirs). */
async function ownerNames(context: PageContext): Promise<Titles> {
  const names: Titles = new Map([[context.caller.userId, 'You']])
  if (!context.caller.isAdmin) return names
  const members = (await context.api('GET', '/api/members')) as { data: { user_id: string; name: string }[] }
  for (const member of members.data) if (!names.has(member.user_id)) names.set(member.user_id, member.name)
  return names
}

async function stagesOf(context: PageContext): Promise<Stage[]> {
  return ((await context.api('GET', '/api/deal-stages')) as { data: Stage[] }).data
}

type Lookups = { companies: Titles; owners: Titles; stages: Stage[] }

function display(field: string, value: unknown, lookups: Lookups): SafeHtml | string {
  if (value === null || value === undefined || value === '') return '—'
  if (field === 'company_id') return html`<a href="/companies/${String(value)}">${lookups.companies.get(String(value)) ?? 'A company'}</a>`
  // Members by name where the caller may list them (ownerNames), never by id.
  if (field === 'owner_id' || field === 'created_by' || field === 'updated_by') return lookups.owners.get(String(value)) ?? 'Another member'
  if (field === 'stage') return lookups.stages.find((stage) => stage.key === value)?.label ?? String(value)
  if (field.endsWith('_at')) return when(String(value))
  if (typeof value === 'object') return JSON.stringify(value)
  return String(value)
}

/**
 * A record the caller may not see (or that does not exist) answers the HTML 404 inside the signed-in
 * layout, navigation included, the same page for both. The refusal comes from code, never from a
 * failed statement, so the transaction is intact.
 */
export function notFoundInLayout(handler: PageHandler): PageHandler {
  return async (context) => {
    try {
      return await handler(context)
    } catch (error) {
      if (!(error instanceof NotFoundError)) throw error
      return {
        status: 404,
        title: 'Not found',
        content: html`<h1>Not found</h1>
<div class="notice error" role="alert">${error.message}. It may have been deleted, or it is not yours to see.</div>
<p><a href="/contacts">Back to Contacts</a></p>`,
      }
    }
  }
}

export function recordTypeOf(path: string): RecordType {
  const type = RECORD_TYPES.find((candidate) => candidate.path === path)
  if (!type) throw new NotFoundError('No such page')
  return type
}

// ---- Lists -------------------------------------------------------------------------------------

type ListState = { q: string; sort: string; field: string; op: string; value: string; stage: string; cursor: string; back: string[] }

function listState(query: URLSearchParams): ListState {
  return {
    q: query.get('q')?.trim() ?? '',
    sort: query.get('sort') ?? '',
    field: query.get('field') ?? '',
    op: query.get('op') ?? 'contains',
    value: query.get('value') ?? '',
    stage: query.get('stage') ?? '',
    cursor: query.get('cursor') ?? '',
    // The cursors of the pages before this one, oldest first; `.` (not in a cursor's alphabet) is the first page.
    back: (query.get('back') ?? '')
      .split(',')
      .filter(Boolean)
      .map((cursor) => (cursor === FIRST_PAGE ? '' : cursor)),
  }
}

/** The page's own query string for a state (links of sort headers and pagers). */
function listHref(type: RecordType, state: ListState, change: Partial<ListState>): string {
  const next = { ...state, ...change }
  const params = new URLSearchParams()
  for (const key of ['q', 'sort', 'field', 'op', 'value', 'stage', 'cursor'] as const) if (next[key]) params.set(key, next[key])
  if (!next.field) {
    params.delete('op')
    params.delete('value')
  }
  if (next.back.length) params.set('back', next.back.map((cursor) => cursor || FIRST_PAGE).join(','))
  const text = params.toString()
  return `/${type.path}${text ? `?${text}` : ''}`
}

/** The API's query string: its own filter operators, sort and cursor. */
function apiQuery(state: ListState): string {
  const params = new URLSearchParams({ limit: String(PAGE_SIZE) })
  if (state.q) params.set('q', state.q)
  if (state.sort) params.set('sort', state.sort)
  if (state.cursor) params.set('cursor', state.cursor)
  if (state.field && state.value !== '') params.set(`filter[${state.field}][${state.op}]`, state.value)
  if (state.stage) params.set('filter[stage][eq]', state.stage)
  return params.toString()
}

function filterable(type: RecordType): FieldSpec[] {
  return type.fields.filter((field) => field.filterable)
}

function sortHeader(type: RecordType, state: ListState, field: string, label: string): SafeHtml {
  const ascending = state.sort === field
  const descending = state.sort === `-${field}`
  const sort = ascending ? `-${field}` : field
  const current = ascending ? 'ascending' : descending ? 'descending' : null
  return html`<th scope="col"${current ? html` aria-sort="${current}"` : ''}><a href="${listHref(type, state, { sort, cursor: '', back: [] })}">${label}${
    current ? html`<span aria-hidden="true">${ascending ? ' ↑' : ' ↓'}</span>` : ''
  }<span class="sr-only">, sort ${ascending ? 'descending' : 'ascending'}</span></a></th>`
}

function listFilters(type: RecordType, state: ListState, stages: Stage[]): SafeHtml {
  return html`<form class="filters panel" method="get" action="/${type.path}" role="search">
  <div class="filter-row">
    <div class="field grow"><label for="search">Search</label>
      <input type="search" id="search" name="q" value="${state.q}" maxlength="200"></div>
    ${
      type.name === 'deal'
        ? html`<div class="field"><label for="stage-filter">Stage</label>
      <select id="stage-filter" name="stage"><option value="">Any stage</option>${stages.map(
        (stage) => html`<option value="${stage.key}"${stage.key === state.stage ? html` selected` : ''}>${stage.label}</option>`,
      )}</select></div>`
        : ''
    }
  </div>
  <fieldset class="filter-row">
    <legend>Filter</legend>
    <div class="field"><label for="filter-field">Field</label>
      <select id="filter-field" name="field"><option value="">No filter</option>${filterable(type).map(
        (field) =>
          html`<option value="${field.name}"${field.name === state.field ? html` selected` : ''}>${fieldLabel(field.name)}</option>`,
      )}</select></div>
    <div class="field"><label for="filter-op">Condition</label>
      <select id="filter-op" name="op">${OPERATORS.map(
        (op) => html`<option value="${op.value}"${op.value === state.op ? html` selected` : ''}>${op.label}</option>`,
      )}</select></div>
    <div class="field grow"><label for="filter-value">Value</label>
      <input type="text" id="filter-value" name="value" value="${state.value}" maxlength="500"></div>
  </fieldset>
  ${state.sort ? html`<input type="hidden" name="sort" value="${state.sort}">` : ''}
  <div class="actions"><button type="submit">Apply</button> <a href="/${type.path}">Clear</a></div>
</form>`
}

async function renderList(context: PageContext, type: RecordType, error?: string, status = 200): Promise<PageResult> {
  const { query, frame, services, req, res } = context
  const state = listState(query)
  const allowed = await typeGrants(context, type)
  const stages = type.name === 'deal' ? await stagesOf(context) : []
  const answer = await context.attempt(({ api }) =>
    api('GET', state.q ? `/api/${type.path}/search` : `/api/${type.path}`, { query: apiQuery(state) }),
  )
  const rows = answer.ok ? (answer.value as { data: RecordJson[]; next_cursor: string | null }).data : []
  const nextCursor = answer.ok ? (answer.value as { next_cursor: string | null }).next_cursor : null
  const columns = LIST_COLUMNS[type.path]
  const lookups: Lookups = {
    companies: columns.includes('company_id')
      ? await titlesOf(
          context,
          recordTypeOf('companies'),
          rows.map((row) => String(row.company_id ?? '')),
        )
      : new Map(),
    owners: await ownerNames(context),
    stages,
  }
  const first = state.back.length * PAGE_SIZE + 1
  const notice = takeFlash<string>(services.config.appSecret, req, res, 'records')
  const name = heading(type)
  return {
    status: answer.ok ? status : answer.error.status,
    title: name,
    content: html`<div class="page-head">
  <h1>${name}</h1>
  <div class="actions">
    ${allowed.create ? html`<a class="button" href="/${type.path}/new">New ${singular(type)}</a>` : ''}
    ${type.name === 'deal' ? html`<a class="button secondary" href="/deals/board">Board</a>` : ''}
    ${allowed.import ? html`<a class="button secondary" href="/${type.path}/import">Import</a>` : ''}
    ${
      allowed.export
        ? html`<form method="post" action="/${type.path}/export">${hiddenCsrf(frame.csrf)}
      <input type="hidden" name="query" value="${listHref(type, state, { cursor: '', back: [] }).split('?')[1] ?? ''}">
      <button type="submit" class="secondary">Export</button></form>`
        : ''
    }
  </div>
</div>
${notice ? html`<div class="notice success" role="status">${notice}</div>` : ''}
${errorNotice(answer.ok ? error : plainMessage(answer.error))}
${listFilters(type, state, stages)}
<p class="count" role="status">${
      rows.length === 0
        ? `No ${type.path} to show.`
        : `Showing ${type.path} ${first}–${first + rows.length - 1}${state.q ? ` matching “${state.q}”` : ''}.`
    }</p>
${
  rows.length
    ? html`<div class="table-scroll"><table class="records">
  <caption class="sr-only">${name}</caption>
  <thead><tr>${sortHeader(type, state, TITLE_FIELD[type.path], 'Name')}${columns.map((column) =>
    type.byName.get(column)?.sortable
      ? sortHeader(type, state, column, fieldLabel(column))
      : html`<th scope="col">${fieldLabel(column)}</th>`,
  )}</tr></thead>
  <tbody>${rows.map(
    (row) =>
      html`<tr><th scope="row"><a href="/${type.path}/${row.id}">${recordTitle(type, row)}</a></th>${columns.map(
        (column) => html`<td data-label="${fieldLabel(column)}">${display(column, row[column], lookups)}</td>`,
      )}</tr>`,
  )}</tbody>
</table></div>`
    : ''
}
<nav class="pager" aria-label="Pages">
  ${state.cursor || state.back.length ? html`<a href="${listHref(type, state, { cursor: state.back.at(-1) ?? '', back: state.back.slice(0, -1) })}">Previous</a>` : ''}
  ${nextCursor ? html`<a href="${listHref(type, state, { cursor: nextCursor, back: [...state.back, state.cursor] })}">Next</a>` : ''}
</nav>`,
  }
}

export function showList(path: RecordType['path']): PageHandler {
  return (context) => renderList(context, recordTypeOf(path))
}

/**
 * Export: the form posts here and the API's export handler streams the file in the page's
 * transaction, so the session cookie is the credential (the /api/ routes take bearer tokens only)
 * and the browser saves the attachment while the list stays on screen.
 */
export function exportList(path: RecordType['path']): PageHandler {
  return async (context) => {
    const type = recordTypeOf(path)
    const state = listState(new URLSearchParams(context.form.get('query')))
    const filter: Record<string, unknown> = {}
    if (state.field && state.value !== '') filter[state.field] = { [state.op]: state.op === 'in' ? state.value.split(',') : state.value }
    if (state.stage) filter.stage = state.stage
    const body = { format: 'csv', filter, ...(state.sort ? { sort: state.sort } : {}) }
    const answer = await context.attempt(({ api }) => api('POST', `/api/${type.path}/export`, { body }))
    if (!answer.ok) return renderList(context, type, plainMessage(answer.error), answer.error.status)
    return { sent: true }
  }
}

// ---- One record --------------------------------------------------------------------------------

async function loadRecord(context: PageContext, type: RecordType): Promise<{ record: RecordJson; version: string }> {
  const text = await readRecord(context.db, type, checkId(context.params.id))
  // The same answer as GET /api/{type}/{id} for a record the caller may not see: 404.
  if (text === null) throw new NotFoundError(`No such ${type.label}`)
  return { record: JSON.parse(text) as RecordJson, version: etagOf(text) }
}

type HistoryEntry = {
  id: string
  occurred_at: string
  action: string
  actor: { user_id: string | null; name: string | null; via: string }
  changes: Record<string, { from?: unknown; to?: unknown; added?: string[]; removed?: string[] }>
}

function changeValue(value: unknown): string {
  if (value === null || value === undefined) return '—'
  if (Array.isArray(value)) return value.length ? value.join(', ') : '—'
  return typeof value === 'object' ? JSON.stringify(value) : String(value)
}

/** `custom_fields.tier` -> `Tier`, `associations.companies` -> `Linked companies`, `first_name` -> `First name`. */
function historyFieldLabel(field: string): string {
  if (field.startsWith('associations.')) return `Linked ${field.slice('associations.'.length)}`
  return fieldLabel(field.replace(/^custom_fields\./, ''))
}

function historySection(
  type: RecordType,
  id: string,
  entries: HistoryEntry[],
  next: string | null,
  cursor: string,
  lookups: Lookups,
): SafeHtml {
  // An old or new value reads like the field on the page: a member's name, a stage's label, a time.
  const shown = (field: string, value: unknown) =>
    field.startsWith('custom_fields.') || value === null || value === undefined ? changeValue(value) : display(field, value, lookups)
  const rows = entries.flatMap((entry) => {
    const changes = Object.entries(entry.changes ?? {})
    const who = html`<td>${entry.actor.name ?? 'System'}</td><td>${when(entry.occurred_at)}</td><td>${entry.actor.via}</td>`
    if (changes.length === 0) return [html`<tr><td>${entry.action}</td><td>—</td><td>—</td>${who}</tr>`]
    return changes.map(
      ([field, change]) =>
        html`<tr><td>${historyFieldLabel(field)}${entry.action === 'updated' ? '' : html` <span class="tag">${entry.action}</span>`}</td>
<td>${'added' in change || 'removed' in change ? `removed: ${changeValue(change.removed)}` : shown(field, change.from)}</td>
<td>${'added' in change || 'removed' in change ? `added: ${changeValue(change.added)}` : shown(field, change.to)}</td>${who}</tr>`,
    )
  })
  return html`<section aria-labelledby="history-heading">
  <h2 id="history-heading">History</h2>
  ${
    rows.length
      ? html`<div class="table-scroll"><table class="history">
    <thead><tr><th scope="col">Field</th><th scope="col">Old value</th><th scope="col">New value</th><th scope="col">Who</th><th scope="col">When</th><th scope="col">Via</th></tr></thead>
    <tbody>${rows}</tbody></table></div>`
      : html`<p class="muted">No changes recorded.</p>`
  }
  <nav class="pager" aria-label="History pages">
    ${cursor ? html`<a href="/${type.path}/${id}#history-heading">Newest changes</a>` : ''}
    ${next ? html`<a href="/${type.path}/${id}?history=${encodeURIComponent(next)}#history-heading">Older changes</a>` : ''}
  </nav>
</section>`
}

async function associationsSection(context: PageContext, type: RecordType, id: string, mayUpdate: boolean): Promise<SafeHtml> {
  const linked = (
    (await context.api('GET', `/api/associations/${type.path}/:id`, { params: { id } })) as { data: Record<string, string[]> }
  ).data
  const groups = await Promise.all(
    Object.entries(linked).map(async ([path, ids]) => ({
      other: recordTypeOf(path),
      ids,
      titles: await titlesOf(context, recordTypeOf(path), ids),
    })),
  )
  return html`<section aria-labelledby="links-heading">
  <h2 id="links-heading">Associations</h2>
  <div class="two-col">${groups.map(
    ({ other, ids, titles }) =>
      html`<div><h3>${heading(other)}</h3>${
        ids.length
          ? html`<ul class="people">${ids.map(
              (linkedId) =>
                html`<li><a href="/${other.path}/${linkedId}">${titles.get(linkedId) ?? linkedId}</a>${
                  mayUpdate
                    ? html`<form method="post" action="/${type.path}/${id}/associations">${hiddenCsrf(context.frame.csrf)}
              <input type="hidden" name="type" value="${other.path}"><input type="hidden" name="remove" value="${linkedId}">
              <button type="submit" class="secondary small" aria-label="Unlink ${titles.get(linkedId) ?? linkedId}">Unlink</button></form>`
                    : ''
                }</li>`,
            )}</ul>`
          : html`<p class="muted">None.</p>`
      }</div>`,
  )}</div>
  ${
    mayUpdate
      ? html`<form class="inline" method="post" action="/${type.path}/${id}/associations">${hiddenCsrf(context.frame.csrf)}
    <label for="link-type">Link a</label>
    <select id="link-type" name="type">${groups.map(({ other }) => html`<option value="${other.path}">${other.label}</option>`)}</select>
    <label for="link-id">with id</label>
    <input type="text" id="link-id" name="add" required pattern="[0-9a-fA-F\\-]{36}" spellcheck="false">
    <button type="submit" class="secondary small">Link</button>
  </form>`
      : ''
  }
</section>`
}

async function renderRecord(context: PageContext, type: RecordType, error?: string, status = 200): Promise<PageResult> {
  const { record } = await loadRecord(context, type)
  const id = record.id
  const cursor = context.query.get('history') ?? ''
  const history = (await context.api('GET', `/api/${type.path}/:id/history`, {
    params: { id },
    query: new URLSearchParams({ limit: '20', ...(cursor ? { cursor } : {}) }).toString(),
  })) as { data: HistoryEntry[]; next_cursor: string | null }
  const [mayUpdate, mayDelete] = [await permits(context, type, record, 'update'), await permits(context, type, record, 'delete')]
  const lookups: Lookups = {
    companies: await titlesOf(context, recordTypeOf('companies'), [String(record.company_id ?? '')]),
    owners: await ownerNames(context),
    stages: type.name === 'deal' ? await stagesOf(context) : [],
  }
  const shown = type.fields.filter((field) => field.name !== 'id' && field.name !== 'custom_fields')
  const custom = Object.entries((record.custom_fields ?? {}) as Record<string, unknown>)
  const title = recordTitle(type, record)
  const notice = takeFlash<string>(context.services.config.appSecret, context.req, context.res, 'records')
  return {
    status,
    title,
    content: html`<p class="crumbs"><a href="/${type.path}">${heading(type)}</a></p>
<div class="page-head">
  <h1>${title}</h1>
  <div class="actions">
    ${mayUpdate ? html`<a class="button" href="/${type.path}/${id}/edit">Edit</a>` : ''}
    ${mayDelete ? html`<a class="button danger" href="/${type.path}/${id}/delete">Delete</a>` : ''}
  </div>
</div>
${notice ? html`<div class="notice success" role="status">${notice}</div>` : ''}
${errorNotice(error)}
<section class="panel" aria-labelledby="fields-heading">
  <h2 id="fields-heading" class="sr-only">Fields</h2>
  <dl class="stats record">${shown.map((field) => html`<dt>${fieldLabel(field.name)}</dt><dd>${display(field.name, record[field.name], lookups)}</dd>`)}</dl>
  ${
    custom.length
      ? html`<h3 class="spaced">Custom fields</h3><dl class="stats record">${custom.map(([key, value]) => html`<dt>${key}</dt><dd>${changeValue(value)}</dd>`)}</dl>`
      : ''
  }
</section>
${await associationsSection(context, type, id, mayUpdate)}
${historySection(type, id, history.data, history.next_cursor, cursor, lookups)}`,
  }
}

export function showRecord(path: RecordType['path']): PageHandler {
  return (context) => renderRecord(context, recordTypeOf(path))
}

export function changeAssociation(path: RecordType['path']): PageHandler {
  return async (context) => {
    const type = recordTypeOf(path)
    const id = checkId(context.params.id)
    const other = RECORD_TYPES.find((candidate) => candidate.path === context.form.get('type') && candidate !== type)
    if (!other) return renderRecord(context, type, 'Choose the kind of record to link.', 422)
    context.form.expectOnly(['type', 'add', 'remove'])
    const add = context.form.get('add').trim().toLowerCase()
    const remove = context.form.get('remove').trim().toLowerCase()
    // One change a post: the page's forms send either a record to link or one to unlink.
    if ((add === '') === (remove === '')) return renderRecord(context, type, 'Give the id of one record to link or to unlink.', 422)
    const outcome = await context.attempt(async ({ api }) => {
      const current = ((await api('GET', `/api/associations/${type.path}/:id`, { params: { id } })) as { data: Record<string, string[]> })
        .data[other.path]
      if (remove && !current.includes(remove)) throw new ValidationError('That record is not linked to this one')
      const ids = add ? [...current.filter((linked) => linked !== add), add] : current.filter((linked) => linked !== remove)
      await api('PUT', `/api/associations/${type.path}/:id`, { params: { id }, body: { [other.path]: ids } })
    })
    if (!outcome.ok) return renderRecord(context, type, plainMessage(outcome.error), outcome.error.status)
    setFlash(
      context.services.config.appSecret,
      context.req,
      context.res,
      'records',
      add ? `${fieldLabel(other.label)} linked.` : `${fieldLabel(other.label)} unlinked.`,
    )
    return { redirect: `/${type.path}/${id}` }
  }
}

// ---- New and edit forms ------------------------------------------------------------------------

/** The fields a person edits in the form: writable ones; custom fields have their own inputs. */
function editable(type: RecordType): FieldSpec[] {
  return type.fields.filter((field) => field.writable && field.name !== 'custom_fields' && field.name !== 'owner_id')
}

type FormState = {
  values: Record<string, string>
  custom: [string, string][]
  errors: Record<string, string>
  message?: string
  version?: string
  conflict?: RecordJson
}

function asText(value: unknown): string {
  if (value === null || value === undefined) return ''
  return typeof value === 'object' ? JSON.stringify(value) : String(value)
}

function stateOf(type: RecordType, record: RecordJson | null): FormState {
  return {
    values: Object.fromEntries(editable(type).map((field) => [field.name, asText(record?.[field.name])])),
    custom: Object.entries((record?.custom_fields ?? {}) as Record<string, unknown>).map(([key, value]) => [key, asText(value)]),
    errors: {},
  }
}

function stateFromForm(type: RecordType, context: PageContext): FormState {
  const keys = context.form.get('custom_keys').split(',').filter(Boolean)
  const custom: [string, string][] = keys.map((key) => [key, context.form.get(`custom.${key}`)])
  const newKey = context.form.get('new_custom_key').trim()
  if (newKey) custom.push([newKey, context.form.get('new_custom_value')])
  return {
    values: Object.fromEntries(editable(type).map((field) => [field.name, context.form.get(field.name)])),
    custom,
    errors: {},
    version: context.form.get('version'),
  }
}

/** A typed value back to the API's JSON: numbers stay numbers where the field or the old value is one. */
function customValue(text: string, old: unknown): unknown {
  if (text === '') return null
  if (typeof old === 'number' && Number.isFinite(Number(text))) return Number(text)
  if (typeof old === 'boolean' && (text === 'true' || text === 'false')) return text === 'true'
  return text
}

/** The request body: the fields whose text differs from the record's (all filled ones for a new record). */
function bodyOf(type: RecordType, state: FormState, record: RecordJson | null): Record<string, unknown> {
  const body: Record<string, unknown> = {}
  for (const field of editable(type)) {
    const text = state.values[field.name].trim()
    if (record ? text === asText(record[field.name]) : text === '') continue
    body[field.name] = text === '' ? null : field.kind === 'integer' && /^-?\d+$/.test(text) ? Number(text) : text
  }
  const oldCustom = (record?.custom_fields ?? {}) as Record<string, unknown>
  const custom: Record<string, unknown> = {}
  for (const [key, text] of state.custom) if (text !== asText(oldCustom[key])) custom[key] = customValue(text, oldCustom[key])
  if (Object.keys(custom).length) body.custom_fields = custom
  return body
}

function fieldInput(type: RecordType, field: FieldSpec, state: FormState, stages: Stage[], companies: Titles): SafeHtml {
  const id = `field-${field.name}`
  const error = state.errors[field.name]
  const described = error ? html` aria-invalid="true" aria-describedby="${id}-error"` : ''
  const value = state.values[field.name] ?? ''
  const label = fieldLabel(field.name)
  const conflict = state.conflict ? asText(state.conflict[field.name]) : null
  let input: SafeHtml
  if (field.name === 'stage') {
    input = html`<select id="${id}" name="${field.name}"${described}>${type.name === 'deal' && value === '' ? html`<option value="">First stage</option>` : ''}${stages.map(
      (stage) => html`<option value="${stage.key}"${stage.key === value ? html` selected` : ''}>${stage.label}</option>`,
    )}</select>`
  } else if (field.name === 'company_id') {
    const options = [...companies.entries()]
    input = html`<select id="${id}" name="${field.name}"${described}><option value="">No company</option>${options.map(
      ([companyId, name]) => html`<option value="${companyId}"${companyId === value ? html` selected` : ''}>${name}</option>`,
    )}</select>`
  } else if (field.name === 'description') {
    input = html`<textarea id="${id}" name="${field.name}" maxlength="${field.maxLength ?? 10_000}"${described}>${value}</textarea>`
  } else {
    const kind = field.kind === 'date' ? 'date' : field.name === 'email' ? 'email' : 'text'
    const mode = field.kind === 'numeric' ? html` inputmode="decimal"` : field.kind === 'integer' ? html` inputmode="numeric"` : ''
    input = html`<input type="${kind}" id="${id}" name="${field.name}" value="${value}"${field.maxLength ? html` maxlength="${field.maxLength}"` : ''}${mode}${
      field.name === 'name' ? html` required` : ''
    }${described}>`
  }
  return html`<div class="field">
  <label for="${id}">${label}</label>
  ${input}
  ${error ? html`<span class="field-error" id="${id}-error">${error}</span>` : ''}
  ${conflict !== null && conflict !== value ? html`<span class="hint">Saved meanwhile: ${conflict || '(empty)'}</span>` : ''}
</div>`
}

async function renderForm(
  context: PageContext,
  type: RecordType,
  record: RecordJson | null,
  state: FormState,
  status = 200,
): Promise<PageResult> {
  const stages = type.name === 'deal' ? await stagesOf(context) : []
  const companies =
    type.name === 'company'
      ? new Map<string, string>()
      : await (async () => {
          const list = (await context.api('GET', '/api/companies', { query: 'limit=200&sort=name' })) as { data: RecordJson[] }
          const titles: Titles = new Map(list.data.map((company) => [company.id, recordTitle(recordTypeOf('companies'), company)]))
          const current = state.values.company_id
          if (current && !titles.has(current))
            for (const [id, name] of await titlesOf(context, recordTypeOf('companies'), [current])) titles.set(id, name)
          return titles
        })()
  const title = record ? `Edit ${recordTitle(type, record)}` : `New ${singular(type)}`
  const action = record ? `/${type.path}/${record.id}/edit` : `/${type.path}/new`
  return {
    status,
    title,
    content: html`<p class="crumbs"><a href="/${type.path}">${heading(type)}</a>${record ? html` › <a href="/${type.path}/${record.id}">${recordTitle(type, record)}</a>` : ''}</p>
<h1>${title}</h1>
${
  state.conflict
    ? html`<div class="notice error" role="alert"><h2>Someone saved this ${type.label} after you opened it</h2>
<p>Your changes are still in the form and were not saved. The values saved meanwhile are shown under each field that differs. Save again to replace them with yours, or <a href="/${type.path}/${record?.id}">discard your changes</a>.</p></div>`
    : errorNotice(state.message)
}
<form class="stack panel record-form" method="post" action="${action}" novalidate>
  ${hiddenCsrf(context.frame.csrf)}
  ${state.version ? html`<input type="hidden" name="version" value="${state.version}">` : ''}
  ${editable(type).map((field) => fieldInput(type, field, state, stages, companies))}
  <fieldset class="custom">
    <legend>Custom fields</legend>
    <input type="hidden" name="custom_keys" value="${state.custom.map(([key]) => key).join(',')}">
    ${state.custom.map(
      ([key, value]) => html`<div class="field"><label for="custom-${key}">${key}</label>
      <input type="text" id="custom-${key}" name="custom.${key}" value="${value}"${
        state.errors[`custom_fields.${key}`] ? html` aria-invalid="true" aria-describedby="custom-${key}-error"` : ''
      }>${state.errors[`custom_fields.${key}`] ? html`<span class="field-error" id="custom-${key}-error">${state.errors[`custom_fields.${key}`]}</span>` : ''}</div>`,
    )}
    <div class="filter-row">
      <div class="field"><label for="new-custom-key">New custom field name</label>
        <input type="text" id="new-custom-key" name="new_custom_key" maxlength="63" spellcheck="false"${
          state.errors.custom_fields ? html` aria-invalid="true" aria-describedby="custom-fields-error"` : ''
        }></div>
      <div class="field grow"><label for="new-custom-value">Its value</label>
        <input type="text" id="new-custom-value" name="new_custom_value"></div>
    </div>
    ${state.errors.custom_fields ? html`<span class="field-error" id="custom-fields-error">${state.errors.custom_fields}</span>` : ''}
  </fieldset>
  <div class="actions"><button type="submit">Save</button> <a href="${record ? `/${type.path}/${record.id}` : `/${type.path}`}">Cancel</a></div>
</form>`,
  }
}

/** The API's per-field messages, keyed by field (`custom_fields.<key>` for a custom field). */
function fieldErrors(error: ApiError): Record<string, string> {
  const errors: Record<string, string> = {}
  for (const problem of error.errors ?? []) {
    const [first, second] = problem.pointer.split('/').slice(1)
    const key = first === 'custom_fields' && second ? `custom_fields.${second}` : (first ?? '')
    if (key && !errors[key]) errors[key] = sentence(problem.message)
  }
  return errors
}

function sentence(text: string): string {
  const trimmed = text.trim()
  const capital = trimmed.charAt(0).toUpperCase() + trimmed.slice(1)
  return /[.!?]$/.test(capital) ? capital : `${capital}.`
}

function plainMessage(error: ApiError): string {
  return sentence(error.message)
}

export function showNewForm(path: RecordType['path']): PageHandler {
  return async (context) => {
    const type = recordTypeOf(path)
    return renderForm(context, type, null, stateOf(type, null))
  }
}

export function createFromForm(path: RecordType['path']): PageHandler {
  return async (context) => {
    const type = recordTypeOf(path)
    const state = stateFromForm(type, context)
    const outcome = await context.attempt(({ api }) => api('POST', `/api/${type.path}`, { body: bodyOf(type, state, null) }))
    if (!outcome.ok) return renderForm(context, type, null, refused(state, outcome.error), outcome.error.status)
    const created = (outcome.value as { data: RecordJson }).data
    setFlash(context.services.config.appSecret, context.req, context.res, 'records', `${fieldLabel(type.label)} created.`)
    return { redirect: `/${type.path}/${created.id}` }
  }
}

function refused(state: FormState, error: ApiError): FormState {
  const errors = fieldErrors(error)
  const unplaced = Object.keys(errors).length === 0
  return { ...state, errors, message: unplaced ? plainMessage(error) : 'Check the fields marked below.' }
}

export function showEditForm(path: RecordType['path']): PageHandler {
  return async (context) => {
    const type = recordTypeOf(path)
    const { record, version } = await loadRecord(context, type)
    if (!(await permits(context, type, record, 'update'))) throw new NotFoundError(`No such ${type.label}`)
    return renderForm(context, type, record, { ...stateOf(type, record), version })
  }
}

export function updateFromForm(path: RecordType['path']): PageHandler {
  return async (context) => {
    const type = recordTypeOf(path)
    const state = stateFromForm(type, context)
    const { record, version } = await loadRecord(context, type)
    // Saved over a newer version: the API's If-Match would answer 412; the form keeps what was typed.
    if (state.version && state.version !== version) return renderForm(context, type, record, { ...state, version, conflict: record }, 412)
    const outcome = await context.attempt(({ api }) =>
      api('PATCH', `/api/${type.path}/:id`, {
        params: { id: record.id },
        body: bodyOf(type, state, record),
        headers: state.version ? { 'if-match': state.version } : {},
      }),
    )
    if (!outcome.ok) {
      if (outcome.error.status === 412) {
        const latest = await loadRecord(context, type)
        return renderForm(context, type, latest.record, { ...state, version: latest.version, conflict: latest.record }, 412)
      }
      return renderForm(context, type, record, refused(state, outcome.error), outcome.error.status)
    }
    setFlash(context.services.config.appSecret, context.req, context.res, 'records', 'Changes saved.')
    return { redirect: `/${type.path}/${record.id}` }
  }
}

// ---- Delete ------------------------------------------------------------------------------------

export function confirmDelete(path: RecordType['path']): PageHandler {
  return async (context) => {
    const type = recordTypeOf(path)
    const { record } = await loadRecord(context, type)
    if (!(await permits(context, type, record, 'delete'))) throw new NotFoundError(`No such ${type.label}`)
    const title = recordTitle(type, record)
    return {
      title: `Delete ${title}`,
      content: html`<p class="crumbs"><a href="/${type.path}">${heading(type)}</a> › <a href="/${type.path}/${record.id}">${title}</a></p>
<h1>Delete ${title}?</h1>
<div class="panel">
  <p>The ${type.label} leaves every list and search; its history stays readable to admins.</p>
  <form class="actions" method="post" action="/${type.path}/${record.id}/delete">
    ${hiddenCsrf(context.frame.csrf)}
    <button type="submit" class="danger">Delete ${type.label}</button>
    <a href="/${type.path}/${record.id}">Keep it</a>
  </form>
</div>`,
    }
  }
}

export function deleteFromForm(path: RecordType['path']): PageHandler {
  return async (context) => {
    const type = recordTypeOf(path)
    const id = checkId(context.params.id)
    const outcome = await context.attempt(({ api }) => api('DELETE', `/api/${type.path}/:id`, { params: { id } }))
    if (!outcome.ok) return renderRecord(context, type, plainMessage(outcome.error), outcome.error.status)
    setFlash(context.services.config.appSecret, context.req, context.res, 'records', `${fieldLabel(type.label)} deleted.`)
    return { redirect: `/${type.path}` }
  }
}
