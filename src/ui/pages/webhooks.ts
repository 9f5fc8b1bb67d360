// Webhooks (admins): one card per subscription with its 24-hour stats, pause and resume, its
// delivery log, a test event and the recovery of failed deliveries (src/ui/pages/webhook-deliveries.ts),
// and a form that creates one and shows its signing secret once. Everything goes through the
// handlers of /api/webhook-subscriptions, so the plan gate, the address guard and the limits are theirs.
import Type, { type Static } from 'typebox'
import { sql } from '../../db/pool.ts'
import { rowType } from '../../db/typed-rows.ts'
import { ApiError } from '../../http/problem.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf, shownOnce, when } from '../layout.ts'
import { describeRefusal, type PageContext, type PageHandler, type PageResult } from '../page-context.ts'
import { setFlash, takeFlash } from '../session.ts'
import { recoverSinceField, testEventField } from './webhook-deliveries.ts'

const BASE = '/api/webhook-subscriptions'

export const EVENT_CHOICES: { value: string; label: string }[] = [
  { value: '*', label: 'Every event (*)' },
  ...['contact', 'company', 'deal'].flatMap((type) => [
    { value: `${type}.*`, label: `Every ${type} event (${type}.*)` },
    ...['created', 'updated', 'deleted'].map((action) => ({ value: `${type}.${action}`, label: `${type}.${action}` })),
  ]),
]

type Subscription = {
  id: string
  name: string
  url: string
  events: string[]
  status: 'active' | 'paused'
  paused_reason: 'manual' | 'auto' | null
  paused_at: string | null
  health: 'healthy' | 'failing' | 'paused'
  secret_last4: string
  stats: { success_rate: number | null; attempts_24h: number; deliveries_24h: number; last_delivery_at: string | null }
}

type FormState = { values?: { name: string; url: string; event: string }; error?: string; created?: { name: string; secret: string } }

/** The rate with what it counts, so that "100%" of 1 attempt reads differently from 100% of 5,000. */
function successRate(rate: number | null, attempts: number): string {
  if (rate === null) return 'No attempts'
  const percent = rate * 100
  return `${Number.isInteger(percent) ? percent : percent.toFixed(1)}% of ${attempts} ${attempts === 1 ? 'attempt' : 'attempts'}`
}

const HEALTH_LABELS = { healthy: 'Healthy', failing: 'Failing (last 3 attempts failed)', paused: 'Paused' } as const

function card(subscription: Subscription, csrf: string): SafeHtml {
  const headingId = `webhook-${subscription.id}`
  const paused = subscription.status === 'paused'
  return html`<article class="card" aria-labelledby="${headingId}">
  <h3 id="${headingId}">${subscription.name}</h3>
  <p class="url">${subscription.url}</p>
  <dl class="stats">
    <dt>Event</dt><dd><code>${subscription.events.join(', ')}</code></dd>
    <dt>Status</dt><dd><span class="badge ${subscription.status}">${paused ? (subscription.paused_reason === 'auto' ? 'Paused (too many failures)' : 'Paused') : 'Active'}</span></dd>
    <dt>Health</dt><dd><span class="badge ${subscription.health}">${HEALTH_LABELS[subscription.health]}</span></dd>
    <dt>Success rate (24 h)</dt><dd>${successRate(subscription.stats.success_rate, subscription.stats.attempts_24h)}</dd>
    <dt>Deliveries (24 h)</dt><dd>${subscription.stats.deliveries_24h}</dd>
    <dt>Last delivery</dt><dd>${when(subscription.stats.last_delivery_at, 'Never')}</dd>
    <dt>Secret</dt><dd><span class="mono" aria-label="Secret ending in ${subscription.secret_last4}">…${subscription.secret_last4}</span></dd>
  </dl>
  <div class="actions">
    <form method="post" action="/webhooks/${subscription.id}/${paused ? 'resume' : 'pause'}">
      ${hiddenCsrf(csrf)}
      <button type="submit" class="secondary small" aria-label="${paused ? 'Resume' : 'Pause'} ${subscription.name}">${paused ? 'Resume' : 'Pause'}</button>
    </form>
    <a href="/webhooks/${subscription.id}/deliveries" aria-label="Delivery log of ${subscription.name}">Delivery log</a>
  </div>
  <details>
    <summary>Send test event</summary>
    <form class="inline" method="post" action="/webhooks/${subscription.id}/test">
      ${hiddenCsrf(csrf)}
      ${testEventField(subscription)}
      <button type="submit" class="small" aria-label="Send the sample to ${subscription.name}">Send</button>
    </form>
  </details>
  <details>
    <summary>Recover failed since…</summary>
    <form class="inline" method="post" action="/webhooks/${subscription.id}/recover">
      ${hiddenCsrf(csrf)}
      ${recoverSinceField(subscription.id, null)}
      <button type="submit" class="small secondary" aria-label="Review failed deliveries of ${subscription.name}">Review</button>
    </form>
  </details>
</article>`
}

const PlanSchema = Type.Object({ plan: Type.String(), trial_ends_at: Type.Union([Type.String(), Type.Null()]) })
const PlanRow = rowType(PlanSchema)

function planNotice(workspace: Static<typeof PlanSchema>): SafeHtml {
  const ended = workspace.trial_ends_at ? html` The free trial ended on ${when(workspace.trial_ends_at)}.` : html``
  return html`<section class="notice plan" role="status" aria-labelledby="plan-heading">
  <h2 id="plan-heading">Webhooks need the Pro plan</h2>
  <p>This workspace is on the Free plan.${ended} Upgrade to Pro to create webhooks and receive deliveries. Existing webhooks are kept, but no events are sent while the workspace is not on Pro.</p>
</section>`
}

function newWebhookForm(csrf: string, state: FormState): SafeHtml {
  const values = state.values ?? { name: '', url: '', event: '*' }
  return html`<section class="panel" aria-labelledby="new-webhook">
  <h2 id="new-webhook">New webhook</h2>
  ${errorNotice(state.error)}
  <form class="stack" method="post" action="/webhooks">
    ${hiddenCsrf(csrf)}
    <div class="field">
      <label for="webhook-name">Name</label>
      <input type="text" id="webhook-name" name="name" value="${values.name}" maxlength="255" required>
    </div>
    <div class="field">
      <label for="webhook-url">Endpoint URL</label>
      <input type="url" id="webhook-url" name="url" value="${values.url}" maxlength="2048" placeholder="https://hooks.example.com/crm" required aria-describedby="webhook-url-hint">
      <span class="hint" id="webhook-url-hint">HTTPS only; the address must be public.</span>
    </div>
    <div class="field">
      <label for="webhook-event">Event</label>
      <select id="webhook-event" name="event">
        ${EVENT_CHOICES.map((choice) => html`<option value="${choice.value}"${choice.value === values.event ? html` selected` : ''}>${choice.label}</option>`)}
      </select>
    </div>
    <div class="actions"><button type="submit">Create webhook</button></div>
  </form>
</section>`
}

async function render(context: PageContext, state: FormState, status = 200): Promise<PageResult> {
  const { caller, frame, attempt, db } = context
  if (!caller.isAdmin) {
    return {
      status: 403,
      title: 'Webhooks',
      content: html`<h1>Webhooks</h1><div class="notice info" role="status">Only workspace admins manage webhooks.</div>`,
    }
  }
  const listed = await attempt((scope) => scope.api('GET', BASE, { query: 'limit=200' }))
  if (!listed.ok && listed.error.code === 'plan_required') {
    const workspace = await db.one(sql.type(PlanRow)`
      select plan, trial_ends_at from crm.workspaces where id = (select crm.current_workspace_id())`)
    return { status: 402, title: 'Webhooks', content: html`<h1>Webhooks</h1>${planNotice(workspace)}` }
  }
  if (!listed.ok) throw listed.error
  const subscriptions = listed.value.data as Subscription[]
  const created = state.created
  return {
    status,
    title: 'Webhooks',
    content: html`<h1>Webhooks</h1>
<p class="lead">Signed HTTP requests to your endpoints when contacts, companies and deals change. <a href="/webhooks/events">The events and their bodies</a></p>
${
  created
    ? html`<section class="notice success" aria-labelledby="secret-heading">
  <h2 id="secret-heading">Webhook “${created.name}” created</h2>
  <p>Copy the signing secret now: it is shown only once. Use it to check the X-Service-Signature header.</p>
  ${shownOnce('new-secret', 'Signing secret', created.secret)}
</section>`
    : ''
}
<section aria-labelledby="subscriptions-heading">
  <h2 id="subscriptions-heading">Subscriptions</h2>
  ${subscriptions.length === 0 ? html`<p class="muted">No webhooks yet.</p>` : html`<div class="cards">${subscriptions.map((subscription) => card(subscription, frame.csrf))}</div>`}
</section>
${newWebhookForm(frame.csrf, state)}`,
  }
}

export const showWebhooks: PageHandler = (context) =>
  render(context, {
    created:
      takeFlash<{ name: string; secret: string }>(context.services.config.appSecret, context.req, context.res, 'webhook') ?? undefined,
  })

export const createWebhook: PageHandler = async (context) => {
  const { form, attempt } = context
  const values = { name: form.get('name').trim(), url: form.get('url').trim(), event: form.get('event') }
  let error: string | null = null
  if (values.name === '') error = 'Enter a name for the webhook.'
  else if (values.url === '') error = 'Enter the endpoint URL.'
  else if (!EVENT_CHOICES.some((choice) => choice.value === values.event)) error = 'Choose one event.'
  if (error) return render(context, { values, error }, 422)
  const created = await attempt((scope) =>
    scope.api('POST', BASE, { body: { name: values.name, url: values.url, events: [values.event] } }),
  )
  if (!created.ok) {
    const message =
      created.error.code === 'url_not_allowed'
        ? `This endpoint URL is not allowed: ${created.error.errors?.[0]?.message ?? created.error.message}.`
        : describeRefusal(created.error, { name: 'the name', url: 'the endpoint URL', events: 'the event' })
    return render(context, { values, error: message }, created.error.status)
  }
  const subscription = created.value.data as Subscription & { secret: string }
  setFlash(context.services.config.appSecret, context.req, context.res, 'webhook', { name: subscription.name, secret: subscription.secret })
  return { redirect: '/webhooks' }
}

export function changeWebhook(action: 'pause' | 'resume'): PageHandler {
  return async ({ api, params }) => {
    if (!UUID_PATTERN.test(params.id ?? '')) throw new ApiError(404, 'not_found', 'Not found', 'No such webhook.')
    await api('POST', `${BASE}/:id/${action}`, { params: { id: params.id.toLowerCase() } })
    return { redirect: '/webhooks' }
  }
}
