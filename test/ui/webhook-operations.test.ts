// An integrator's worst afternoon in a real browser: the receiver is down and deliveries die; the
// delivery log shows them (filters, pages), a delivery shows every attempt with its answer and the
// request as sent; the receiver comes back, "Recover failed since…" says how many it will resend,
// resends them once each with their delivery ids; a test event checks the endpoint, Redeliver sends
// one again, and the events page shows a sample of every event. Screenshots for docs/screenshots.
import t from 'tap'
import { verifySignature } from '../../src/webhooks/signature.ts'
import { createTenant, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from '../webhooks/receiver.ts'
import { stripeVerifyHeader } from '../webhooks/verifiers.ts'
import { openBrowser, setPassword, signIn, unlabelledFields } from './browser.ts'

const browser = await openBrowser(t)
if (browser) {
  const { page } = browser
  const PASSWORD = 'correct horse battery'
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const receiver = await startReceiver(t)
  let down = true
  receiver.answer = () =>
    down
      ? { status: 503, body: '<html><body><h1>503 Service Unavailable</h1>upstream connect error</body></html>' }
      : { status: 200, body: '{"received":true}' }
  const acme = await createTenant(server.databaseUrl, { slug: 'acme', plan: 'pro', members: { 'ada@acme.test': 'admin' } })
  const ada = acme.members['ada@acme.test']
  await setPassword(server.databaseUrl, 'ada@acme.test', PASSWORD)
  const created = await server.request('POST', '/api/webhook-subscriptions', {
    token: ada.token,
    body: { name: 'Billing sync', url: `${receiver.url}/hooks/crm`, events: ['contact.*'] },
  })
  const subscription = created.body.data

  const card = () => page.getByRole('article', { name: 'Billing sync' })
  const count = (status: string) =>
    withOwner(server.databaseUrl, async (client) =>
      Number((await client.query('select count(*) from crm.webhook_deliveries where status = $1 and not is_test', [status])).rows[0].count),
    )
  const waitFor = async (what: string, check: () => Promise<boolean>) => {
    const deadline = Date.now() + 20_000
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error(`${what}: not within 20 s`)
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  }
  const createContacts = async (emails: string[]) => {
    for (const email of emails) {
      const response = await server.request('POST', '/api/contacts', { token: ada.token, body: { first_name: 'Lin', email } })
      if (response.status !== 201) throw new Error(response.text)
    }
  }
  const rows = () => page.locator('table.deliveries tbody tr')

  await signIn(page, server.url, 'ada@acme.test', PASSWORD)
  await page.waitForURL(`${server.url}/contacts`)

  const deadIds = new Set<string>()
  t.test('deliveries die while the receiver is down, and the log shows why', async (t) => {
    await createContacts(['kim@example.com', 'noor@example.com', 'ola@example.com'])
    await waitFor('three dead', async () => (await count('dead')) === 3)
    t.equal(receiver.received.length, 21, 'seven attempts each')
    for (const request of receiver.received) deadIds.add(String(request.headers['x-service-delivery-id']))

    await page.goto(`${server.url}/webhooks`)
    await card().getByRole('link', { name: 'Delivery log of Billing sync' }).click()
    await page.getByRole('heading', { name: 'Delivery log of Billing sync' }).waitFor()
    t.equal(await rows().count(), 3, 'three deliveries')
    t.equal(await rows().locator('.badge.dead').count(), 3, 'all failed')
    t.same(await unlabelledFields(page), [], 'every field has a label')
    await browser.screenshot('webhook-delivery-log')

    await page.getByLabel('Status').selectOption('dead')
    await page.getByRole('button', { name: 'Filter' }).click()
    await page.waitForURL(/status=dead/)
    t.equal(await rows().count(), 3, 'filtered by status')
    await page.getByLabel('Event').selectOption('contact.updated')
    await page.getByRole('button', { name: 'Filter' }).click()
    await page.waitForURL(/event=contact.updated/)
    await page.getByText('No deliveries match.').waitFor()
    t.pass('filtered by event')

    await page.goto(`${server.url}/webhooks/${subscription.id}/deliveries`)
    await rows().first().getByRole('link').click()
    await page.getByRole('heading', { name: 'Attempts' }).waitFor()
    const attempts = page.locator('table.attempts tbody tr')
    t.equal(await attempts.count(), 7, 'every attempt')
    t.match(await attempts.first().textContent(), /503.*HTTP error status/s)
    t.match(await attempts.first().locator('pre.excerpt').textContent(), /upstream connect error/, 'the answer’s first bytes')
    const headers = page.locator('table.headers')
    t.match(await headers.textContent(), /x-service-signature\s*t=\d+,v1=[0-9a-f]{64}/, 'the request headers, signature included')
    t.match(await headers.textContent(), /x-service-event\s*contact\.created/)
    const recordLink = page.getByRole('link', { name: /^contact [0-9a-f-]{36}$/ })
    t.match(await recordLink.getAttribute('href'), /^\/contacts\/[0-9a-f-]{36}$/, 'the delivery links to its record')
    const body = await page.getByLabel('Body as sent').textContent()
    t.match(body, /^\{"id":"[0-9a-f-]{36}","event":"contact.created"/, 'the body as sent')
    t.ok(
      verifySignature(
        String((await headers.locator('tr', { hasText: 'x-service-signature' }).locator('td').textContent())?.trim()),
        body!,
        subscription.secret,
        { toleranceSeconds: 3600 },
      ),
      'the shown signature verifies against the shown body',
    )
    t.equal(await page.getByRole('button', { name: 'Redeliver' }).count(), 1, 'Redeliver for a failed delivery')
    await browser.screenshot('webhook-delivery')
  })

  t.test('the receiver comes back: "Recover failed since…" counts, asks, and resends each once', async (t) => {
    down = false
    await page.goto(`${server.url}/webhooks`)
    await card().getByText('Recover failed since…').click()
    const since = card().getByLabel('Failed since (UTC)')
    const value = await since.inputValue()
    t.match(value, /^\d{4}-\d\d-\d\dT\d\d:\d\d$/)
    t.ok(Math.abs(Date.parse(`${value}:00Z`) - (Date.now() - 86_400_000)) < 120_000, 'the last 24 hours by default')
    t.same(await unlabelledFields(page), [], 'every field of the cards has a label')
    await browser.screenshot('webhook-card-recover')
    await card().getByRole('button', { name: 'Review failed deliveries of Billing sync' }).click()
    await page.getByRole('heading', { name: 'Recover failed deliveries of Billing sync' }).waitFor()
    t.match(await page.getByRole('status').first().textContent(), /3 failed deliveries created since .* will be sent again/)
    t.equal(receiver.received.length, 21, 'nothing is sent before the confirmation')
    await browser.screenshot('webhook-recover-confirm')

    await page.getByRole('button', { name: 'Resend 3 failed deliveries' }).click()
    await page.waitForURL(/\/deliveries/)
    t.match(await page.getByRole('status').first().textContent(), /3 failed deliveries are being sent again/)
    await receiver.waitFor((all) => all.length >= 24)
    await waitFor('delivered', async () => (await count('delivered')) === 3)
    await new Promise((resolve) => setTimeout(resolve, 400))
    const resent = receiver.received.slice(21)
    t.equal(resent.length, 3, 'one more request per failed delivery')
    t.same(new Set(resent.map((r) => String(r.headers['x-service-delivery-id']))), deadIds, 'with the same delivery ids')
    await page.goto(`${server.url}/webhooks/${subscription.id}/deliveries`)
    t.equal(await rows().locator('.badge.delivered').count(), 3)
    await browser.screenshot('webhook-recovered')

    // A second look finds nothing left to resend.
    await page.goto(`${server.url}/webhooks`)
    await card().getByText('Recover failed since…').click()
    await card().getByRole('button', { name: 'Review failed deliveries of Billing sync' }).click()
    await page.getByText('No failed deliveries were created since').waitFor()
    t.equal(await page.getByRole('button', { name: /^Resend/ }).count(), 0)
    // A time beyond the log's 30 days is explained.
    await page.getByLabel('Failed since (UTC)').fill(new Date(Date.now() - 40 * 86_400_000).toISOString().slice(0, 16))
    await page.getByRole('button', { name: 'Review' }).click()
    t.match(await page.getByRole('alert').textContent(), /within the last 30 days/)
  })

  t.test('a test event from the card, verified by the receiver, and Redeliver', async (t) => {
    await page.goto(`${server.url}/webhooks`)
    await card().getByText('Send test event').click()
    await card().getByLabel('Sample to send').selectOption('contact.updated')
    await card().getByRole('button', { name: 'Send the sample to Billing sync' }).click()
    await page.waitForURL(/\/deliveries\/[0-9a-f-]{36}$/)
    const deliveryId = page.url().split('/').at(-1)!
    const [request] = (await receiver.waitFor((all) => all.some((r) => r.body?.test === true))).filter((r) => r.body?.test === true)
    t.equal(request.headers['x-service-delivery-id'], deliveryId)
    t.equal(request.body.event, 'contact.updated')
    t.ok('previous_attributes' in request.body.data)
    t.ok(
      stripeVerifyHeader(request.raw, String(request.headers['x-service-signature']), subscription.secret),
      'verifies with Stripe’s scheme',
    )
    await waitFor('test delivered', async () => {
      await page.reload()
      return (await page.locator('.badge.delivered').count()) === 1
    })
    t.equal(await page.locator('h1 .tag').textContent(), 'test', 'marked as a test')
    t.equal(await page.getByLabel('Body as sent').textContent(), request.raw.toString('latin1'), 'the body shown is the body sent')
    t.match(
      await page.locator('table.headers').textContent(),
      new RegExp(String(request.headers['x-service-signature'])),
      'the signature sent',
    )
    await browser.screenshot('webhook-test-event')

    await page.getByRole('button', { name: 'Redeliver' }).click()
    await page.waitForURL(new RegExp(`/deliveries/${deliveryId}$`))
    await receiver.waitFor((all) => all.filter((r) => r.headers['x-service-delivery-id'] === deliveryId).length === 2)
    t.pass('Redeliver sends it again with the same delivery id')

    await page.goto(`${server.url}/webhooks`)
    t.equal(
      await card().locator('dt', { hasText: 'Deliveries (24 h)' }).locator('xpath=following-sibling::dd[1]').textContent(),
      '3',
      'tests are not counted',
    )
  })

  t.test('the log pages back, newest first', async (t) => {
    await createContacts(Array.from({ length: 25 }, (_, i) => `p${i}@example.com`))
    await waitFor('delivered', async () => (await count('delivered')) === 28)
    await page.goto(`${server.url}/webhooks/${subscription.id}/deliveries`)
    t.equal(await rows().count(), 25, 'a page of 25')
    await page.getByRole('link', { name: 'Older deliveries' }).click()
    await page.waitForURL(/cursor=/)
    t.equal(await rows().count(), 4, 'the rest on the next page (3 recovered and the test event)')
    t.equal(await page.getByRole('link', { name: 'Newest' }).count(), 1)
  })

  t.test('the events page shows a sample body of every event', async (t) => {
    await page.goto(`${server.url}/webhooks`)
    await page.getByRole('link', { name: 'The events and their bodies' }).click()
    await page.getByRole('heading', { name: 'Webhook events' }).waitFor()
    const sections = page.locator('section.event')
    t.equal(await sections.count(), 9)
    const dealUpdated = JSON.parse(
      (await page
        .locator('section.event', { has: page.locator('#deal\\.updated') })
        .locator('pre')
        .textContent())!,
    )
    t.same(Object.keys(dealUpdated), ['id', 'event', 'occurred_at', 'delivered_at', 'delivery_id', 'workspace', 'data', 'actor'])
    t.equal(dealUpdated.workspace.slug, 'acme')
    t.ok(dealUpdated.data.previous_attributes.stage, 'a stage change')
    await browser.screenshot('webhook-events')
  })

  t.test('the forms refuse a post without the CSRF token', async (t) => {
    const cookies = (await browser.context.cookies()).map((cookie) => `${cookie.name}=${cookie.value}`).join('; ')
    for (const path of [`/webhooks/${subscription.id}/recover`, `/webhooks/${subscription.id}/test`]) {
      const response = await fetch(`${server.url}${path}`, {
        method: 'POST',
        headers: { cookie: cookies, 'content-type': 'application/x-www-form-urlencoded' },
        body: 'since=2026-01-01T00:00&confirm=yes&event=contact.created',
        redirect: 'manual',
      })
      t.equal(response.status, 403, path)
    }
  })
}
