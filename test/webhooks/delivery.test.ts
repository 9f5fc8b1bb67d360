// End to end: a subscription, a record change through the API, and what the receiver gets:
// signature, headers, body shape and escaping; then the delivery log, one delivery and stats.
import { createHmac } from 'node:crypto'
import SwaggerParser from '@apidevtools/swagger-parser'
import t from 'tap'
import { Compile } from 'typebox/schema'
import { computeSignature, verifySignature } from '../../src/webhooks/signature.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV, waitUntil } from './receiver.ts'
import { everyVerifierAccepts } from './verifiers.ts'

t.test('a contact change reaches the receiver signed, with the documented headers and body', async (t) => {
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)

  const created = await server.request('POST', '/api/webhook-subscriptions', {
    token,
    body: { name: 'Sync', url: `${receiver.url}/hook?x=1`, events: ['contact.*'] },
  })
  t.equal(created.status, 201, created.text)
  const subscription = created.body.data
  t.match(subscription.secret, /^whsec_[A-Za-z0-9+/]{43}=$/, 'whsec_ and 32 bytes in standard base64')
  t.equal(subscription.secret_last4, subscription.secret.slice(-4))
  t.equal(subscription.status, 'active')
  t.same(subscription.stats, { success_rate: null, attempts_24h: 0, deliveries_24h: 0, last_delivery_at: null })
  t.equal(created.headers.get('location'), `/api/webhook-subscriptions/${subscription.id}`)

  const read = await server.request('GET', `/api/webhook-subscriptions/${subscription.id}`, { token })
  t.equal(read.status, 200)
  t.notOk('secret' in read.body.data, 'the secret is shown once')

  const contact = await server.request('POST', '/api/contacts', { token, body: { first_name: 'Zoë 😀', email: 'zoe@example.com' } })
  t.equal(contact.status, 201, contact.text)
  const [request] = await receiver.waitFor((all) => all.length >= 1)

  t.equal(request.path, '/hook?x=1')
  t.equal(request.headers['content-type'], 'application/json')
  t.match(request.headers['user-agent'], /^crm-webhooks\/\d+\.\d+\.\d+/)
  t.equal(request.headers['x-service-event'], 'contact.created')
  t.equal(request.headers['x-service-webhook-id'], subscription.id)
  const deliveryId = request.headers['x-service-delivery-id'] as string
  t.match(deliveryId, /^[0-9a-f-]{36}$/)
  const signature = request.headers['x-service-signature'] as string
  t.match(signature, /^t=\d+,v1=[0-9a-f]{64}$/)
  t.ok(verifySignature(signature, request.raw, subscription.secret), 'the signature verifies with the secret')
  const [, t1, v1] = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(signature)!
  t.equal(computeSignature(subscription.secret, Number(t1), request.raw), v1, 'HMAC over "<t>.<raw body>"')
  t.equal(request.headers['webhook-id'], deliveryId)
  t.equal(request.headers['webhook-timestamp'], t1)
  const standardKey = Buffer.from(subscription.secret.slice('whsec_'.length), 'base64')
  const standard = createHmac('sha256', standardKey).update(`${deliveryId}.${t1}.`).update(request.raw).digest('base64')
  t.equal(request.headers['webhook-signature'], `v1,${standard}`, 'HMAC over "<id>.<t>.<raw body>" keyed by the decoded secret')
  t.same(everyVerifierAccepts(request, subscription.secret), { stripe: true, standardwebhooks: true, svix: true })

  const text = request.raw.toString('latin1')
  t.ok(/^[\x00-\x7f]*$/.test(text), 'the body is pure ASCII')
  t.ok(text.includes('Zo\\u00eb \\ud83d\\ude00'), 'non-ASCII as \\uXXXX escapes, surrogate pairs beyond U+FFFF')
  const body = request.body
  t.same(Object.keys(body), ['id', 'event', 'occurred_at', 'delivered_at', 'delivery_id', 'workspace', 'data', 'actor'])
  t.equal(body.event, 'contact.created')
  t.equal(body.delivery_id, deliveryId)
  t.same(body.workspace, { id: tenant.id, slug: tenant.slug })
  t.equal(body.data.object.id, contact.body.data.id)
  t.equal(body.data.object.first_name, 'Zoë 😀')
  t.same(body.actor, { type: 'user', id: tenant.members['admin@a.test'].id, via: 'api' })
  const document = await SwaggerParser.dereference(structuredClone((await server.request('GET', '/api/openapi.json')).body))
  const webhookEvent = Compile((document as any).components.schemas.WebhookEvent)
  t.ok(webhookEvent.Check(body), 'the body is what the document names WebhookEvent')
  t.match(body.occurred_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)
  t.match(body.delivered_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)

  // An update carries previous_attributes; an event outside the patterns is not sent.
  await server.request('POST', '/api/companies', { token, body: { name: 'Acme' } })
  const updated = await server.request('PATCH', `/api/contacts/${contact.body.data.id}`, { token, body: { last_name: 'Ng' } })
  t.equal(updated.status, 200, updated.text)
  const all = await receiver.waitFor((all) => all.length >= 2)
  const update = all.find((r) => r.body.event === 'contact.updated')!
  t.same(update.body.data.previous_attributes, { last_name: null })
  t.equal(update.body.data.object.last_name, 'Ng')
  await new Promise((resolve) => setTimeout(resolve, 300))
  t.notOk(
    receiver.received.some((r) => r.body.event.startsWith('company.')),
    'company events do not match contact.*',
  )

  // The log, newest first; one delivery with its attempts; the stats.
  const log = await waitUntil(async () => {
    const answer = await server.request('GET', `/api/webhook-subscriptions/${subscription.id}/deliveries`, { token })
    return answer.body.data.length === 2 && answer.body.data.every((d: any) => d.status === 'delivered') ? answer : null
  })
  t.same(
    log.body.data.map((d: any) => d.event),
    ['contact.updated', 'contact.created'],
  )
  t.equal(log.body.next_cursor, null)
  const one = await server.request('GET', `/api/webhook-subscriptions/${subscription.id}/deliveries/${deliveryId}`, { token })
  t.equal(one.status, 200)
  t.match(one.body.data, {
    delivery_id: deliveryId,
    subscription_id: subscription.id,
    event: 'contact.created',
    record_type: 'contact',
    status: 'delivered',
    attempt_count: 1,
    next_attempt_at: null,
  })
  t.equal(one.body.data.attempts.length, 1)
  t.match(one.body.data.attempts[0], { attempt: 1, response_status: 200, error: null, response_body_excerpt: 'ok' })

  const paged = await server.request('GET', `/api/webhook-subscriptions/${subscription.id}/deliveries?limit=1`, { token })
  t.equal(paged.body.data.length, 1)
  t.ok(paged.body.next_cursor)
  t.match(paged.headers.get('link'), /rel="next"/)
  const second = await server.request(
    'GET',
    `/api/webhook-subscriptions/${subscription.id}/deliveries?limit=1&cursor=${paged.body.next_cursor}`,
    { token },
  )
  t.equal(second.body.data[0].event, 'contact.created')
  const filtered = await server.request(
    'GET',
    `/api/webhook-subscriptions/${subscription.id}/deliveries?event=contact.updated&status=delivered`,
    { token },
  )
  t.same(
    filtered.body.data.map((d: any) => d.event),
    ['contact.updated'],
  )
  t.equal((await server.request('GET', `/api/webhook-subscriptions/${subscription.id}/deliveries?status=nope`, { token })).status, 400)

  const stats = await server.request('GET', `/api/webhook-subscriptions/${subscription.id}`, { token })
  t.equal(stats.body.data.stats.success_rate, 1)
  t.equal(stats.body.data.stats.deliveries_24h, 2)
  t.match(stats.body.data.stats.last_delivery_at, /Z$/)
})
