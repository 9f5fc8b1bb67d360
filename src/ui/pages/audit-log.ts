// The audit log (admins): the entries of GET /api/audit-log with its filters, newest first, a page
// at a time, and the chain's check. Read-only: the database writes every entry.
import { AUDIT_FILTERS, type AuditEntryJson, type AuditVerdictJson } from '../../audit/audit-log.ts'
import { toApiError } from '../../http/problem.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice } from '../layout.ts'
import type { PageHandler } from '../page-context.ts'
import { adminOnly, plainRefusal } from './admin-common.ts'

const FILTER_LABELS: Record<(typeof AUDIT_FILTERS)[number], { label: string; hint: string }> = {
  action: { label: 'Action', hint: 'e.g. member.role_changed' },
  actor_id: { label: 'Actor (user id)', hint: 'a user id' },
  target_type: { label: 'Target type', hint: 'user, role, team, token, webhook…' },
  target_id: { label: 'Target id', hint: 'an id' },
  since: { label: 'Since', hint: '2026-11-01T00:00:00Z' },
  until: { label: 'Until', hint: '2026-12-01T00:00:00Z' },
}

function actorText(entry: AuditEntryJson): string {
  const who = entry.actor.name ?? entry.actor.user_id ?? 'system'
  return `${who} (${entry.actor.via}${entry.actor.ip ? `, ${entry.actor.ip}` : ''})`
}

function entryRow(entry: AuditEntryJson): SafeHtml {
  return html`<tr>
    <td><time datetime="${entry.occurred_at}">${entry.occurred_at.replace('T', ' ').replace(/\.\d+Z$/, ' UTC')}</time></td>
    <td><code>${entry.action}</code></td>
    <td>${actorText(entry)}</td>
    <td>${entry.target.type}${entry.target.id ? html` <code class="muted">${entry.target.id}</code>` : ''}</td>
    <td><code>${JSON.stringify(entry.details)}</code></td>
  </tr>`
}

export const showAuditLog: PageHandler = async (context) => {
  const denied = adminOnly(context, 'Audit log', 'the audit log')
  if (denied) return denied
  const { api, query } = context
  // Only the filters with a value and the cursor go to the API; an empty field means no filter.
  const forwarded = new URLSearchParams()
  for (const name of [...AUDIT_FILTERS, 'cursor']) {
    const value = query.get(name)?.trim()
    if (value) forwarded.set(name, value)
  }
  let entries: AuditEntryJson[] = []
  let next: string | null = null
  let error: string | undefined
  try {
    const page = await api('GET', '/api/audit-log', { query: forwarded.toString() })
    entries = page.data
    next = page.next_cursor
  } catch (failure) {
    // A filter the API refuses (400) is said on the page; anything else is the page's error.
    const refusal = toApiError(failure)
    if (refusal.status !== 400) throw failure
    error = plainRefusal(refusal)
  }
  const verdict = (await api('GET', '/api/audit-log/verify')) as AuditVerdictJson
  const nextQuery = new URLSearchParams(forwarded)
  if (next) nextQuery.set('cursor', next)
  return {
    status: error ? 400 : 200,
    title: 'Audit log',
    content: html`<h1>Audit log</h1>
<p class="lead">Every change to who may do what in this workspace, written by the database in the same transaction as the change.</p>
<div class="notice ${verdict.intact ? 'success' : 'error'}" role="status" id="chain">${
      verdict.intact
        ? `The chain of ${verdict.entries} entries is intact.`
        : `The chain is broken at entry ${verdict.first_bad_id ?? '(removed)'}: an entry was changed or removed outside the service.`
    }</div>
${errorNotice(error)}
<section class="panel" aria-labelledby="filters-heading">
  <h2 id="filters-heading">Filters</h2>
  <form class="filters" method="get" action="/audit-log">
    ${AUDIT_FILTERS.map(
      (name) => html`<div class="field">
      <label for="filter-${name}">${FILTER_LABELS[name].label}</label>
      <input type="text" id="filter-${name}" name="${name}" value="${query.get(name) ?? ''}" placeholder="${FILTER_LABELS[name].hint}" maxlength="64">
    </div>`,
    )}
    <div class="actions"><button type="submit">Show</button></div>
  </form>
</section>
<section aria-labelledby="entries-heading">
  <h2 id="entries-heading">Entries, newest first</h2>
  ${
    entries.length
      ? html`<div class="table-scroll" tabindex="0" role="region" aria-label="Audit log entries"><table class="audit-log">
    <thead><tr><th scope="col">When</th><th scope="col">Action</th><th scope="col">Actor</th><th scope="col">Target</th><th scope="col">Details</th></tr></thead>
    <tbody>${entries.map(entryRow)}</tbody>
  </table></div>`
      : html`<p class="muted">No entries.</p>`
  }
  ${next ? html`<p><a href="/audit-log?${nextQuery.toString()}" rel="next">Older entries</a></p>` : ''}
</section>`,
  }
}
