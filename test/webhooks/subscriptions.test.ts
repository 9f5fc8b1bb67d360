// Managing subscriptions: validation, the URL guard at save time, the 100 limit, admin-only (routes
// and SQL), the plan gate including a trial that ends, rotation with and without grace, held
// deliveries released in order, delete.
import t from 'tap'
import { verifySignature } from '../../src/webhooks/signature.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV, waitUntil } from './receiver.ts'

const BASE = '/api/webhook-subscriptions'

t.test('validation, the URL guard, paging and the limit of 100', async (t) => {
  const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const post = (body: unknown) => server.request('POST', BASE, { token, body })

  for (const [events, why] of [
    [[], 'empty'],
    [Array.from({ length: 21 }, () => '*'), '21 entries'],
    [['contact.merged'], 'unknown event'],
    [['Contact.*'], 'case'],
  ] as const) {
    const answer = await post({ name: 'x', url: 'http://127.0.0.1:1/', events })
    t.equal(answer.status, 422, `events ${why}`)
    t.equal(answer.body.code, 'validation_failed')
  }
  t.equal((await post({ name: 'x', url: 'http://127.0.0.1:1/', events: ['*'], extra: 1 })).status, 422, 'unknown field')
  t.equal(
    (await post({ name: 'x', url: 'http://127.0.0.1:1/', events: ['contact.*', 'company.created', 'deal.deleted', '*'] })).status,
    201,
    'patterns',
  )

  for (const url of [
    'http://10.0.0.1/',
    'https://localhost.internal/',
    'https://user:pw@127.0.0.1/',
    'ftp://127.0.0.1/',
    'http://[::1]/',
    'not a url',
  ]) {
    const answer = await post({ name: 'x', url, events: ['*'] })
    t.equal(answer.status, 422, url)
    t.equal(answer.body.code, 'url_not_allowed', url)
    t.equal(answer.body.errors[0].pointer, '/url')
  }
  const sub = (await post({ name: 'ok', url: 'http://127.0.0.1:1/', events: ['*'] })).body.data
  const patch = await server.request('PATCH', `${BASE}/${sub.id}`, { token, body: { url: 'http://169.254.169.254/latest' } })
  t.equal(patch.status, 422)
  t.equal(patch.body.code, 'url_not_allowed', 'the URL is checked again on change')
  const put = await server.request('PUT', `${BASE}/${sub.id}`, { token, body: { name: 'renamed', events: ['deal.*', 'deal.*'] } })
  t.equal(put.status, 200, put.text)
  t.match(put.body.data, { name: 'renamed', events: ['deal.*'], url: 'http://127.0.0.1:1/' })
  t.equal((await server.request('GET', `${BASE}/0193aaaa-0000-7000-8000-000000000000`, { token })).status, 404)
  t.equal((await server.request('GET', `${BASE}/nope`, { token })).status, 404)

  for (let i = 2; i < 100; i++) t.equal((await post({ name: `n${i}`, url: 'http://127.0.0.1:1/', events: ['*'] })).status, 201)
  const over = await post({ name: 'one too many', url: 'http://127.0.0.1:1/', events: ['*'] })
  t.equal(over.status, 422, '101st')
  t.equal(over.body.code, 'validation_failed')

  const first = await server.request('GET', `${BASE}?limit=60`, { token })
  t.equal(first.body.data.length, 60)
  const second = await server.request('GET', `${BASE}?limit=60&cursor=${first.body.next_cursor}`, { token })
  t.equal(second.body.data.length, 40)
  t.equal(second.body.next_cursor, null)
  t.equal(new Set([...first.body.data, ...second.body.data].map((s: any) => s.id)).size, 100)
  t.equal((await server.request('GET', `${BASE}?cursor=zzz`, { token })).status, 400)
})

t.test('admins only: a member gets 403 and sees zero rows in SQL', async (t) => {
  const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin', 'bob@a.test': 'member' }, plan: 'pro' })
  const admin = tenant.members['admin@a.test'].token
  const bob = tenant.members['bob@a.test'].token
  const sub = (await server.request('POST', BASE, { token: admin, body: { name: 'x', url: 'http://127.0.0.1:1/', events: ['*'] } })).body
    .data
  for (const [method, path, body] of [
    ['GET', BASE],
    ['POST', BASE, { name: 'x', url: 'http://127.0.0.1:1/', events: ['*'] }],
    ['GET', `${BASE}/${sub.id}`],
    ['PATCH', `${BASE}/${sub.id}`, { name: 'y' }],
    ['DELETE', `${BASE}/${sub.id}`],
    ['POST', `${BASE}/${sub.id}/pause`],
    ['POST', `${BASE}/${sub.id}/resume`],
    ['POST', `${BASE}/${sub.id}/rotate-secret`, {}],
    ['GET', `${BASE}/${sub.id}/deliveries`],
  ] as const) {
    const answer = await server.request(method, path, { token: bob, body })
    t.equal(answer.status, 403, `${method} ${path}`)
    t.equal(answer.body.code, 'forbidden')
  }
  const owner = await ownerClient(t, server.databaseUrl)
  await owner.query(
    `insert into crm.webhook_deliveries (workspace_id, subscription_id, event_id, event, record_type, record_id, status, next_attempt_at)
                     values ($1, $2, gen_random_uuid(), 'contact.created', 'contact', gen_random_uuid(), 'held', null)`,
    [tenant.id, sub.id],
  )
  const count = async (email: string) => {
    await owner.query('begin')
    try {
      await owner.query('select crm.act_as($1, $2)', [email, tenant.slug])
      const {
        rows: [row],
      } = await owner.query(`select (select count(*) from crm.webhook_subscriptions)::int as subs,
        (select count(*) from crm.webhook_deliveries)::int as deliveries`)
      return row
    } finally {
      await owner.query('rollback')
    }
  }
  t.same(await count('bob@a.test'), { subs: 0, deliveries: 0 }, 'a member sees nothing')
  t.same(await count('admin@a.test'), { subs: 1, deliveries: 1 }, 'an admin sees the workspace rows')
  await owner.query('begin')
  await owner.query('select crm.act_as($1, $2)', ['admin@a.test', tenant.slug])
  await t.rejects(
    owner.query(`update crm.webhook_deliveries set status = 'delivered'`),
    /permission denied/,
    'crm_api cannot write deliveries',
  )
  await owner.query('rollback')
  await t.rejects(owner.query(`update crm.webhook_deliveries set id = gen_random_uuid()`), /never change/, 'delivery_id never changes')
})

t.test('the plan gate: free without a trial is refused, and a trial that ends stops deliveries', async (t) => {
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const free = await createTenant(server.databaseUrl, { members: { 'admin@f.test': 'admin' }, plan: 'free', trialDays: -1 })
  const freeToken = free.members['admin@f.test'].token
  const refused = await server.request('POST', BASE, { token: freeToken, body: { name: 'x', url: 'http://127.0.0.1:1/', events: ['*'] } })
  t.equal(refused.status, 402)
  t.equal(refused.body.code, 'plan_required')
  t.equal((await server.request('GET', BASE, { token: freeToken })).status, 402)

  const trial = await createTenant(server.databaseUrl, { members: { 'admin@t.test': 'admin' }, plan: 'free' })
  const token = trial.members['admin@t.test'].token
  const receiver = await startReceiver(t)
  const sub = await server.request('POST', BASE, { token, body: { name: 'x', url: receiver.url, events: ['*'] } })
  t.equal(sub.status, 201, 'allowed during the trial')
  await server.request('POST', '/api/companies', { token, body: { name: 'In trial' } })
  await receiver.waitFor((all) => all.length === 1)

  const owner = await ownerClient(t, server.databaseUrl)
  await owner.query(`update crm.workspaces set trial_ends_at = now() - interval '1 second' where id = $1`, [trial.id])
  t.equal((await server.request('GET', `${BASE}/${sub.body.data.id}`, { token })).status, 402, 'routes answer 402 once the trial ended')
  await server.request('POST', '/api/companies', { token, body: { name: 'After trial' } })
  await waitUntil(
    async () => (await owner.query(`select 1 from graphile_worker.jobs where task_identifier = 'fan_out_event'`)).rowCount === 0,
    5000,
    'fan-out done',
  )
  const { rows } = await owner.query('select count(*)::int as n from crm.webhook_deliveries where workspace_id = $1', [trial.id])
  t.equal(rows[0].n, 1, 'no delivery is created while the plan has lapsed')
  t.equal(receiver.received.length, 1)
})

t.test('rotation with and without grace; pause holds new events and resume releases them in order; delete', async (t) => {
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  const created = (await server.request('POST', BASE, { token, body: { name: 'x', url: receiver.url, events: ['company.created'] } })).body
    .data
  const oldSecret = created.secret

  const rotated = await server.request('POST', `${BASE}/${created.id}/rotate-secret`, { token, body: { grace_period_seconds: 3600 } })
  t.equal(rotated.status, 200, rotated.text)
  const newSecret = rotated.body.data.secret
  t.not(newSecret, oldSecret)
  t.ok(Date.parse(rotated.body.data.previous_secret_expires_at) > Date.now() + 3500_000)
  t.equal((await server.request('GET', `${BASE}/${created.id}`, { token })).body.data.secret_last4, newSecret.slice(-4))
  await server.request('POST', '/api/companies', { token, body: { name: 'During grace' } })
  const [during] = await receiver.waitFor((all) => all.length === 1)
  const header = during.headers['x-service-signature'] as string
  const parts = header.split(',')
  t.equal(parts.length, 3, 't and two v1 during the grace period')
  t.ok(verifySignature(`${parts[0]},${parts[1]}`, during.raw, newSecret), 'the first v1 is the new secret')
  t.ok(verifySignature(`${parts[0]},${parts[2]}`, during.raw, oldSecret), 'the second v1 is the old secret')

  const noGrace = await server.request('POST', `${BASE}/${created.id}/rotate-secret`, { token, body: { grace_period_seconds: 0 } })
  t.equal(noGrace.body.data.previous_secret_expires_at, null)
  await server.request('POST', '/api/companies', { token, body: { name: 'No grace' } })
  const after = (await receiver.waitFor((all) => all.length === 2))[1]
  t.equal((after.headers['x-service-signature'] as string).split(',').length, 2, 'one v1 without grace')
  t.ok(verifySignature(after.headers['x-service-signature'] as string, after.raw, noGrace.body.data.secret))
  t.notOk(verifySignature(after.headers['x-service-signature'] as string, after.raw, newSecret))
  t.equal(
    (await server.request('POST', `${BASE}/${created.id}/rotate-secret`, { token, body: { grace_period_seconds: 604801 } })).status,
    422,
  )

  await server.request('POST', `${BASE}/${created.id}/pause`, { token })
  const names = ['held-1', 'held-2', 'held-3', 'held-4', 'held-5']
  for (const name of names) await server.request('POST', '/api/companies', { token, body: { name } })
  const path = `${BASE}/${created.id}/deliveries`
  await waitUntil(async () => (await server.request('GET', `${path}?status=held`, { token })).body.data.length === 5, 5000, 'five held')
  await new Promise((resolve) => setTimeout(resolve, 200))
  t.equal(receiver.received.length, 2, 'nothing sent while paused')
  await server.request('POST', `${BASE}/${created.id}/resume`, { token })
  const all = await receiver.waitFor((all) => all.length === 7)
  t.same(
    all.slice(2).map((r) => r.body.data.object.name),
    names,
    'released in their original order',
  )

  // Delete: 204, the log goes with it, and a pending delivery's job ends without sending.
  receiver.answer = () => ({ status: 500 })
  await server.request('POST', '/api/companies', { token, body: { name: 'doomed' } })
  await receiver.waitFor((all) => all.length === 8)
  const deleted = await server.request('DELETE', `${BASE}/${created.id}`, { token })
  t.equal(deleted.status, 204)
  t.equal((await server.request('GET', `${BASE}/${created.id}`, { token })).status, 404)
  await new Promise((resolve) => setTimeout(resolve, 1500))
  t.equal(receiver.received.length, 8, 'no retry after delete')
})

t.test('the webhook lists page as the record lists do: the same Link escaping and the same limit problem', async (t) => {
  const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const owner = await ownerClient(t, server.databaseUrl)
  let subscriptionId = ''
  for (const name of ['a', 'b']) {
    subscriptionId = (await server.request('POST', BASE, { token, body: { name, url: 'http://127.0.0.1:1/', events: ['*'] } })).body.data.id
    t.equal((await server.request('POST', '/api/contacts', { token, body: { email: `${name}@paging.test` } })).status, 201)
  }
  for (let i = 0; i < 2; i++) {
    await owner.query(
      `insert into crm.webhook_deliveries (workspace_id, subscription_id, event_id, event, record_type, record_id, status, next_attempt_at)
                       values ($1, $2, gen_random_uuid(), 'contact.created', 'contact', gen_random_uuid(), 'held', null)`,
      [tenant.id, subscriptionId],
    )
  }
  const queryOf = (link: string | null) => /^<[^?>]+\?(.*)&cursor=[A-Za-z0-9_-]+>; rel="next"$/.exec(link ?? '')?.[1]

  const records = await server.request('GET', '/api/contacts?limit=1&filter[email][contains]=paging.test', { token })
  t.equal(queryOf(records.headers.get('link')), 'limit=1&filter[email][contains]=paging.test', 'records keep brackets readable')
  const subscriptions = await server.request('GET', `${BASE}?limit=1&filter[name]=a`, { token })
  t.equal(queryOf(subscriptions.headers.get('link')), 'limit=1&filter[name]=a', 'so do subscriptions')
  const deliveries = await server.request('GET', `${BASE}/${subscriptionId}/deliveries?limit=1&event=contact.created`, { token })
  t.equal(queryOf(deliveries.headers.get('link')), 'limit=1&event=contact.created', 'and deliveries')
  const next = await server.request('GET', /^<([^>]+)>/.exec(subscriptions.headers.get('link')!)![1], { token })
  t.equal(next.status, 200, 'the link is followed as it is')
  t.equal(next.body.data[0].name, 'b')

  const withoutRequestId = ({ request_id: _, ...body }: Record<string, unknown>) => body
  for (const limit of ['0', '201', 'ten']) {
    const expected = await server.request('GET', `/api/contacts?limit=${limit}`, { token })
    t.equal(expected.status, 400)
    t.match(expected.body, { code: 'invalid_parameter', detail: /^limit / })
    for (const path of [BASE, `${BASE}/${subscriptionId}/deliveries`]) {
      const answer = await server.request('GET', `${path}?limit=${limit}`, { token })
      t.equal(answer.status, 400, `${path} limit=${limit}`)
      t.same(withoutRequestId(answer.body), withoutRequestId(expected.body), `${path} limit=${limit}: the records' problem`)
    }
  }
})

t.test('a subscription renders as it always has: every field, in order, with its stats', async (t) => {
  const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const owner = await ownerClient(t, server.databaseUrl)
  const created = await server.request('POST', BASE, {
    token,
    body: { name: 'Billing', url: 'http://127.0.0.1:1/', events: ['deal.*', 'contact.created'] },
  })
  const id = created.body.data.id
  // success_rate counts attempts: a delivered delivery's one success, a dead one's one failure, none for the pending one.
  for (const [status, completed] of [
    ['delivered', true],
    ['delivered', true],
    ['dead', true],
    ['pending', false],
  ] as const) {
    await owner.query(
      `with d as (
         insert into crm.webhook_deliveries (workspace_id, subscription_id, event_id, event, record_type, record_id, status, next_attempt_at, completed_at, attempt_count)
         values ($1, $2, gen_random_uuid(), 'contact.created', 'contact', gen_random_uuid(), $3, null, ${completed ? `now() - interval '1 minute'` : 'null'}, ${completed ? 1 : 0})
         returning workspace_id, id, subscription_id, status, completed_at)
       insert into crm.webhook_attempts (workspace_id, delivery_id, attempt, started_at, duration_ms, response_status, error, subscription_id, is_test)
       select d.workspace_id, d.id, 1, d.completed_at, 5, case d.status when 'delivered' then 200 else 500 end,
              case d.status when 'dead' then 'http_status' end, d.subscription_id, false
         from d where d.completed_at is not null`,
      [tenant.id, id, status],
    )
  }
  t.equal((await server.request('POST', `${BASE}/${id}/pause`, { token })).status, 200)
  const {
    rows: [row],
  } = await owner.query(
    `select s.*, (select max(d.created_at) from crm.webhook_deliveries d where d.subscription_id = s.id) as last_delivery_at
                                               from crm.webhook_subscriptions s where s.id = $1`,
    [id],
  )
  const time = (value: Date | null) => (value === null ? null : value.toISOString())
  const expected = {
    id,
    name: 'Billing',
    url: 'http://127.0.0.1:1/',
    events: ['deal.*', 'contact.created'],
    status: 'paused',
    paused_reason: 'manual',
    paused_at: time(row.paused_at),
    health: 'paused',
    secret_last4: row.secret_last4,
    created_at: time(row.created_at),
    updated_at: time(row.updated_at),
    stats: { success_rate: 0.6667, attempts_24h: 3, deliveries_24h: 4, last_delivery_at: time(row.last_delivery_at) },
  }
  const one = await server.request('GET', `${BASE}/${id}`, { token })
  t.equal(one.text, JSON.stringify({ data: expected }), 'GET one')
  const list = await server.request('GET', BASE, { token })
  t.equal(list.text, JSON.stringify({ data: [expected], next_cursor: null }), 'the list')
  t.equal(
    created.text,
    JSON.stringify({
      data: {
        ...expected,
        status: 'active',
        paused_reason: null,
        paused_at: null,
        health: 'healthy',
        updated_at: created.body.data.updated_at,
        stats: { success_rate: null, attempts_24h: 0, deliveries_24h: 0, last_delivery_at: null },
        secret: created.body.data.secret,
      },
    }),
    'the creation',
  )
})
