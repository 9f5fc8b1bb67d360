// Contacts, companies and deals in a real browser (docs/api.md section 12): a member creates a
// contact, finds it by search, opens, edits it and sees the change in its history, meets a conflict
// when someone saved first, and deletes it; a member whose role only views their own records sees
// no buttons that would fail and gets an HTML 404 for a record outside their scope. Every page
// shown passes axe-core and fits 375 px without sideways scrolling.
import type { Page } from 'playwright-core'
import t, { type Test } from 'tap'
import { addMember, createTenant, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { axeViolations, openBrowser, overflowX, setPassword, signIn, unlabelledFields } from './browser.ts'

const browser = await openBrowser(t)
if (browser) {
  const server = await startTestServer(t)
  const { page } = browser
  const PASSWORD = 'correct horse battery'
  const acme = await createTenant(server.databaseUrl, {
    slug: 'acme',
    members: { 'ada@acme.test': 'admin', 'sam@acme.test': 'member' },
  })
  const ada = acme.members['ada@acme.test'].token
  const viewerRole = await server.request('POST', '/api/roles', {
    token: ada,
    body: { name: 'viewer', grants: ['contacts:view:own', 'companies:view:own', 'deals:view:own'] },
  })
  if (viewerRole.status !== 201) throw new Error(`the viewer role was not created: ${viewerRole.status}`)
  const vera = await withOwner(server.databaseUrl, (client) => addMember(client, acme.id, 'vera@acme.test', 'viewer'))
  for (const email of ['sam@acme.test', 'vera@acme.test']) await setPassword(server.databaseUrl, email, PASSWORD)
  const adaContact = await server.request('POST', '/api/contacts', {
    token: ada,
    body: { first_name: 'Ada', email: 'ada.contact@acme.test' },
  })
  const veraContact = await server.request('POST', '/api/contacts', {
    token: ada,
    body: { first_name: 'Vera', last_name: 'Own', owner_id: vera.id },
  })
  const company = await server.request('POST', '/api/companies', { token: ada, body: { name: 'Initech', domain: 'initech.test' } })
  await server.request('POST', '/api/deals', {
    token: ada,
    body: { name: 'Big deal', amount: '1200.00', company_id: company.body.data.id },
  })

  /** axe-core, labels and 375 px on the page shown. */
  const checkPage = async (t: Test, p: Page, name: string) => {
    t.same(await axeViolations(p), [], `${name}: no axe-core violation`)
    t.same(await unlabelledFields(p), [], `${name}: every field has a label`)
    await p.setViewportSize({ width: 375, height: 800 })
    t.same(await overflowX(p), [], `${name}: nothing scrolls sideways at 375 px`)
    await browser.screenshot(`records-${name}`)
    await p.setViewportSize({ width: 1200, height: 860 })
  }

  await signIn(page, server.url, 'sam@acme.test', PASSWORD)
  await page.waitForURL(`${server.url}/contacts`)
  let contactUrl = ''

  t.test('a member lands on Contacts and creates a contact', async (t) => {
    const nav = page.getByRole('navigation', { name: 'Main' }).getByRole('link')
    t.same((await nav.allTextContents()).slice(0, 3), ['Contacts', 'Companies', 'Deals'], 'records first in the navigation')
    await page.getByRole('heading', { name: 'Contacts', level: 1 }).waitFor()
    await checkPage(t, page, 'contacts-list')
    await page.getByRole('link', { name: 'New contact' }).click()
    await page.waitForURL(`${server.url}/contacts/new`)
    await page.getByLabel('First name').fill('Grace')
    await page.getByLabel('Last name').fill('Hopper')
    await page.getByLabel('Email').fill('not an email')
    await page.getByRole('button', { name: 'Save' }).click()
    await page.locator('#field-email-error').waitFor()
    t.match(await page.locator('#field-email-error').textContent(), /email/i, 'the API’s message beside the field')
    t.equal(await page.getByLabel('First name').inputValue(), 'Grace', 'what was typed stays')
    await checkPage(t, page, 'contact-form-errors')
    await page.getByLabel('Email').fill('grace@navy.test')
    await page.getByLabel('New custom field name').fill('tier')
    await page.getByLabel('Its value').fill('gold')
    await page.getByRole('button', { name: 'Save' }).click()
    await page.waitForURL(/\/contacts\/[0-9a-f-]{36}$/)
    contactUrl = page.url()
    await page.getByRole('heading', { name: 'Grace Hopper', level: 1 }).waitFor()
    t.match(await page.locator('main').textContent(), /tier\s*gold/, 'the custom field is shown')
  })

  t.test('search finds it and the list links to it', async (t) => {
    await page.goto(`${server.url}/contacts`)
    await page.getByLabel('Search').fill('hopper')
    await page.getByRole('button', { name: 'Apply' }).click()
    await page.waitForURL(/q=hopper/)
    t.match(await page.locator('p.count').textContent(), /Showing contacts 1–1/)
    await page.getByRole('link', { name: 'Grace Hopper' }).click()
    await page.waitForURL(contactUrl)
  })

  t.test('edit saves through the API and the history shows the change', async (t) => {
    await page.getByRole('link', { name: 'Edit' }).click()
    await page.getByLabel('Job title').fill('Rear admiral')
    await page.getByLabel('tier').fill('platinum')
    await checkPage(t, page, 'contact-edit')
    await page.getByRole('button', { name: 'Save' }).click()
    await page.waitForURL(contactUrl)
    const history = page.locator('table.history')
    await history.waitFor()
    t.match(await history.textContent(), /Job title\s*—\s*Rear admiral\s*sam@acme\.test/, 'field, old, new, who')
    t.match(await history.textContent(), /Tier\s*gold\s*platinum/, 'the custom field’s change')
    t.equal(await history.locator('tbody tr').first().locator('td').nth(5).textContent(), 'ui', 'via the UI')
    const uuid = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/
    t.match(await history.textContent(), /Owner\s*created\s*—\s*You/, 'the owner by name, like the field above')
    t.notMatch(await page.locator('main').textContent(), uuid, 'no member is shown by id: authors and owners by name')
    await checkPage(t, page, 'contact-page')
  })

  t.test('saving over a newer version shows the conflict and keeps what was typed', async (t) => {
    await page.getByRole('link', { name: 'Edit' }).click()
    await page.getByLabel('City').fill('Arlington')
    const id = contactUrl.split('/').at(-1)
    const other = await server.request('PATCH', `/api/contacts/${id}`, { token: ada, body: { city: 'New York' } })
    t.equal(other.status, 200, 'someone else saves first')
    await page.getByRole('button', { name: 'Save' }).click()
    await page.getByRole('alert').waitFor()
    t.match(await page.getByRole('alert').textContent(), /saved this contact after you opened it/)
    t.equal(await page.getByLabel('City').inputValue(), 'Arlington', 'the typed value stays')
    t.match(await page.locator('main').textContent(), /Saved meanwhile: New York/)
    await checkPage(t, page, 'contact-conflict')
    const stored = await server.request('GET', `/api/contacts/${id}`, { token: ada })
    t.equal(stored.body.data.city, 'New York', 'nothing was overwritten')
    await page.getByRole('button', { name: 'Save' }).click()
    await page.waitForURL(contactUrl)
    t.equal((await server.request('GET', `/api/contacts/${id}`, { token: ada })).body.data.city, 'Arlington', 'saving again replaces it')
  })

  t.test('associations are links, linked and unlinked through the API', async (t) => {
    await page.goto(contactUrl)
    await page.getByLabel('Link a').selectOption('companies')
    await page.getByLabel('with id').fill(company.body.data.id)
    await page.getByRole('button', { name: 'Link', exact: true }).click()
    await page.waitForURL(contactUrl)
    const link = page.locator('#links-heading + .two-col').getByRole('link', { name: 'Initech' })
    t.equal(await link.getAttribute('href'), `/companies/${company.body.data.id}`, 'the company as a link')
    const id = contactUrl.split('/').at(-1)
    t.same((await server.request('GET', `/api/associations/contacts/${id}`, { token: ada })).body.data.companies, [company.body.data.id])
    await page.getByRole('button', { name: 'Unlink Initech' }).click()
    await page.waitForURL(contactUrl)
    t.same((await server.request('GET', `/api/associations/contacts/${id}`, { token: ada })).body.data.companies, [], 'unlinked')
    t.match(
      await page.locator('table.history').textContent(),
      /Linked companies\s*removed: —\s*added: [0-9a-f-]{36}/,
      'the link is in the history',
    )
  })

  t.test('keyboard only: from the list to a new contact', async (t) => {
    await page.goto(`${server.url}/contacts`)
    const focused = () =>
      page.evaluate(() => document.activeElement?.textContent?.trim() || (document.activeElement as HTMLInputElement | null)?.name)
    let steps = 0
    while ((await focused()) !== 'New contact' && steps++ < 30) await page.keyboard.press('Tab')
    t.equal(await focused(), 'New contact', 'reached by Tab')
    await page.keyboard.press('Enter')
    await page.waitForURL(`${server.url}/contacts/new`)
    while ((await focused()) !== 'first_name' && steps++ < 60) await page.keyboard.press('Tab')
    await page.keyboard.type('Katherine')
    await page.keyboard.press('Tab')
    await page.keyboard.type('Johnson')
    await page.keyboard.press('Enter')
    await page.waitForURL(/\/contacts\/[0-9a-f-]{36}$/)
    t.ok(await page.getByRole('heading', { name: 'Katherine Johnson', level: 1 }).isVisible(), 'created with the keyboard alone')
  })

  t.test('delete asks first', async (t) => {
    await page.goto(contactUrl)
    await page.getByRole('link', { name: 'Delete' }).click()
    await page.getByRole('heading', { name: 'Delete Grace Hopper?' }).waitFor()
    await checkPage(t, page, 'contact-delete')
    await page.getByRole('button', { name: 'Delete contact' }).click()
    await page.waitForURL(`${server.url}/contacts`)
    t.match(await page.getByRole('status').first().textContent(), /Contact deleted/)
    const gone = await page.goto(contactUrl)
    t.equal(gone?.status(), 404, 'the deleted contact is a 404 page')
  })

  t.test('the companies and deals lists, a deal, and the admin pages fit 375 px', async (t) => {
    for (const path of ['/companies', '/deals']) {
      await page.goto(`${server.url}${path}`)
      await checkPage(t, page, path.slice(1))
    }
    t.match(await page.locator('table.records').textContent(), /Big deal.*Lead.*1200\.00.*Initech/s, 'deal columns')
    t.ok(await page.getByRole('link', { name: 'Board' }).isVisible(), 'a link to the board')
    await page.getByRole('link', { name: 'Big deal' }).click()
    await checkPage(t, page, 'deal-page')
  })

  t.test('every admin page passes axe-core and fits 375 px', async (t) => {
    await browser.context.clearCookies()
    await setPassword(server.databaseUrl, 'ada@acme.test', PASSWORD)
    await signIn(page, server.url, 'ada@acme.test', PASSWORD)
    await page.waitForURL(`${server.url}/contacts`)
    const webhook = await server.request('POST', '/api/webhook-subscriptions', {
      token: ada,
      body: { name: 'Sync', url: 'https://hooks.example.test/crm', events: ['contact.*'] },
    })
    const pages = [
      '/security',
      '/members',
      '/roles',
      `/roles/${viewerRole.body.data.id}`,
      '/teams',
      '/webhooks',
      '/webhooks/events',
      '/oauth-apps',
      '/audit-log',
    ]
    if (webhook.status === 201) pages.push(`/webhooks/${webhook.body.data.id}/deliveries`)
    for (const path of pages) {
      const response = await page.goto(`${server.url}${path}`)
      t.equal(response?.status(), 200, path)
      await checkPage(t, page, path.slice(1).replaceAll('/', '-'))
    }
  })

  t.test('a member who only views their own records sees no buttons that would fail', async (t) => {
    await browser.context.clearCookies()
    await signIn(page, server.url, 'vera@acme.test', PASSWORD)
    await page.waitForURL(`${server.url}/contacts`)
    t.match(await page.locator('table.records').textContent(), /Vera Own/)
    t.notMatch(await page.locator('table.records').textContent(), /Ada/, 'others’ contacts are not listed')
    for (const name of ['New contact', 'Import', 'Export'])
      t.equal(await page.getByRole('link', { name }).or(page.getByRole('button', { name })).count(), 0, `no ${name}`)
    await page.getByRole('link', { name: 'Vera Own' }).click()
    await page.waitForURL(`${server.url}/contacts/${veraContact.body.data.id}`)
    t.equal(await page.getByRole('link', { name: 'Edit' }).count(), 0, 'no Edit')
    t.equal(await page.getByRole('link', { name: 'Delete' }).count(), 0, 'no Delete')
    await checkPage(t, page, 'read-only-contact')
    const outside = await page.goto(`${server.url}/contacts/${adaContact.body.data.id}`)
    t.equal(outside?.status(), 404, 'a record outside the scope is a 404')
    t.match(outside?.headers()['content-type'], /^text\/html/, 'in HTML')
    await page.getByRole('heading', { name: 'Not found' }).waitFor()
    t.ok(await page.getByRole('navigation', { name: 'Main' }).isVisible(), 'in the signed-in layout')
    await checkPage(t, page, 'not-found')
    const edit = await page.goto(`${server.url}/contacts/${veraContact.body.data.id}/edit`)
    t.equal(edit?.status(), 404, 'the edit form of a record it may not change is a 404 too')
  })
}
