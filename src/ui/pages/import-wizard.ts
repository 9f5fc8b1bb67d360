// The import wizard (/{type}/import): upload a CSV file, edit the suggested mapping (a menu per
// column), a dry run with its errors, the import with its progress (the page refreshes itself while
// the job runs), the errors.csv of the rows that failed, and the past imports. Every step is the
// API's own import route under the signed-in user (docs/api.md section 6), so the grants, the plan
// and the checks are theirs.
import Type from 'typebox'
import { sql } from '../../db/pool.ts'
import { rowType } from '../../db/typed-rows.ts'
import { ApiError } from '../../http/problem.ts'
import { CUSTOM_FIELD_KEY, CUSTOM_FIELD_PREFIX, IMPORT_TYPES, IMPORTABLE_FIELDS, type ImportType } from '../../imports/suggest-mapping.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf, when } from '../layout.ts'
import { describeRefusal, type PageContext, type PageHandler, type PageResult } from '../page-context.ts'
import { fieldLabel, recordTypeOf, typeGrants } from './records.ts'

type Job = {
  id: string
  status: string
  dry_run: boolean
  file_name: string | null
  counts: { total: number; created: number; updated: number; skipped: number; failed: number; companies_created: number }
  failure: string | null
  created_at: string
  finished_at: string | null
  errors?: { row: number; column: string | null; field: string | null; message: string }[]
}

const UploadRow = rowType(
  Type.Object({
    columns: Type.Array(Type.String()),
    suggested_mapping: Type.Record(Type.String(), Type.Union([Type.String(), Type.Null()])),
    mapping: Type.Union([Type.Record(Type.String(), Type.Union([Type.String(), Type.Null()])), Type.Null()]),
    row_count: Type.Integer(),
  }),
)

function importType(params: Record<string, string>): ImportType {
  const type = IMPORT_TYPES.find((candidate) => candidate === params.type)
  if (!type) throw new ApiError(404, 'not_found', 'Not found', 'No such page.')
  return type
}

function importId(params: Record<string, string>): string {
  if (!UUID_PATTERN.test(params.id ?? '')) throw new ApiError(404, 'not_found', 'Not found', 'No such import.')
  return params.id.toLowerCase()
}

/** A column's choices: ignore, each field, a custom field named after the column, or the custom_fields JSON. */
function choicesFor(type: ImportType, column: string): { value: string; label: string }[] {
  const key = column
    .trim()
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '_')
    .replace(/^[^a-z]+|_+$/g, '')
    .slice(0, 63)
  return [
    { value: '', label: 'Ignore' },
    ...IMPORTABLE_FIELDS[type].map((field) => ({ value: field, label: field === 'custom_fields' ? 'custom_fields (JSON object)' : field })),
    ...(CUSTOM_FIELD_KEY.test(key) ? [{ value: `${CUSTOM_FIELD_PREFIX}${key}`, label: `Custom field ${key}` }] : []),
  ]
}

const PAST_IMPORTS_PER_PAGE = 20

/** A page of the past imports, newest first, with links to the older ones and back to the newest. */
function pastImports(type: ImportType, jobs: Job[], paging: { older: string | null; paged: boolean }): SafeHtml {
  const links =
    paging.paged || paging.older
      ? html`<nav class="pager" aria-label="Past imports pages">${paging.paged ? html`<a href="/${type}/import">Newest imports</a>` : ''}
  ${paging.older ? html`<a href="/${type}/import?${new URLSearchParams({ cursor: paging.older }).toString()}">Older imports</a>` : ''}</nav>`
      : ''
  if (jobs.length === 0) return html`<p class="muted">${paging.paged ? 'No older imports.' : 'No imports yet.'}</p>${links}`
  return html`<div class="table-scroll" tabindex="0" role="region" aria-label="Past imports"><table>
  <thead><tr><th scope="col">File</th><th scope="col">Status</th><th scope="col">Rows</th><th scope="col">Failed</th><th scope="col">Started</th></tr></thead>
  <tbody>${jobs.map(
    (job) => html`<tr>
    <td><a href="/${type}/import/${job.id}">${job.file_name ?? 'Untitled file'}</a></td>
    <td>${job.dry_run ? `${job.status} (dry run)` : job.status}</td>
    <td>${job.counts.total}</td>
    <td>${job.counts.failed}</td>
    <td>${when(job.created_at)}</td>
  </tr>`,
  )}</tbody>
</table></div>${links}`
}

async function renderStart(context: PageContext, type: ImportType, error?: string, status = 200): Promise<PageResult> {
  // A role without the import grant gets no form whose upload would only be refused (the route still decides).
  if (!(await typeGrants(context, recordTypeOf(type))).import) {
    return {
      status: 403,
      title: `Import ${fieldLabel(type).toLowerCase()}`,
      content: html`<h1>Import ${fieldLabel(type).toLowerCase()}</h1>
<p class="lead"><a href="/${type}">Back to ${fieldLabel(type)}</a></p>
<p role="alert">Your role does not allow importing ${fieldLabel(type).toLowerCase()}. An admin of this workspace can grant it.</p>`,
    }
  }
  // The cursor comes from the page's own "Older imports" link; one the API refuses (edited by hand,
  // or from another list) is said on the page, with the newest imports in its place.
  const cursor = context.query.get('cursor') ?? ''
  const pageOf = (after: string) => ({
    query: new URLSearchParams({ limit: String(PAST_IMPORTS_PER_PAGE), ...(after && { cursor: after }) }).toString(),
  })
  const listed = await context.attempt((scope) => scope.api('GET', `/api/${type}/import`, pageOf(cursor)))
  if (!listed.ok && listed.error.status !== 400) throw listed.error
  const refusal = listed.ok ? undefined : describeRefusal(listed.error, { cursor: 'the link to older imports' })
  const past = (listed.ok ? listed.value : await context.api('GET', `/api/${type}/import`, pageOf(''))) as {
    data: Job[]
    next_cursor: string | null
  }
  const paging = { older: past.next_cursor, paged: listed.ok && cursor !== '' }
  return {
    status: refusal && status === 200 ? 400 : status,
    title: `Import ${fieldLabel(type).toLowerCase()}`,
    content: html`<h1>Import ${fieldLabel(type).toLowerCase()}</h1>
<p class="lead"><a href="/${type}">Back to ${fieldLabel(type)}</a></p>
${errorNotice(error ?? refusal)}
<section class="panel" aria-labelledby="upload-heading">
  <h2 id="upload-heading">1. Upload a CSV file</h2>
  <form class="stack" method="post" action="/${type}/import?${new URLSearchParams({ csrf: context.frame.csrf }).toString()}" enctype="multipart/form-data">
    <div class="field">
      <label for="import-file">CSV file</label>
      <input type="file" id="import-file" name="file" accept=".csv,text/csv" required aria-describedby="import-file-hint">
      <span class="hint" id="import-file-hint">UTF-8, with a header row; comma, semicolon or tab separated; up to 50 MiB.</span>
    </div>
    <div class="actions"><button type="submit">Upload</button></div>
  </form>
</section>
<section aria-labelledby="past-heading">
  <h2 id="past-heading">Past imports</h2>
  ${pastImports(type, past.data, paging)}
</section>`,
  }
}

export const showImports: PageHandler = (context) => renderStart(context, importType(context.params))

export const uploadImport: PageHandler = async (context) => {
  const type = importType(context.params)
  const uploaded = await context.attempt((scope) => scope.api('POST', `/api/${type}/import/upload`, { file: context.bodyFile }))
  if (!uploaded.ok) return renderStart(context, type, describeRefusal(uploaded.error, { file: 'the file' }), uploaded.error.status)
  return { redirect: `/${type}/import/${(uploaded.value.data as { id: string }).id}` }
}

function mappingForm(
  context: PageContext,
  type: ImportType,
  id: string,
  upload: { columns: string[]; mapping: Record<string, string | null> },
): SafeHtml {
  return html`<section class="panel" aria-labelledby="mapping-heading">
  <h2 id="mapping-heading">2. Map the columns</h2>
  <form method="post" action="/${type}/import/${id}">
    ${hiddenCsrf(context.frame.csrf)}
    <div class="table-scroll" tabindex="0" role="region" aria-label="Column mapping"><table>
      <thead><tr><th scope="col">Column of the file</th><th scope="col">Imported as</th></tr></thead>
      <tbody>${upload.columns.map((column, index) => {
        const chosen = upload.mapping[column] ?? ''
        return html`<tr><td>${column}</td><td>
          <label class="visually-hidden" for="map-${index}">Field for column ${column}</label>
          <select id="map-${index}" name="map_${index}">${choicesFor(type, column).map(
            (choice) => html`<option value="${choice.value}"${choice.value === chosen ? html` selected` : ''}>${choice.label}</option>`,
          )}</select></td></tr>`
      })}</tbody>
    </table></div>
    <div class="actions">
      <button type="submit" name="dry_run" value="true" class="secondary">Dry run</button>
      <button type="submit" name="dry_run" value="false">Import</button>
    </div>
  </form>
</section>`
}

function errorsTable(type: ImportType, job: Job): SafeHtml {
  if (job.counts.failed === 0) return html``
  return html`<h3>Rows with errors</h3>
<div class="table-scroll" tabindex="0" role="region" aria-label="Rows with errors"><table>
  <thead><tr><th scope="col">Row</th><th scope="col">Column</th><th scope="col">Message</th></tr></thead>
  <tbody>${(job.errors ?? []).map((error) => html`<tr><td>${error.row}</td><td>${error.column ?? '—'}</td><td>${error.message}</td></tr>`)}</tbody>
</table></div>
<p><a href="/${type}/import/${job.id}/errors.csv" download>Download errors.csv</a> (every failed row with its error)</p>`
}

/** The file's columns and mappings (the imports policies decide who sees it). */
async function readUpload(context: PageContext, type: ImportType, id: string) {
  const upload = await context.db.maybeOne(sql.type(UploadRow)`
    select columns, suggested_mapping, mapping, row_count from crm.imports
     where workspace_id = (select crm.current_workspace_id()) and id = ${id} and record_type = ${type}`)
  if (!upload) throw new ApiError(404, 'not_found', 'Not found', 'No such import.')
  return upload
}

async function renderJob(context: PageContext, type: ImportType, id: string, error?: string, status = 200): Promise<PageResult> {
  const upload = await readUpload(context, type, id)
  const job = (await context.api('GET', `/api/${type}/import/:id`, { params: { id } })).data as Job
  const running = job.status === 'queued' || job.status === 'processing'
  const done = job.counts.created + job.counts.updated + job.counts.skipped + job.counts.failed
  const mayStart = job.status === 'uploaded' || (!running && job.dry_run)
  return {
    status,
    title: `Import ${fieldLabel(type).toLowerCase()}`,
    content: html`<h1>Import ${fieldLabel(type).toLowerCase()}: ${job.file_name ?? 'Untitled file'}</h1>
<p class="lead"><a href="/${type}/import">All imports</a> · ${upload.row_count} rows</p>
${errorNotice(error)}
${mayStart ? mappingForm(context, type, id, { columns: upload.columns, mapping: upload.mapping ?? upload.suggested_mapping }) : ''}
${
  job.status === 'uploaded'
    ? ''
    : html`<section class="panel" aria-labelledby="job-heading">
  <h2 id="job-heading">${job.dry_run ? '3. Dry run' : '4. Import'}: ${running ? 'running' : job.status}</h2>
  ${
    running
      ? html`<meta http-equiv="refresh" content="1">
  <p><label for="import-progress">Rows checked</label> <progress id="import-progress" max="${upload.row_count}" value="${done}">${done} of ${upload.row_count}</progress> ${done} of ${upload.row_count}</p>
  <p>This page refreshes itself until the job ends. <a href="/${type}/import/${id}">Reload</a></p>`
      : html`<div role="status"><dl class="stats">
    <dt>Rows</dt><dd>${job.counts.total}</dd>
    <dt>${job.dry_run ? 'Would be created' : 'Created'}</dt><dd>${job.counts.created}</dd>
    <dt>${job.dry_run ? 'Would be updated' : 'Updated'}</dt><dd>${job.counts.updated}</dd>
    <dt>Failed</dt><dd>${job.counts.failed}</dd>
  </dl></div>
  ${job.failure ? html`<div class="notice error" role="alert">${job.failure}</div>` : ''}
  ${errorsTable(type, job)}`
  }
</section>`
}`,
  }
}

export const showImport: PageHandler = (context) => renderJob(context, importType(context.params), importId(context.params))

export const startImport: PageHandler = async (context) => {
  const type = importType(context.params)
  const id = importId(context.params)
  const upload = await readUpload(context, type, id)
  // A menu per column of the file, and the button pressed: nothing else is the wizard's form.
  context.form.expectOnly([...upload.columns.map((_, index) => `map_${index}`), 'dry_run'])
  const dryRun = context.form.get('dry_run')
  if (dryRun !== 'true' && dryRun !== 'false') return renderJob(context, type, id, 'Choose Dry run or Import.', 422)
  const mapping = Object.fromEntries(upload.columns.map((column, index) => [column, context.form.get(`map_${index}`) || null]))
  const started = await context.attempt((scope) =>
    scope.api('POST', `/api/${type}/import/:id`, { params: { id }, body: { mapping, dry_run: dryRun === 'true' } }),
  )
  if (!started.ok) return renderJob(context, type, id, describeRefusal(started.error, { mapping: 'the mapping' }), started.error.status)
  return { redirect: `/${type}/import/${id}` }
}

export const downloadErrors: PageHandler = async (context) => {
  const type = importType(context.params)
  await context.api('GET', `/api/${type}/import/:id/errors.csv`, { params: { id: importId(context.params) } })
  return { sent: true }
}
