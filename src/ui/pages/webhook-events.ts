// The events page (admins): the 9 events with a sample body of each, built by the code that builds
// real deliveries: the outbox's renderers and the body functions in SQL (crm.webhook_sample_bodies,
// the samples of POST .../test), then delivered_at and the ASCII escaping of every attempt
// (src/webhooks/delivery-body.ts). What the page shows cannot drift from what receivers get.
import Type from 'typebox'
import { sql } from '../../db/pool.ts'
import { rowType } from '../../db/typed-rows.ts'
import { deliveryBody } from '../../webhooks/delivery-body.ts'
import { html } from '../html.ts'
import type { PageHandler } from '../page-context.ts'

const SampleRow = rowType(Type.Object({ event: Type.String(), body_head: Type.String(), body_tail: Type.String() }))

const WHEN: Record<string, string> = {
  created: 'is created (through the API, the UI or an import)',
  updated: 'changes: data.previous_attributes holds the old value of each changed field',
  deleted: 'is deleted: data.object is the record as it was',
}
const NOTES: Record<string, string> = {
  'deal.updated': 'A stage change is a deal.updated whose previous_attributes holds stage.',
  'company.deleted': 'Its contacts and deals lose their company_id, each with its own .updated event.',
  'contact.updated': 'A change of associations carries data.associations_changed instead, with the ids added and removed.',
}

export const showEvents: PageHandler = async ({ caller, db }) => {
  if (!caller.isAdmin) {
    return {
      status: 403,
      title: 'Webhook events',
      content: html`<h1>Webhook events</h1><div class="notice info" role="status">Only workspace admins manage webhooks.</div>`,
    }
  }
  const samples = await db.many(sql.type(SampleRow)`select * from crm.webhook_sample_bodies()`)
  const now = new Date()
  return {
    title: 'Webhook events',
    content: html`<p class="crumbs"><a href="/webhooks">Webhooks</a></p>
<h1>Webhook events</h1>
<p class="lead">Every event a subscription can receive, with a sample body built by the code that builds real deliveries. Bodies are sent compact and pure ASCII (non-ASCII characters as <code>\\uXXXX</code>); they are indented here for reading. A test event (<em>Send test event</em> on a webhook's card) is the same body with <code>"test": true</code> at the end.</p>
<nav aria-label="Events"><ul class="event-index">${samples.map((sample) => html`<li><a href="#${sample.event}"><code>${sample.event}</code></a></li>`)}</ul></nav>
${samples.map((sample) => {
  const [type, action] = sample.event.split('.')
  const body = JSON.stringify(JSON.parse(deliveryBody(sample, now).toString('latin1')), null, 2)
  return html`<section class="event" aria-labelledby="${sample.event}">
  <h2 id="${sample.event}"><code>${sample.event}</code></h2>
  <p>Sent when a ${type} ${WHEN[action]}.${NOTES[sample.event] ? ` ${NOTES[sample.event]}` : ''}</p>
  <pre class="body" tabindex="0">${body}</pre>
</section>`
})}`,
  }
}
