// Webhook health in a real browser: an endpoint that fails every attempt shows "Failing" and its
// success rate with the attempts it counts (not "Active, 100 %"); a retrying delivery offers
// "Retry now", which attempts it at once, and the card turns healthy again.
import t from 'tap'
import { createTenant, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { until } from '../helpers/until.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from '../webhooks/receiver.ts'
import { axeViolations, openBrowser, setPassword, signIn, unlabelledFields } from './browser.ts'

const browser = await openBrowser(t)
if (browser) {
  const { page } = browser
  const PASSWORD = 'correct horse battery'
  // An hour between attempts: a failed delivery stays retrying for the whole test.
  const server = await startTestServer(t, { worker: true, env: { ...WEBHOOK_TEST_ENV, WEBHOOK_RETRY_SCHEDULE: '1h,1h,1h,1h,1h,1h' } })
  const receiver = await startReceiver(t)
  let down = true
  receiver.answer = () => (down ? { status: 503, body: 'upstream connect error' } : { status: 200 })
  const acme = await createTenant(server.databaseUrl, { slug: 'acme', plan: 'pro', members: { 'ada@acme.test': 'admin' } })
  const ada = acme.members['ada@acme.test']
  await setPassword(server.databaseUrl, 'ada@acme.test', PASSWORD)
  const subscription = (
    await server.request('POST', '/api/webhook-subscriptions', {
      token: ada.token,
      body: { name: 'Billing sync', url: `${receiver.url}/hooks/crm`, events: ['contact.*'] },
    })
  ).body.data
  const card = () => page.getByRole('article', { name: 'Billing sync' })
  const stat = async (label: string) =>
    (await card().locator('dt', { hasText: label }).locator('xpath=following-sibling::dd[1]').textContent())?.trim()
  const count = (status: string) =>
    withOwner(server.databaseUrl, async (client) =>
      Number((await client.query('select count(*) from crm.webhook_deliveries where status = $1', [status])).rows[0].count),
    )

  await signIn(page, server.url, 'ada@acme.test', PASSWORD)
  // Everyone lands on the records; the webhooks are behind the navigation.
  await page.waitForURL(`${server.url}/contacts`)
  await page.goto(`${server.url}/webhooks`)

  t.test('an endpoint failing every attempt shows Failing and 0 % of its attempts', async (t) => {
    for (const email of ['a@example.com', 'b@example.com', 'c@example.com']) {
      const created = await server.request('POST', '/api/contacts', { token: ada.token, body: { email } })
      t.equal(created.status, 201)
    }
    await until('three retrying', async () => (await count('retrying')) === 3)
    await page.reload()
    t.equal(await stat('Status'), 'Active')
    t.equal(await stat('Health'), 'Failing (last 3 attempts failed)')
    t.equal(await stat('Success rate'), '0% of 3 attempts')
    t.same(await axeViolations(page), [], 'axe finds nothing on the webhooks page')
    await browser.screenshot('webhooks-failing')
  })

  t.test('Retry now on a retrying delivery attempts it at once, and the card heals', async (t) => {
    const log = await server.request('GET', `/api/webhook-subscriptions/${subscription.id}/deliveries?status=retrying&limit=1`, {
      token: ada.token,
    })
    const deliveryId = log.body.data[0].delivery_id
    await page.goto(`${server.url}/webhooks/${subscription.id}/deliveries/${deliveryId}`)
    t.equal(await page.getByRole('button', { name: 'Redeliver' }).count(), 0, 'no fresh cycle for a delivery still retrying')
    t.equal(await page.getByRole('button', { name: 'Retry now' }).count(), 1)
    t.same(await unlabelledFields(page), [])
    t.same(await axeViolations(page), [], 'axe finds nothing on the delivery page')
    await browser.screenshot('webhook-delivery-retry-now')
    down = false
    await page.getByRole('button', { name: 'Retry now' }).click()
    await page.waitForURL(`${server.url}/webhooks/${subscription.id}/deliveries/${deliveryId}`)
    await until('delivered', async () => (await count('delivered')) === 1)
    t.equal(receiver.received.length, 4, 'one attempt more')
    await page.reload()
    t.equal(await page.getByRole('button', { name: 'Retry now' }).count(), 0, 'delivered: nothing to retry')
    t.equal(await page.getByRole('button', { name: 'Redeliver' }).count(), 1)
    await page.goto(`${server.url}/webhooks`)
    t.equal(await stat('Health'), 'Healthy', 'the latest attempt succeeded')
    t.equal(await stat('Success rate'), '25% of 4 attempts')
  })
}
