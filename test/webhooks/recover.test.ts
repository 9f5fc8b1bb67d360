// Recovery of dead deliveries (POST .../recover): a receiver outage kills deliveries, the receiver
// comes back, and recovery sends each dead one exactly once more with the same delivery_id; a
// second recovery finds nothing; a paused subscription holds what it recovers; 10,000 dead
// deliveries are re-queued by one call in batches, oldest first; what only dead rows means (no
// delivery already under way is sent twice); the window's rules; who may.
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV, waitUntil } from './receiver.ts'
import { everyVerifierAccepts } from './verifiers.ts'

const BASE = '/api/webhook-subscriptions'
const hourAgo = () => new Date(Date.now() - 3600_000).toISOString()

t.test('a receiver outage: deliveries die, the receiver comes back, recovery sends each once more with its delivery_id', async (t) => {
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const receiver = await startReceiver(t)
  let down = true
  receiver.answer = () => (down ? { status: 503, body: 'upstream unavailable' } : { status: 200 })
  const {
    body: { data: subscription },
  } = await server.request('POST', BASE, { token, body: { name: 'Outage', url: receiver.url, events: ['contact.created'] } })
  const log = `${BASE}/${subscription.id}/deliveries`
  const since = hourAgo()

  for (let i = 0; i < 5; i++) {
    const created = await server.request('POST', '/api/contacts', { token, body: { email: `c${i}@example.com` } })
    t.equal(created.status, 201)
  }
  const dead = await waitUntil(
    async () => {
      const answer = await server.request('GET', `${log}?status=dead`, { token })
      return answer.body.data.length === 5 ? answer.body.data : null
    },
    20_000,
    'five dead deliveries',
  )
  t.equal(receiver.received.length, 35, 'seven attempts each while the receiver was down')
  const deadIds = new Set<string>(dead.map((d: any) => d.delivery_id))

  down = false
  const preview = await server.request('GET', `${BASE}/${subscription.id}/recover?since=${encodeURIComponent(since)}`, { token })
  t.equal(preview.status, 200, preview.text)
  t.same(preview.body, { data: { deliveries: 5 } }, 'the preview counts them and changes nothing')
  t.equal((await server.request('GET', `${log}?status=dead`, { token })).body.data.length, 5)

  const recovered = await server.request('POST', `${BASE}/${subscription.id}/recover`, { token, body: { since } })
  t.equal(recovered.status, 202, recovered.text)
  t.same(recovered.body, { data: { deliveries: 5 } })
  const again = await server.request('POST', `${BASE}/${subscription.id}/recover`, { token, body: { since } })
  t.same(again.body, { data: { deliveries: 0 } }, 'a second recovery right away finds nothing: they are under way')

  await receiver.waitFor((all) => all.length >= 40)
  await waitUntil(async () => {
    const answer = await server.request('GET', `${log}?status=delivered`, { token })
    return answer.body.data.length === 5
  })
  // Time for any duplicate to show up before counting.
  await new Promise((resolve) => setTimeout(resolve, 500))
  const after = receiver.received.slice(35)
  t.equal(after.length, 5, 'exactly one more request per dead delivery')
  t.same(new Set(after.map((r) => r.headers['x-service-delivery-id'])), deadIds, 'with the same delivery_ids')
  t.ok(
    after.every((r) => r.body.delivery_id === r.headers['x-service-delivery-id']),
    'the body carries the same delivery_id',
  )
  t.ok(
    receiver.received.every((r) => r.headers['webhook-id'] === r.headers['x-service-delivery-id']),
    'webhook-id is the delivery id, the same on every retry and after the recovery',
  )
  t.same(
    after.map((r) => everyVerifierAccepts(r, subscription.secret)),
    after.map(() => ({ stripe: true, standardwebhooks: true, svix: true })),
    'each recovered delivery verifies with Stripe, standardwebhooks and svix',
  )
  const one = await server.request('GET', `${log}/${dead[0].delivery_id}`, { token })
  t.match(one.body.data, { status: 'delivered', attempt_count: 8 })
  t.same(
    one.body.data.attempts.map((a: any) => a.response_status),
    [503, 503, 503, 503, 503, 503, 503, 200],
  )
  t.same((await server.request('POST', `${BASE}/${subscription.id}/recover`, { token, body: { since } })).body, {
    data: { deliveries: 0 },
  })

  // A second outage while paused: recovery holds them, resume sends them.
  down = true
  await server.request('POST', '/api/contacts', { token, body: { email: 'late@example.com' } })
  await waitUntil(async () => (await server.request('GET', `${log}?status=dead`, { token })).body.data.length === 1)
  down = false
  t.equal((await server.request('POST', `${BASE}/${subscription.id}/pause`, { token })).status, 200)
  const requestsBefore = receiver.received.length
  const held = await server.request('POST', `${BASE}/${subscription.id}/recover`, { token, body: { since } })
  t.same(held.body, { data: { deliveries: 1 } })
  t.equal((await server.request('GET', `${log}?status=held`, { token })).body.data.length, 1, 'held while paused')
  await new Promise((resolve) => setTimeout(resolve, 300))
  t.equal(receiver.received.length, requestsBefore, 'nothing sent while paused')
  t.equal((await server.request('POST', `${BASE}/${subscription.id}/resume`, { token })).status, 200)
  await receiver.waitFor((all) => all.length === requestsBefore + 1)
  t.equal(receiver.received.at(-1)!.body.data.object.email, 'late@example.com', 'resume sends it')
})

t.test('10,000 dead deliveries are re-queued by one call, in batches of 100, oldest first', async (t) => {
  const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' }, plan: 'pro' })
  const token = tenant.members['admin@a.test'].token
  const {
    body: { data: subscription },
  } = await server.request('POST', BASE, { token, body: { name: 'Bulk', url: 'http://127.0.0.1:9/', events: ['*'] } })
  const owner = await ownerClient(t, server.databaseUrl)
  // Dead deliveries as seven failed attempts leave them, created over the last three hours (event
  // ids in time order), and a few that must stay as they are: one older than the window, one
  // delivered, one retrying (a job owns it), and a dead test delivery.
  await owner.query(
    `insert into crm.webhook_deliveries (workspace_id, id, subscription_id, event_id, event, record_type, record_id, status,
                                         attempt_count, cycle_attempts, created_at, completed_at)
     select $1, crm.webhook_delivery_id(e.id, $2), $2, e.id, 'contact.created', 'contact', gen_random_uuid(), x.status,
            7, 7, e.at, case when x.status in ('dead', 'delivered') then e.at + interval '31 minutes' end
       from generate_series(1, 10003) g
      cross join lateral (select case g when 1 then now() - interval '2 days' else now() - make_interval(secs => 10010 - g) end as at) t
      cross join lateral (select crm.uuid_v7_floor(t.at) as floor) f
      cross join lateral (select overlay(f.floor::text placing lpad(to_hex(g), 12, '0') from 25 for 12)::uuid as id, t.at) e
      cross join lateral (select case g when 10001 then 'delivered' when 10002 then 'retrying' else 'dead' end as status) x`,
    [tenant.id, subscription.id],
  )
  const testDelivery = await owner.query(
    `insert into crm.webhook_deliveries (workspace_id, subscription_id, event_id, event, record_type, record_id, status,
                                         attempt_count, cycle_attempts, completed_at, is_test, test_event)
     values ($1, $2, crm.uuid_v7(), 'deal.created', 'deal', gen_random_uuid(), 'dead', 7, 7, now(), true,
             '{"data": {"object": {}}, "actor": {}}') returning id`,
    [tenant.id, subscription.id],
  )
  const states = async () =>
    Object.fromEntries(
      (
        await owner.query(`select status, count(*)::int as n from crm.webhook_deliveries where subscription_id = $1 group by status`, [
          subscription.id,
        ])
      ).rows.map((row) => [row.status, row.n]),
    )
  t.same(await states(), { dead: 10_002, delivered: 1, retrying: 1 })

  const since = new Date(Date.now() - 86_400_000).toISOString()
  const preview = await server.request('GET', `${BASE}/${subscription.id}/recover?since=${since}`, { token })
  t.same(preview.body, { data: { deliveries: 10_000 } }, 'the window leaves out the older one; the test one is never counted')
  const recovered = await server.request('POST', `${BASE}/${subscription.id}/recover`, { token, body: { since } })
  t.equal(recovered.status, 202, recovered.text)
  t.same(recovered.body, { data: { deliveries: 10_000 } })
  t.same(await states(), { pending: 10_000, dead: 2, delivered: 1, retrying: 1 }, 'only dead rows moved')
  const untouched = await owner.query(
    `select status, generation from crm.webhook_deliveries where subscription_id = $1 and status in ('retrying', 'delivered') or id = $2`,
    [subscription.id, testDelivery.rows[0].id],
  )
  t.ok(
    untouched.rows.every((row) => row.generation === 1),
    'the retrying, delivered and test deliveries keep their generation (no second job)',
  )

  const jobs = await owner.query(
    `select j.payload from graphile_worker._private_jobs j
      join graphile_worker._private_tasks k on k.id = j.task_id and k.identifier = 'deliver_webhook'
     order by j.run_at, j.id`,
  )
  t.equal(jobs.rows.length, 100, '100 jobs')
  t.ok(
    jobs.rows.every((row) => row.payload.d.length === 100 && row.payload.s === subscription.id),
    'of 100 deliveries each',
  )
  const order = await owner.query(
    `select id::text from crm.webhook_deliveries where subscription_id = $1 and status = 'pending' order by event_id`,
    [subscription.id],
  )
  t.same(
    jobs.rows.flatMap((row) => row.payload.d),
    order.rows.map((row) => row.id),
    'jobs due in event order, the oldest first',
  )
  const generations = await owner.query(
    `select count(*)::int as n from crm.webhook_deliveries where subscription_id = $1 and status = 'pending' and generation = 2 and cycle_attempts = 0 and completed_at is null`,
    [subscription.id],
  )
  t.equal(generations.rows[0].n, 10_000, 'each starts a fresh cycle under a new generation')
  t.same((await server.request('POST', `${BASE}/${subscription.id}/recover`, { token, body: { since } })).body, {
    data: { deliveries: 0 },
  })
})

t.test('the window and who may recover', async (t) => {
  const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin', 'bob@a.test': 'member' }, plan: 'pro' })
  const other = await createTenant(server.databaseUrl, { members: { 'admin@b.test': 'admin' }, plan: 'pro' })
  const free = await createTenant(server.databaseUrl, { members: { 'admin@f.test': 'admin' }, plan: 'free', trialDays: -1 })
  const token = tenant.members['admin@a.test'].token
  const {
    body: { data: subscription },
  } = await server.request('POST', BASE, { token, body: { name: 'x', url: 'http://127.0.0.1:9/', events: ['*'] } })
  const path = `${BASE}/${subscription.id}/recover`
  const daysAgo = (days: number) => new Date(Date.now() - days * 86_400_000).toISOString()

  const tooOld = await server.request('POST', path, { token, body: { since: daysAgo(31) } })
  t.equal(tooOld.status, 422)
  t.match(tooOld.body, { code: 'validation_failed', errors: [{ pointer: '/since' }] })
  t.match(tooOld.body.detail, /30 days/)
  t.equal((await server.request('POST', path, { token, body: { since: daysAgo(29) } })).status, 202, '29 days back is fine')
  const backwards = await server.request('POST', path, { token, body: { since: daysAgo(1), until: daysAgo(2) } })
  t.equal(backwards.status, 422)
  t.match(backwards.body, { errors: [{ pointer: '/until' }] })
  t.match((await server.request('POST', path, { token, body: {} })).body, { status: 422, errors: [{ pointer: '/since' }] })
  t.equal((await server.request('POST', path, { token, body: { since: 'yesterday' } })).status, 422)
  t.equal((await server.request('POST', path, { token, body: { since: daysAgo(1), extra: true } })).status, 422)

  for (const query of [
    '',
    `?since=${daysAgo(31)}`,
    '?since=yesterday',
    `?since=${daysAgo(1)}&until=${daysAgo(2)}`,
    `?since=${daysAgo(1)}&x=1`,
  ]) {
    const answer = await server.request('GET', `${path}${query.replaceAll('+', '%2B')}`, { token })
    t.equal(answer.status, 400, `preview ${query || 'without since'}`)
    t.equal(answer.body.code, 'invalid_parameter')
  }
  t.equal((await server.request('GET', `${path}?since=${daysAgo(1)}&until=${daysAgo(0)}`, { token })).status, 200)

  t.equal((await server.request('POST', path, { token: tenant.members['bob@a.test'].token, body: { since: daysAgo(1) } })).status, 403)
  t.equal((await server.request('POST', path, { token: other.members['admin@b.test'].token, body: { since: daysAgo(1) } })).status, 404)
  t.equal((await server.request('GET', `${path}?since=${daysAgo(1)}`, { token: other.members['admin@b.test'].token })).status, 404)
  t.equal((await server.request('POST', path, { token: free.members['admin@f.test'].token, body: { since: daysAgo(1) } })).status, 402)

  // In SQL, as the API's role: the rules hold whoever calls.
  const owner = await ownerClient(t, server.databaseUrl)
  const asUser = async (email: string, slug: string, text: string, values: unknown[]) => {
    await owner.query('begin')
    try {
      await owner.query('select crm.act_as($1, $2)', [email, slug])
      return await owner.query(text, values)
    } finally {
      await owner.query('rollback')
    }
  }
  const recover = 'select crm.recover_webhook_deliveries($1, $2) as n'
  await t.rejects(asUser('bob@a.test', tenant.slug, recover, [subscription.id, daysAgo(1)]), { code: 'CR403' })
  await t.rejects(asUser('admin@b.test', other.slug, recover, [subscription.id, daysAgo(1)]), { code: 'CR404' })
  await t.rejects(asUser('admin@a.test', tenant.slug, recover, [subscription.id, daysAgo(31)]), { code: 'CR422' })
  await t.rejects(asUser('admin@a.test', tenant.slug, 'select crm.webhook_recovery_count($1, $2)', [subscription.id, daysAgo(31)]), {
    code: 'CR422',
  })
  t.equal((await asUser('admin@a.test', tenant.slug, recover, [subscription.id, daysAgo(1)])).rows[0].n, 0)
  await t.rejects(
    asUser('admin@a.test', tenant.slug, `select crm.add_webhook_delivery_jobs(array[]::crm.webhook_deliveries[], now())`, []),
    /permission denied/,
    'the job function stays the worker’s',
  )
})
