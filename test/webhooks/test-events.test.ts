// Test events (POST .../test): a sample of the chosen event, rendered by the outbox's own renderers,
// with "test": true, signed with the current secret(s) and checked by verifiers that share no code
// with the service (the README's snippet, Stripe's library, and the standardwebhooks and svix
// libraries on the Standard Webhooks headers); logged with its attempts, the body
// and signature as sent; sent while paused; never counted in the stats or the auto-pause rule.
import t from 'tap'
import { sealWebhookSecret, webhookSecretKey } from '../../src/webhooks/secret-store.ts'
import { verifySignature } from '../../src/webhooks/signature.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer, TEST_APP_SECRET } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV, waitUntil } from './receiver.ts'
import { everyVerifierAccepts, readmeVerifier, stripeVerifyHeader } from './verifiers.ts'

const BASE = '/api/webhook-subscriptions'

t.test('a test event reaches the receiver signed, marked "test": true, and verifies with independent verifiers', async (t) => {
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const admin = tenant.members['admin@a.test']
  const receiver = await startReceiver(t)
  const created = await server.request('POST', BASE, {
    token: admin.token,
    body: { name: 'New endpoint', url: `${receiver.url}/in`, events: ['*'] },
  })
  t.equal(created.status, 201, created.text)
  const subscription = created.body.data

  const sent = await server.request('POST', `${BASE}/${subscription.id}/test`, { token: admin.token, body: {} })
  t.equal(sent.status, 202, sent.text)
  t.match(sent.body.data, {
    subscription_id: subscription.id,
    event: 'contact.created',
    record_type: 'contact',
    status: 'pending',
    test: true,
  })
  const [request] = await receiver.waitFor((all) => all.length >= 1)
  t.equal(request.headers['x-service-event'], 'contact.created')
  t.equal(request.headers['x-service-delivery-id'], sent.body.data.delivery_id)
  t.equal(request.headers['x-service-webhook-id'], subscription.id)
  const signature = String(request.headers['x-service-signature'])
  t.match(signature, /^t=\d+,v1=[0-9a-f]{64}$/)

  const readme = await readmeVerifier()
  t.ok(readme(request.raw, signature, subscription.secret), "the README's verifier accepts it")
  t.notOk(readme(request.raw, signature, `${subscription.secret}x`), "the README's verifier refuses another secret")
  t.notOk(readme(Buffer.concat([request.raw, Buffer.from(' ')]), signature, subscription.secret), '... and a changed body')
  t.ok(stripeVerifyHeader(request.raw, signature, subscription.secret), "Stripe's scheme accepts it")
  t.notOk(stripeVerifyHeader(request.raw, signature, `${subscription.secret}x`), "Stripe's scheme refuses another secret")
  t.ok(verifySignature(signature, request.raw, subscription.secret), "and the service's own verifier")
  t.equal(request.headers['webhook-id'], sent.body.data.delivery_id, 'webhook-id is the delivery id')
  t.equal(request.headers['webhook-timestamp'], signature.slice(2, signature.indexOf(',')), "webhook-timestamp is X-Service-Signature's t")
  t.match(request.headers['webhook-signature'], /^v1,[A-Za-z0-9+/]{43}=$/)
  t.same(
    everyVerifierAccepts(request, subscription.secret),
    { stripe: true, standardwebhooks: true, svix: true },
    'one secret, both schemes',
  )
  t.same(
    everyVerifierAccepts(request, `whsec_${Buffer.alloc(32, 7).toString('base64')}`),
    { stripe: false, standardwebhooks: false, svix: false },
    'and every library refuses another secret',
  )

  const body = request.body
  t.same(
    Object.keys(body),
    ['id', 'event', 'occurred_at', 'delivered_at', 'delivery_id', 'workspace', 'data', 'actor', 'test'],
    'test last',
  )
  t.equal(body.test, true)
  t.equal(body.id, sent.body.data.event_id)
  t.equal(body.delivery_id, sent.body.data.delivery_id)
  t.same(body.workspace, { id: tenant.id, slug: tenant.slug })
  t.same(body.actor, { type: 'user', id: admin.id, via: 'api' })
  t.match(body.data.object, {
    id: sent.body.data.record_id,
    first_name: 'Ada',
    last_name: 'Lovelace',
    email: 'ada.lovelace@example.com',
    owner_id: admin.id,
  })
  t.notOk('previous_attributes' in body.data, 'a created event has no previous_attributes')

  // The sample has exactly the shape of a real event of its type: same renderer.
  const contact = await server.request('POST', '/api/contacts', {
    token: admin.token,
    body: { first_name: 'Lin', email: 'lin@example.com' },
  })
  t.equal(contact.status, 201)
  const real = (await receiver.waitFor((all) => all.some((r) => r.body.event === 'contact.created' && !r.body.test))).find(
    (r) => r.body.event === 'contact.created' && !r.body.test,
  )!
  t.same(Object.keys(body.data.object).sort(), Object.keys(real.body.data.object).sort(), 'the sample object has the real object’s fields')
  t.same(
    Object.keys(real.body),
    ['id', 'event', 'occurred_at', 'delivered_at', 'delivery_id', 'workspace', 'data', 'actor'],
    'real events carry no test key',
  )

  // A stage change sample: previous_attributes holds the old stage, from the workspace's pipeline.
  const stage = await server.request('POST', `${BASE}/${subscription.id}/test`, { token: admin.token, body: { event: 'deal.updated' } })
  t.equal(stage.status, 202, stage.text)
  const deal = (await receiver.waitFor((all) => all.some((r) => r.body.event === 'deal.updated'))).find(
    (r) => r.body.event === 'deal.updated',
  )!
  t.equal(deal.body.test, true)
  t.equal(deal.body.data.object.stage, 'proposal')
  t.equal(deal.body.data.previous_attributes.stage, 'qualified')
  t.ok('stage_changed_at' in deal.body.data.previous_attributes, 'as a real stage change reports it')
  t.ok(stripeVerifyHeader(deal.raw, String(deal.headers['x-service-signature']), subscription.secret))
  const realDeal = await server.request('POST', '/api/deals', { token: admin.token, body: { name: 'Real', amount: '10.00' } })
  t.equal(realDeal.status, 201)
  t.same(Object.keys(deal.body.data.object).sort(), Object.keys(realDeal.body.data).sort(), 'the deal sample has a real deal’s fields')

  // The log: marked test, with the body and the signature as sent.
  const log = await server.request('GET', `${BASE}/${subscription.id}/deliveries`, { token: admin.token })
  t.same(
    log.body.data.filter((d: any) => d.test).map((d: any) => d.event),
    ['deal.updated', 'contact.created'],
  )
  const one = await waitUntil(async () => {
    const answer = await server.request('GET', `${BASE}/${subscription.id}/deliveries/${sent.body.data.delivery_id}`, {
      token: admin.token,
    })
    return answer.body.data.status === 'delivered' ? answer : null
  })
  t.equal(one.body.data.test, true)
  t.equal(one.body.data.attempts.length, 1)
  t.equal(one.body.data.attempts[0].signature, signature, 'the attempt logs the signature it sent')
  t.equal(one.body.data.body, request.raw.toString('latin1'), 'the body as sent, byte for byte')
  t.same(one.body.data.request_headers, request.headers, 'the log shows every header the receiver got')
  t.match(one.body.data.request_headers, {
    'x-service-event': 'contact.created',
    'x-service-delivery-id': sent.body.data.delivery_id,
    'x-service-webhook-id': subscription.id,
    'webhook-id': sent.body.data.delivery_id,
  })

  // During a rotation both secrets sign a test event too.
  const rotated = await server.request('POST', `${BASE}/${subscription.id}/rotate-secret`, { token: admin.token, body: {} })
  t.equal(rotated.status, 200)
  const afterRotation = await server.request('POST', `${BASE}/${subscription.id}/test`, {
    token: admin.token,
    body: { event: 'company.deleted' },
  })
  const rotatedRequest = (await receiver.waitFor((all) => all.some((r) => r.body.event === 'company.deleted'))).find(
    (r) => r.body.event === 'company.deleted',
  )!
  t.equal(rotatedRequest.headers['x-service-delivery-id'], afterRotation.body.data.delivery_id)
  const twoSignatures = String(rotatedRequest.headers['x-service-signature'])
  t.match(twoSignatures, /^t=\d+,v1=[0-9a-f]{64},v1=[0-9a-f]{64}$/)
  t.ok(readme(rotatedRequest.raw, twoSignatures, rotated.body.data.secret), 'the README verifier with the new secret')
  t.ok(readme(rotatedRequest.raw, twoSignatures, subscription.secret), '... and with the old one')
  t.ok(stripeVerifyHeader(rotatedRequest.raw, twoSignatures, rotated.body.data.secret), 'Stripe with the new secret')
  t.ok(stripeVerifyHeader(rotatedRequest.raw, twoSignatures, subscription.secret), '... and with the old one')
  t.match(rotatedRequest.headers['webhook-signature'], /^v1,\S{44} v1,\S{44}$/, 'one Standard Webhooks signature per live secret')
  const everyLibrary = { stripe: true, standardwebhooks: true, svix: true }
  t.same(everyVerifierAccepts(rotatedRequest, rotated.body.data.secret), everyLibrary, 'every library with the new secret')
  t.same(everyVerifierAccepts(rotatedRequest, subscription.secret), everyLibrary, '... and with the old one')
})

t.test('test events are sent while paused and never count in the stats or the auto-pause rule', async (t) => {
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  let failing = false
  receiver.answer = () => (failing ? { status: 500 } : { status: 200 })
  const {
    body: { data: subscription },
  } = await server.request('POST', BASE, { token, body: { name: 'P', url: receiver.url, events: ['deal.*'] } })

  t.equal((await server.request('POST', `${BASE}/${subscription.id}/pause`, { token })).status, 200)
  const whilePaused = await server.request('POST', `${BASE}/${subscription.id}/test`, { token, body: { event: 'deal.created' } })
  t.equal(whilePaused.status, 202)
  await receiver.waitFor((all) => all.length === 1)
  t.equal(receiver.received[0].body.test, true, 'sent although the subscription is paused')

  // While paused, a failing test event goes through its whole cycle instead of being held.
  failing = true
  const failingTest = await server.request('POST', `${BASE}/${subscription.id}/test`, { token, body: { event: 'deal.deleted' } })
  const dead = await waitUntil(async () => {
    const answer = await server.request('GET', `${BASE}/${subscription.id}/deliveries/${failingTest.body.data.delivery_id}`, { token })
    return answer.body.data.status === 'dead' ? answer : null
  })
  t.equal(dead.body.data.attempts.length, 7, 'seven attempts while paused')
  // A redelivered test goes out at once while paused too.
  failing = false
  const redelivered = await server.request('POST', `${BASE}/${subscription.id}/deliveries/${failingTest.body.data.delivery_id}/redeliver`, {
    token,
  })
  t.equal(redelivered.status, 202)
  t.equal(redelivered.body.data.status, 'pending', 'not held')
  await receiver.waitFor((all) => all.length === 9)
  t.equal((await server.request('POST', `${BASE}/${subscription.id}/resume`, { token })).status, 200)

  // Twelve failing tests on an active subscription: all dead, and no auto-pause.
  failing = true
  const ids: string[] = []
  for (let i = 0; i < 12; i++) {
    const answer = await server.request('POST', `${BASE}/${subscription.id}/test`, { token, body: { event: 'deal.updated' } })
    ids.push(answer.body.data.delivery_id)
  }
  await waitUntil(
    async () => {
      const log = await server.request('GET', `${BASE}/${subscription.id}/deliveries?status=dead`, { token })
      return log.body.data.length === 12 ? log : null
    },
    20_000,
    'twelve dead test deliveries',
  )
  const read = await server.request('GET', `${BASE}/${subscription.id}`, { token })
  t.equal(read.body.data.status, 'active', 'not paused by test deliveries')
  t.same(read.body.data.stats, { success_rate: null, attempts_24h: 0, deliveries_24h: 0, last_delivery_at: null }, 'no stats from tests')
  const since = new Date(Date.now() - 3600_000).toISOString()
  const preview = await server.request('GET', `${BASE}/${subscription.id}/recover?since=${since}`, { token })
  t.same(preview.body, { data: { deliveries: 0 } }, 'dead test deliveries are not recovered')

  // A real delivery counts as ever.
  failing = false
  await server.request('POST', '/api/deals', { token, body: { name: 'Real', amount: '1.00' } })
  const counted = await waitUntil(async () => {
    const answer = await server.request('GET', `${BASE}/${subscription.id}`, { token })
    return answer.body.data.stats.success_rate === 1 ? answer : null
  })
  t.equal(counted.body.data.stats.deliveries_24h, 1)
})

t.test('what a test event refuses', async (t) => {
  const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin', 'bob@a.test': 'member' }, plan: 'pro' })
  const other = await createTenant(server.databaseUrl, { members: { 'admin@b.test': 'admin' }, plan: 'pro' })
  const free = await createTenant(server.databaseUrl, { members: { 'admin@f.test': 'admin' }, plan: 'free', trialDays: -1 })
  const token = tenant.members['admin@a.test'].token
  const {
    body: { data: subscription },
  } = await server.request('POST', BASE, { token, body: { name: 'x', url: 'http://127.0.0.1:9/', events: ['*'] } })
  const path = `${BASE}/${subscription.id}/test`

  const unknown = await server.request('POST', path, { token, body: { event: 'deal.exploded' } })
  t.equal(unknown.status, 422)
  t.equal(unknown.body.errors[0].pointer, '/event')
  const wildcard = await server.request('POST', path, { token, body: { event: 'deal.*' } })
  t.equal(wildcard.status, 422, 'one event, not a pattern')
  t.equal((await server.request('POST', path, { token, body: { event: 'deal.created', extra: 1 } })).status, 422)
  t.equal((await server.request('POST', path, { token: tenant.members['bob@a.test'].token, body: {} })).status, 403)
  t.equal((await server.request('POST', path, { token: other.members['admin@b.test'].token, body: {} })).status, 404)
  t.equal((await server.request('POST', path, { token: free.members['admin@f.test'].token, body: {} })).status, 402)
  t.equal((await server.request('POST', `${BASE}/not-a-uuid/test`, { token, body: {} })).status, 404)

  // In SQL: the function checks the caller; the table refuses a test row without its event.
  const owner = await ownerClient(t, server.databaseUrl)
  const asUser = async (email: string, slug: string, text: string) => {
    await owner.query('begin')
    try {
      await owner.query('select crm.act_as($1, $2)', [email, slug])
      return await owner.query(text, [subscription.id])
    } finally {
      await owner.query('rollback')
    }
  }
  await t.rejects(asUser('bob@a.test', tenant.slug, `select crm.send_webhook_test_event($1, 'deal.created')`), { code: 'CR403' })
  await t.rejects(asUser('admin@b.test', other.slug, `select crm.send_webhook_test_event($1, 'deal.created')`), { code: 'CR404' })
  await t.rejects(asUser('bob@a.test', tenant.slug, 'select * from crm.webhook_sample_bodies(), (select $1::uuid) x'), { code: 'CR403' })
  const samples = await asUser(
    'admin@a.test',
    tenant.slug,
    'select event, body_head, body_tail from crm.webhook_sample_bodies(), (select $1::uuid) x',
  )
  t.same(
    samples.rows.map((row) => row.event),
    [
      'contact.created',
      'contact.updated',
      'contact.deleted',
      'company.created',
      'company.updated',
      'company.deleted',
      'deal.created',
      'deal.updated',
      'deal.deleted',
    ],
    'the events page has a sample of every event, for admins',
  )
  t.ok(
    samples.rows.every((row) => JSON.parse(`${row.body_head}2026-11-22T03:00:21.123Z${row.body_tail}`).workspace.slug === tenant.slug),
    'each a whole body around delivered_at',
  )
  const made = await asUser('admin@a.test', tenant.slug, `select crm.send_webhook_test_event($1, 'deal.created') as id`)
  t.match(made.rows[0].id, /^[0-9a-f-]{36}$/, 'an admin may')
  await t.rejects(
    owner.query(
      `insert into crm.webhook_deliveries (workspace_id, subscription_id, event_id, event, record_type, record_id, is_test)
       values ($1, $2, gen_random_uuid(), 'deal.created', 'deal', gen_random_uuid(), true)`,
      [tenant.id, subscription.id],
    ),
    { code: '23514' },
    'a test delivery carries its event',
  )
  await t.rejects(
    asUser('admin@a.test', tenant.slug, `update crm.webhook_deliveries set is_test = true where subscription_id = $1`),
    /permission denied/,
    'crm_api cannot mark deliveries',
  )
})

t.test('a subscription whose secret was issued in base64url keeps its X-Service-Signature and gains webhook-signature', async (t) => {
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  const created = await server.request('POST', BASE, { token, body: { name: 'Old', url: receiver.url, events: ['*'] } })
  t.equal(created.status, 201, created.text)
  // A secret as the service issued them before the rule: 32 bytes in base64url.
  const bytes = Buffer.from('fbff'.repeat(16), 'hex')
  const legacy = `whsec_${bytes.toString('base64url')}`
  const owner = await ownerClient(t, server.databaseUrl)
  await owner.query('update crm.webhook_subscriptions set secret_encrypted = $1, secret_last4 = $2 where id = $3', [
    sealWebhookSecret(webhookSecretKey(TEST_APP_SECRET), legacy, tenant.id),
    legacy.slice(-4),
    created.body.data.id,
  ])
  const sent = await server.request('POST', `${BASE}/${created.body.data.id}/test`, { token, body: {} })
  t.equal(sent.status, 202, sent.text)
  const [request] = await receiver.waitFor((all) => all.length >= 1)
  t.same(everyVerifierAccepts(request, legacy), { stripe: true, standardwebhooks: false, svix: false }, 'Stripe with the secret as shown')
  t.same(
    everyVerifierAccepts(request, `whsec_${bytes.toString('base64')}`),
    { stripe: false, standardwebhooks: true, svix: true },
    'the Standard Webhooks libraries with the same bytes in standard base64',
  )
})
