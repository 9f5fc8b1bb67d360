// The deal board (/deals/board): a column per stage of the workspace, a card per deal the caller
// may view, the first BOARD_COLUMN_SIZE of each stage by amount and a link to the rest. A card moves
// by its own form (a stage <select> and Move, so keyboards and browsers without JavaScript can) or by
// drag, which only submits that same form (src/ui/board.js). The form runs the API's PATCH with the
// version the card was shown at as If-Match: a stage change is a deal.updated like any other, a stale
// card is reported as a conflict, and row-level security refuses a caller who may not update.
import Type from 'typebox'
import { sql } from '../../db/pool.ts'
import { rowType } from '../../db/typed-rows.ts'
import { ApiError } from '../../http/problem.ts'
import { DEAL } from '../../records/fields.ts'
import { etagOf } from '../../records/operations.ts'
import { ownerWithinGrant } from '../../records/owner-scope.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf } from '../layout.ts'
import type { PageContext, PageHandler, PageResult } from '../page-context.ts'

/** Cards shown per column; the column's "more" link opens the list filtered on its stage. */
export const BOARD_COLUMN_SIZE = 25

type Stage = { key: string; label: string; position: number; is_closed: boolean; is_won: boolean }
type Deal = { id: string; name: string; amount: string | null; currency: string; stage: string; company_id: string | null }

// Per shown card: the ETag its PATCH must match (the text GET /api/deals/{id} hashes), the company's
// name when the caller may see it, and whether the role's update grant reaches the deal's owner
// (the condition of the deals_update_scoped policy, which still decides on the write).
const CardFactsRow = rowType(
  Type.Object({
    id: Type.String(),
    record: Type.String(),
    company_name: Type.Union([Type.String(), Type.Null()]),
    may_update: Type.Boolean(),
  }),
)

type CardFacts = { version: string; companyName: string | null; mayUpdate: boolean }

async function cardFacts(context: PageContext, ids: string[]): Promise<Map<string, CardFacts>> {
  if (ids.length === 0) return new Map()
  const rows = await context.db.any(sql.type(CardFactsRow)`
    select t.id, ${DEAL.jsonFunction}(t)::text as record, c.name as company_name,
           ${ownerWithinGrant('deals', 'update', sql.fragment`t.owner_id`)} as may_update
      from crm.deals t
      left join crm.companies c on c.workspace_id = t.workspace_id and c.id = t.company_id
     where t.id = any (${sql.array(ids, 'uuid')})`)
  return new Map(rows.map((row) => [row.id, { version: etagOf(row.record), companyName: row.company_name, mayUpdate: row.may_update }]))
}

function amountOf(deal: Deal): string {
  if (deal.amount === null) return 'No amount'
  const [whole, cents] = deal.amount.split('.')
  return `${deal.currency} ${whole.replace(/\B(?=(\d{3})+(?!\d))/g, ',')}${cents ? `.${cents}` : ''}`
}

function card(deal: Deal, facts: CardFacts | undefined, stages: Stage[], csrf: string): SafeHtml {
  const headingId = `deal-${deal.id}`
  const selectId = `stage-${deal.id}`
  const controls =
    facts?.mayUpdate === true
      ? html`<form class="move" method="post" action="/deals/board/${deal.id}/move">
      ${hiddenCsrf(csrf)}
      <input type="hidden" name="version" value="${facts.version}">
      <label for="${selectId}">Stage of ${deal.name}</label>
      <select id="${selectId}" name="stage">
        ${stages.map((stage) => html`<option value="${stage.key}"${stage.key === deal.stage ? html` selected` : ''}>${stage.label}</option>`)}
      </select>
      <button type="submit" class="small secondary" aria-label="Move ${deal.name}">Move</button>
    </form>`
      : html``
  return html`<li class="deal-card" data-deal="${deal.id}" aria-labelledby="${headingId}">
    <h3 id="${headingId}"><a href="/deals/${deal.id}">${deal.name}</a></h3>
    <p class="amount">${amountOf(deal)}</p>
    <p class="company">${facts?.companyName ?? (deal.company_id ? 'A company you cannot see' : 'No company')}</p>
    ${controls}
  </li>`
}

async function render(context: PageContext, error?: string, status = 200): Promise<PageResult> {
  const { api, frame } = context
  const stages = (await api('GET', '/api/deal-stages')).data as Stage[]
  // One after the other: the page's queries share its transaction's connection.
  const columns: { stage: Stage; deals: Deal[]; more: boolean }[] = []
  for (const stage of stages) {
    const query = new URLSearchParams({ 'filter[stage]': stage.key, sort: '-amount', limit: String(BOARD_COLUMN_SIZE) })
    const page = (await api('GET', '/api/deals', { query: query.toString() })) as { data: Deal[]; next_cursor: string | null }
    columns.push({ stage, deals: page.data, more: page.next_cursor !== null })
  }
  const facts = await cardFacts(
    context,
    columns.flatMap((column) => column.deals.map((deal) => deal.id)),
  )
  const movable = [...facts.values()].some((fact) => fact.mayUpdate)
  return {
    status,
    title: 'Deal board',
    content: html`<h1>Deal board</h1>
<p class="lead"><a href="/deals">All deals as a list</a>${movable ? html` · Move a card with its stage menu and Move button, or drag it to another column.` : ''}</p>
${errorNotice(error)}
<div class="board" tabindex="0" role="region" aria-label="Deals by stage"${movable ? html` data-board` : ''}>
  ${columns.map(
    (column) => html`<section class="board-column" aria-labelledby="column-${column.stage.key}">
    <h2 id="column-${column.stage.key}">${column.stage.label} <span class="count">(${column.deals.length}${column.more ? '+' : ''})</span></h2>
    <ul class="board-cards" data-stage="${column.stage.key}">
      ${column.deals.map((deal) => card(deal, facts.get(deal.id), stages, frame.csrf))}
    </ul>
    ${
      column.more
        ? html`<p><a href="/deals?${new URLSearchParams({ 'filter[stage]': column.stage.key }).toString()}">More ${column.stage.label} deals</a></p>`
        : column.deals.length === 0
          ? html`<p class="muted">No deals</p>`
          : ''
    }
  </section>`,
  )}
</div>
${movable ? html`<script src="/ui/sortable.js" defer></script><script src="/ui/board.js" defer></script>` : ''}`,
  }
}

export const showDealBoard: PageHandler = (context) => render(context)

export const moveDeal: PageHandler = async (context) => {
  const { form, params, attempt } = context
  if (!UUID_PATTERN.test(params.id ?? '')) throw new ApiError(404, 'not_found', 'Not found', 'No such deal.')
  form.expectOnly(['version', 'stage'])
  const version = form.get('version')
  const moved = await attempt((scope) =>
    scope.api('PATCH', '/api/deals/:id', {
      params: { id: params.id.toLowerCase() },
      body: { stage: form.get('stage') },
      // Without a version the move would overwrite whatever changed since the board was shown.
      headers: { 'if-match': version === '' ? '""' : version },
    }),
  )
  if (moved.ok) return { redirect: '/deals/board' }
  if (moved.error.status === 412)
    return render(
      context,
      'This deal changed since the board was shown: it is shown as it is now. Move it again if you still want to.',
      409,
    )
  if (moved.error.status === 422) return render(context, `The deal was not moved: ${moved.error.message}`, 422)
  throw moved.error
}
