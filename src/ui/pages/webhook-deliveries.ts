// A webhook's operations (admins): its delivery log (newest first, filtered by status and event,
// a page at a time), one delivery with the body and headers it was sent with and every attempt,
// Redeliver, a test event, and the recovery of failed deliveries with a confirm step that says how
// many it will send again. Every action is the API's own route handler (src/ui/api-calls.ts).
// Forms that change something post with the CSRF token; the log's filter is a GET form, which
// changes nothing and so carries no token (one in a URL would reach history and logs).
import { ApiError } from '../../http/problem.ts'
import { RECORD_TYPES } from '../../records/fields.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import { DELIVERY_STATUSES, EVENT_NAMES } from '../../webhooks/subscription-schemas.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf, when } from '../layout.ts'
import type { PageContext, PageHandler, PageResult } from '../page-context.ts'
import { setFlash, takeFlash } from '../session.ts'

const BASE = '/api/webhook-subscriptions'

type Subscription = { id: string; name: string; events: string[]; status: 'active' | 'paused' }
type Attempt = {
  attempt: number
  started_at: string
  duration_ms: number
  response_status: number | null
  error: string | null
  response_body_excerpt: string | null
  signature: string | null
}
type Delivery = {
  delivery_id: string
  subscription_id: string
  event: string
  event_id: string
  record_type: string
  record_id: string
  status: string
  attempt_count: number
  next_attempt_at: string | null
  created_at: string
  completed_at: string | null
  test: boolean
  attempts?: Attempt[]
  request_headers?: Record<string, string>
  body?: string | null
}

const STATUS_LABELS: Record<string, string> = {
  pending: 'Pending',
  retrying: 'Retrying',
  delivered: 'Delivered',
  dead: 'Failed',
  held: 'Held',
}

const ERROR_LABELS: Record<string, string> = {
  timeout: 'Timed out',
  connection_refused: 'Connection refused',
  dns_failed: 'Host not found',
  address_refused: 'Address not allowed',
  tls_error: 'TLS error',
  redirect: 'Redirect (not followed)',
  http_status: 'HTTP error status',
}

function idOf(value: string | undefined, what: string): string {
  if (value === undefined || !UUID_PATTERN.test(value)) throw new ApiError(404, 'not_found', 'Not found', `No such ${what}.`)
  return value.toLowerCase()
}

function adminOnly(context: PageContext, title: string): PageResult | null {
  if (context.caller.isAdmin) return null
  return {
    status: 403,
    title,
    content: html`<h1>${title}</h1><div class="notice info" role="status">Only workspace admins manage webhooks.</div>`,
  }
}

const statusBadge = (status: string) => html`<span class="badge ${status}">${STATUS_LABELS[status] ?? status}</span>`
const testTag = (delivery: Delivery) => (delivery.test ? html` <span class="tag">test</span>` : '')

/** The event chooser of a card's "Send test event": the subscription's first event name preselected. */

/** The record an event is about, as a link to its page (a type the UI does not know stays text). */
function recordLink(recordType: string, id: string): SafeHtml {
  const type = RECORD_TYPES.find((candidate) => candidate.name === recordType)
  return type ? html`<a href="/${type.path}/${id}">${recordType} <code>${id}</code></a>` : html`${recordType} <code>${id}</code>`
}

export function testEventField(subscription: { id: string; events: string[] }): SafeHtml {
  const subscribed = EVENT_NAMES.find((event) =>
    subscription.events.some((pattern) => pattern === '*' || pattern === event || pattern === `${event.split('.')[0]}.*`),
  )
  const id = `test-event-${subscription.id}`
  return html`<label for="${id}">Sample to send</label>
      <select id="${id}" name="event">
        ${EVENT_NAMES.map((event) => html`<option value="${event}"${event === subscribed ? html` selected` : ''}>${event}</option>`)}
      </select>`
}

/** A minute in UTC as a datetime-local field shows it: 2026-11-22T03:00. */
const minuteOf = (time: Date) => time.toISOString().slice(0, 16)

/** The date-time field of "Recover failed since…", in UTC; the last 24 hours unless given. */
export function recoverSinceField(subscriptionId: string, value: string | null): SafeHtml {
  const id = `recover-since-${subscriptionId}`
  return html`<label for="${id}">Failed since (UTC)</label>
      <input type="datetime-local" id="${id}" name="since" value="${value ?? minuteOf(new Date(Date.now() - 86_400_000))}" required>`
}

/** A datetime-local value (no zone: the field says UTC) or an RFC 3339 time, as an instant; null when neither. */
function sinceOf(value: string): Date | null {
  const local = /^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d{1,3})?)?$/.test(value)
  if (!local && !/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$/.test(value)) return null
  const time = new Date(local ? `${value.length === 16 ? `${value}:00` : value}Z` : value)
  return Number.isNaN(time.getTime()) ? null : time
}

async function subscriptionOf(context: PageContext, id: string): Promise<Subscription> {
  return (await context.api('GET', `${BASE}/:id`, { params: { id } })).data as Subscription
}

function backLinks(subscription: Subscription, log = false): SafeHtml {
  return html`<p class="crumbs"><a href="/webhooks">Webhooks</a>${
    log ? html` › <a href="/webhooks/${subscription.id}/deliveries">Delivery log of ${subscription.name}</a>` : ''
  }</p>`
}

// ---------------------------------------------------------------------------------------------
// The delivery log
// ---------------------------------------------------------------------------------------------

function filterForm(subscription: Subscription, status: string, event: string): SafeHtml {
  return html`<form class="inline filters" method="get" action="/webhooks/${subscription.id}/deliveries">
  <label for="filter-status">Status</label>
  <select id="filter-status" name="status">
    <option value="">Any status</option>
    ${DELIVERY_STATUSES.map((value) => html`<option value="${value}"${value === status ? html` selected` : ''}>${STATUS_LABELS[value]}</option>`)}
  </select>
  <label for="filter-event">Event</label>
  <select id="filter-event" name="event">
    <option value="">Any event</option>
    ${EVENT_NAMES.map((value) => html`<option value="${value}"${value === event ? html` selected` : ''}>${value}</option>`)}
  </select>
  <button type="submit" class="small secondary">Filter</button>
</form>`
}

export const showDeliveries: PageHandler = async (context) => {
  const refused = adminOnly(context, 'Delivery log')
  if (refused) return refused
  const { api, params, query } = context
  const id = idOf(params.id, 'webhook')
  const subscription = await subscriptionOf(context, id)
  const status = DELIVERY_STATUSES.includes(query.get('status') ?? '') ? (query.get('status') as string) : ''
  const event = EVENT_NAMES.includes(query.get('event') ?? '') ? (query.get('event') as string) : ''
  const cursor = query.get('cursor') ?? ''
  const filters = new URLSearchParams({ ...(status ? { status } : {}), ...(event ? { event } : {}) })
  const apiQuery = new URLSearchParams(filters)
  apiQuery.set('limit', '25')
  if (cursor) apiQuery.set('cursor', cursor)
  const page = (await api('GET', `${BASE}/:id/deliveries`, { params: { id }, query: apiQuery.toString() })) as {
    data: Delivery[]
    next_cursor: string | null
  }
  const recovered = takeFlash<{ count: number }>(context.services.config.appSecret, context.req, context.res, 'webhook-recovered')
  const older = page.next_cursor ? new URLSearchParams(filters) : null
  older?.set('cursor', page.next_cursor!)
  const link = (delivery: Delivery) => `/webhooks/${id}/deliveries/${delivery.delivery_id}`
  return {
    title: `Delivery log · ${subscription.name}`,
    content: html`${backLinks(subscription)}
<h1>Delivery log of ${subscription.name}</h1>
<p class="lead">Newest first. Deliveries are kept 30 days.${subscription.status === 'paused' ? ' This webhook is paused: new deliveries are held until it is resumed.' : ''}</p>
${
  recovered
    ? html`<div class="notice success" role="status">${recovered.count === 1 ? '1 failed delivery is' : `${recovered.count} failed deliveries are`} being sent again${subscription.status === 'paused' ? ' once the webhook is resumed' : ''}.</div>`
    : ''
}
${filterForm(subscription, status, event)}
${
  page.data.length === 0
    ? html`<p class="muted">${status || event || cursor ? 'No deliveries match.' : 'No deliveries yet.'}</p>`
    : html`<div class="table-scroll"><table class="deliveries">
  <thead><tr><th scope="col">Created</th><th scope="col">Event</th><th scope="col">Status</th><th scope="col">Attempts</th><th scope="col">Next attempt</th></tr></thead>
  <tbody>
    ${page.data.map(
      (delivery) => html`<tr>
      <td>${when(delivery.created_at)}</td>
      <td><a href="${link(delivery)}"><code>${delivery.event}</code></a>${testTag(delivery)}</td>
      <td>${statusBadge(delivery.status)}</td>
      <td>${delivery.attempt_count}</td>
      <td>${when(delivery.next_attempt_at)}</td>
    </tr>`,
    )}
  </tbody>
</table></div>`
}
<nav class="pager" aria-label="Pages">
  ${cursor ? html`<a href="/webhooks/${id}/deliveries${filters.size > 0 ? `?${filters}` : ''}">Newest</a>` : ''}
  ${older ? html`<a href="/webhooks/${id}/deliveries?${older.toString()}" rel="next">Older deliveries</a>` : ''}
</nav>`,
  }
}

// ---------------------------------------------------------------------------------------------
// One delivery
// ---------------------------------------------------------------------------------------------

function attemptRow(attempt: Attempt): SafeHtml {
  return html`<tr>
  <th scope="row">${attempt.attempt}</th>
  <td>${when(attempt.started_at)}</td>
  <td>${attempt.duration_ms} ms</td>
  <td>${attempt.response_status ?? '—'}</td>
  <td>${attempt.error ? html`<span class="error-code" title="${attempt.error}">${ERROR_LABELS[attempt.error] ?? attempt.error}</span>` : 'None'}</td>
  <td>${
    attempt.response_body_excerpt
      ? html`<details><summary>${`${attempt.response_body_excerpt.length > 60 ? `${attempt.response_body_excerpt.slice(0, 60)}…` : attempt.response_body_excerpt}`}</summary><pre class="excerpt">${attempt.response_body_excerpt}</pre></details>`
      : html`<span class="muted">No answer body</span>`
  }${attempt.signature ? html`<details><summary>Signature</summary><code class="wrap">${attempt.signature}</code></details>` : ''}</td>
</tr>`
}

export const showDelivery: PageHandler = async (context) => {
  const refused = adminOnly(context, 'Delivery')
  if (refused) return refused
  const { api, params, frame } = context
  const id = idOf(params.id, 'webhook')
  const deliveryId = idOf(params.delivery_id, 'delivery')
  const subscription = await subscriptionOf(context, id)
  const delivery = (await api('GET', `${BASE}/:id/deliveries/:delivery_id`, { params: { id, delivery_id: deliveryId } })).data as Delivery
  const attempts = delivery.attempts ?? []
  const latest = attempts.at(-1)
  const headers = { ...delivery.request_headers, ...(latest?.signature ? { 'x-service-signature': latest.signature } : {}) }
  const canRedeliver = delivery.status === 'dead' || delivery.status === 'delivered'
  // A retrying delivery can be attempted now rather than at its next time, in the same cycle.
  const canRetryNow = delivery.status === 'retrying'
  return {
    title: `Delivery ${delivery.event} · ${subscription.name}`,
    content: html`${backLinks(subscription, true)}
<h1><code>${delivery.event}</code>${testTag(delivery)} to ${subscription.name}</h1>
<section class="panel" aria-labelledby="delivery-summary">
  <h2 id="delivery-summary">Summary</h2>
  <dl class="stats">
    <dt>Status</dt><dd>${statusBadge(delivery.status)}</dd>
    <dt>Delivery ID</dt><dd><code>${delivery.delivery_id}</code></dd>
    <dt>Event ID</dt><dd><code>${delivery.event_id}</code></dd>
    <dt>Record</dt><dd>${recordLink(delivery.record_type, delivery.record_id)}</dd>
    <dt>Created</dt><dd>${when(delivery.created_at)}</dd>
    <dt>Attempts</dt><dd>${delivery.attempt_count}</dd>
    <dt>Next attempt</dt><dd>${when(delivery.next_attempt_at)}</dd>
    <dt>Completed</dt><dd>${when(delivery.completed_at)}</dd>
  </dl>
  ${
    canRedeliver
      ? html`<form class="actions" method="post" action="/webhooks/${id}/deliveries/${delivery.delivery_id}/redeliver">
    ${hiddenCsrf(frame.csrf)}
    <button type="submit" class="small">Redeliver</button>
    <span class="hint muted">A fresh cycle of 7 attempts with the same delivery ID, the first at once.</span>
  </form>`
      : canRetryNow
        ? html`<form class="actions" method="post" action="/webhooks/${id}/deliveries/${delivery.delivery_id}/redeliver">
    ${hiddenCsrf(frame.csrf)}
    <button type="submit" class="small">Retry now</button>
    <span class="hint muted">The next attempt at once instead of at ${when(delivery.next_attempt_at)}; if it fails, the schedule goes on.</span>
  </form>`
        : ''
  }
</section>
<section aria-labelledby="request-heading">
  <h2 id="request-heading">Request</h2>
  ${
    latest
      ? html`<p class="muted">As attempt ${latest.attempt} sent it. Every attempt is signed afresh and carries its own <code>delivered_at</code>; the rest is the same.</p>`
      : html`<p class="muted">Not sent yet: these headers go with every attempt, each with its own signature.</p>`
  }
  <div class="table-scroll"><table class="headers">
    <thead><tr><th scope="col">Header</th><th scope="col">Value</th></tr></thead>
    <tbody>${Object.entries(headers).map(([name, value]) => html`<tr><th scope="row"><code>${name}</code></th><td><code class="wrap">${value}</code></td></tr>`)}</tbody>
  </table></div>
  ${delivery.body ? html`<h3 class="spaced">Body</h3><pre class="body" aria-label="Body as sent" tabindex="0">${delivery.body}</pre>` : ''}
</section>
<section aria-labelledby="attempts-heading">
  <h2 id="attempts-heading">Attempts</h2>
  ${
    attempts.length === 0
      ? html`<p class="muted">No attempt yet.</p>`
      : html`<div class="table-scroll"><table class="attempts">
    <thead><tr><th scope="col">#</th><th scope="col">Time</th><th scope="col">Duration</th><th scope="col">Status</th><th scope="col">Error</th><th scope="col">Answer (first 2 KiB)</th></tr></thead>
    <tbody>${attempts.map(attemptRow)}</tbody>
  </table></div>`
  }
</section>`,
  }
}

export const redeliverDelivery: PageHandler = async ({ api, params }) => {
  const id = idOf(params.id, 'webhook')
  const deliveryId = idOf(params.delivery_id, 'delivery')
  await api('POST', `${BASE}/:id/deliveries/:delivery_id/redeliver`, { params: { id, delivery_id: deliveryId } })
  return { redirect: `/webhooks/${id}/deliveries/${deliveryId}` }
}

// ---------------------------------------------------------------------------------------------
// Test event and recovery
// ---------------------------------------------------------------------------------------------

export const sendTestEvent: PageHandler = async ({ api, params, form }) => {
  const id = idOf(params.id, 'webhook')
  const event = form.get('event')
  if (!EVENT_NAMES.includes(event)) throw new ApiError(422, 'validation_failed', 'Invalid', 'Choose one of the events.')
  const sent = (await api('POST', `${BASE}/:id/test`, { params: { id }, body: { event } })).data as Delivery
  return { redirect: `/webhooks/${id}/deliveries/${sent.delivery_id}` }
}

function recoverPage(subscription: Subscription, csrf: string, content: SafeHtml, status = 200): PageResult {
  return {
    status,
    title: `Recover failed deliveries · ${subscription.name}`,
    content: html`${backLinks(subscription)}
<h1>Recover failed deliveries of ${subscription.name}</h1>
<section class="panel" aria-labelledby="recover-heading">
  <h2 id="recover-heading" class="sr-only">Review</h2>
  ${content}
</section>
<section aria-labelledby="recover-other">
  <h2 id="recover-other">Another time</h2>
  <form class="inline" method="post" action="/webhooks/${subscription.id}/recover">
    ${hiddenCsrf(csrf)}
    ${recoverSinceField(subscription.id, null)}
    <button type="submit" class="small secondary">Review</button>
  </form>
</section>`,
  }
}

/**
 * "Recover failed since…": without `confirm`, says how many dead deliveries the window holds and
 * asks; with it, sends them again and goes to the log.
 */
export const recoverDeliveries: PageHandler = async (context) => {
  const { params, form, frame, attempt } = context
  const id = idOf(params.id, 'webhook')
  const subscription = await subscriptionOf(context, id)
  const since = sinceOf(form.get('since'))
  if (since === null)
    return recoverPage(
      subscription,
      frame.csrf,
      errorNotice('Enter the date and time (UTC) the failures began, such as 2026-11-22T03:00.'),
      422,
    )
  const sinceText = since.toISOString()
  if (form.get('confirm') === 'yes') {
    const done = await attempt((scope) => scope.api('POST', `${BASE}/:id/recover`, { params: { id }, body: { since: sinceText } }))
    if (!done.ok) return recoverPage(subscription, frame.csrf, errorNotice(refusal(done.error)), done.error.status)
    setFlash(context.services.config.appSecret, context.req, context.res, 'webhook-recovered', { count: done.value.data.deliveries })
    return { redirect: `/webhooks/${id}/deliveries?status=${subscription.status === 'paused' ? 'held' : 'pending'}` }
  }
  const counted = await attempt((scope) =>
    scope.api('GET', `${BASE}/:id/recover`, { params: { id }, query: new URLSearchParams({ since: sinceText }).toString() }),
  )
  if (!counted.ok) return recoverPage(subscription, frame.csrf, errorNotice(refusal(counted.error)), counted.error.status)
  const count = counted.value.data.deliveries as number
  const deliveries = count === 1 ? '1 failed delivery' : `${count.toLocaleString('en-US')} failed deliveries`
  return recoverPage(
    subscription,
    frame.csrf,
    count === 0
      ? html`<p role="status">No failed deliveries were created since ${when(sinceText)}: nothing to send again.</p>`
      : html`<p role="status"><strong>${deliveries}</strong> created since ${when(sinceText)} will be sent again: a fresh cycle of 7 attempts each, with the same delivery IDs, oldest first.${
          subscription.status === 'paused' ? ' This webhook is paused: they are held until you resume it.' : ''
        }</p>
  <form class="actions" method="post" action="/webhooks/${id}/recover">
    ${hiddenCsrf(frame.csrf)}
    <input type="hidden" name="since" value="${sinceText}">
    <input type="hidden" name="confirm" value="yes">
    <button type="submit">Resend ${deliveries}</button>
    <a href="/webhooks">Cancel</a>
  </form>`,
  )
}

function refusal(error: ApiError): string {
  if (error.errors?.[0]?.pointer === '/since' || /since/.test(error.message))
    return 'Choose a time within the last 30 days: the delivery log keeps no older deliveries.'
  return error.message.endsWith('.') ? error.message : `${error.message}.`
}
