// The webhooks screen in a real browser, against the service with its worker and a local
// receiver: create a webhook, see its card and the secret once, watch the stats change after a
// delivery, pause and resume, the address guard's refusal, the workspace switcher and the plan notice.
import t, { type Test } from 'tap'
import { verifySignature } from '../../src/webhooks/signature.ts'
import { addMember, createTenant, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { until } from '../helpers/until.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from '../webhooks/receiver.ts'
import { openBrowser, setPassword, signIn, unlabelledFields } from './browser.ts'

const browser = await openBrowser(t)
if (browser) {
  const { page } = browser
  const PASSWORD = 'correct horse battery'
  const server = await startTestServer(t, { worker: true, env: WEBHOOK_TEST_ENV })
  const receiver = await startReceiver(t)
  const acme = await createTenant(server.databaseUrl, { slug: 'acme', members: { 'ada@acme.test': 'admin' } })
  const ada = acme.members['ada@acme.test']
  const beta = await createTenant(server.databaseUrl, { slug: 'beta', plan: 'free', trialDays: -1, members: {} })
  await withOwner(server.databaseUrl, (client) => addMember(client, beta.id, 'ada@acme.test', 'admin'))
  await withOwner(server.databaseUrl, (client) => client.query("update crm.workspaces set name = 'Beta Ltd' where slug = 'beta'"))
  await setPassword(server.databaseUrl, 'ada@acme.test', PASSWORD)

  const card = () => page.getByRole('article', { name: 'Billing sync' })
  const stat = async (label: string) =>
    (await card().locator('dt', { hasText: label }).locator('xpath=following-sibling::dd[1]').textContent())?.trim()
  const createContact = async (t: Test, email: string) => {
    const response = await server.request('POST', '/api/contacts', {
      token: ada.token,
      headers: { 'x-tenant-slug': 'acme' },
      body: { first_name: 'Lin', email },
    })
    t.equal(response.status, 201, `contact ${email} created`)
  }
  const deliveries = async (status: string) =>
    withOwner(server.databaseUrl, async (client) =>
      Number((await client.query('select count(*) from crm.webhook_deliveries where status = $1', [status])).rows[0].count),
    )

  await signIn(page, server.url, 'ada@acme.test', PASSWORD)
  await page.waitForURL(`${server.url}/contacts`)
  await page.goto(`${server.url}/webhooks`)

  let secret = ''
  t.test('creating a webhook shows its card and its secret once', async (t) => {
    t.ok(await page.getByText('No webhooks yet.').isVisible())
    await page.getByLabel('Name').fill('Billing sync')
    await page.getByLabel('Endpoint URL').fill(`${receiver.url}/hooks/crm`)
    await page.getByLabel('Event').selectOption('contact.*')
    await page.getByRole('button', { name: 'Create webhook' }).click()
    await page.getByRole('heading', { name: 'Webhook “Billing sync” created' }).waitFor()
    secret = await page.getByLabel('Signing secret').inputValue()
    t.match(secret, /^whsec_[A-Za-z0-9+/]{43}=$/)
    t.ok(await page.getByRole('button', { name: 'Copy' }).isVisible(), 'a copy button (shown by the script)')
    await browser.screenshot('webhooks-created')
    t.same(await unlabelledFields(page), [], 'every field has a label')
    t.equal(await card().locator('.url').textContent(), `${receiver.url}/hooks/crm`)
    t.equal(await stat('Event'), 'contact.*')
    t.equal(await stat('Status'), 'Active')
    t.equal(await stat('Secret'), `…${secret.slice(-4)}`, 'only the last 4 characters afterwards')
    t.equal(await stat('Deliveries (24 h)'), '0')
    t.equal(await stat('Last delivery'), 'Never')
    t.equal(await stat('Success rate'), 'No attempts')
    t.equal(await stat('Health'), 'Healthy')

    await page.reload()
    t.equal(await page.getByLabel('Signing secret').count(), 0, 'the secret is not shown again on reload')
    t.notOk((await page.content()).includes(secret), 'nor anywhere in the page')
  })

  t.test('a delivery changes the card’s stats', async (t) => {
    await createContact(t, 'lin@example.com')
    const [request] = await receiver.waitFor((received) => received.length >= 1)
    t.equal(request.path, '/hooks/crm')
    t.equal(request.headers['x-service-event'], 'contact.created')
    t.ok(verifySignature(String(request.headers['x-service-signature']), request.raw, secret), 'signed with the secret the page showed')
    await until('delivered', async () => (await deliveries('delivered')) === 1)
    await page.goto(`${server.url}/webhooks`)
    t.equal(await stat('Deliveries (24 h)'), '1')
    t.equal(await stat('Success rate'), '100% of 1 attempt')
    t.match(await stat('Last delivery'), /^\d{4}-\d\d-\d\d \d\d:\d\d UTC$/)
    await browser.screenshot('webhooks')
  })

  t.test('pause holds deliveries and resume sends them', async (t) => {
    await card().getByRole('button', { name: 'Pause' }).click()
    await page.waitForURL(`${server.url}/webhooks`)
    t.equal(await stat('Status'), 'Paused')
    t.equal(await stat('Health'), 'Paused')
    t.equal(await card().getByRole('button', { name: 'Resume' }).count(), 1, 'Resume replaces Pause')
    await createContact(t, 'kim@example.com')
    await until('held', async () => (await deliveries('held')) === 1)
    t.equal(receiver.received.length, 1, 'nothing is sent while paused')
    await page.reload()
    t.equal(await stat('Deliveries (24 h)'), '2')

    await card().getByRole('button', { name: 'Resume' }).click()
    await page.waitForURL(`${server.url}/webhooks`)
    t.equal(await stat('Status'), 'Active')
    await receiver.waitFor((received) => received.length >= 2)
    t.equal(receiver.received[1].body.data.object.email, 'kim@example.com', 'the held delivery goes out on resume')
    await until('delivered', async () => (await deliveries('delivered')) === 2)
    await page.reload()
    t.equal(await stat('Success rate'), '100% of 2 attempts')
  })

  t.test('a refused endpoint is explained in plain words and the form keeps its values', async (t) => {
    await page.getByLabel('Name').fill('Internal')
    await page.getByLabel('Endpoint URL').fill('https://10.1.2.3/hook')
    await page.getByLabel('Event').selectOption('*')
    await page.getByRole('button', { name: 'Create webhook' }).click()
    await page.getByRole('alert').waitFor()
    t.match(await page.getByRole('alert').textContent(), /^This endpoint URL is not allowed: /)
    t.equal(await page.getByLabel('Name').inputValue(), 'Internal')
    t.equal(await page.getByLabel('Event').inputValue(), '*')
    t.equal(await page.getByRole('article').count(), 1, 'nothing was created')
  })

  t.test('the workspace switcher and the plan notice', async (t) => {
    await page.goto(`${server.url}/webhooks`)
    await page.getByLabel('Workspace').selectOption('beta')
    await page.getByRole('button', { name: 'Switch' }).click()
    await page.waitForURL(`${server.url}/webhooks`)
    t.equal(await page.getByLabel('Workspace').inputValue(), 'beta')
    await page.getByRole('heading', { name: 'Webhooks need the Pro plan' }).waitFor()
    t.match(await page.locator('.notice.plan').textContent(), /Free plan\. The free trial ended on/)
    t.equal(await page.getByRole('button', { name: 'Create webhook' }).count(), 0, 'no form without the plan')
    await browser.screenshot('webhooks-plan-required')
    await page.getByLabel('Workspace').selectOption('acme')
    await page.getByRole('button', { name: 'Switch' }).click()
    await page.waitForURL(`${server.url}/webhooks`)
    t.equal(await page.getByRole('article').count(), 1, 'back in acme')
  })
}
