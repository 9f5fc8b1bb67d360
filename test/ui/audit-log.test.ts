// The Audit log page (admins) in a real browser: the entries of GET /api/audit-log in a table with
// the chain's verdict, its filters as a labelled GET form, a refused filter said in plain words, and
// a member turned away.
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { openBrowser, setPassword, signIn, unlabelledFields } from './browser.ts'

const browser = await openBrowser(t)
if (browser) {
  const server = await startTestServer(t)
  const page = browser.page
  const PASSWORD = 'correct horse battery'
  await createTenant(server.databaseUrl, { slug: 'acme', members: { 'ada@acme.test': 'admin', 'bob@acme.test': 'member' } })
  await setPassword(server.databaseUrl, 'ada@acme.test', PASSWORD)
  await setPassword(server.databaseUrl, 'bob@acme.test', PASSWORD)

  t.test('an admin reads and filters the log', async (t) => {
    await signIn(page, server.url, 'ada@acme.test', PASSWORD)
    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Audit log', exact: true }).click()
    t.match(await page.locator('h1').textContent(), 'Audit log')
    t.match(await page.locator('#chain').textContent(), /The chain of \d+ entries is intact/)
    t.same(await unlabelledFields(page), [], 'every filter has a label')
    const actions = await page.locator('table.audit-log tbody tr td:nth-child(2)').allTextContents()
    t.ok(actions.includes('member.added'), 'the fixture members were added')
    t.ok(actions.includes('user.signed_in'), 'and her own sign-in is there')

    await page.getByLabel('Action').fill('member.added')
    await page.getByRole('button', { name: 'Show' }).click()
    const filtered = await page.locator('table.audit-log tbody tr td:nth-child(2)').allTextContents()
    t.same(new Set(filtered), new Set(['member.added']), 'only the filtered action')
    t.match(page.url(), /action=member\.added/)

    await page.getByLabel('Since').fill('yesterday')
    await page.getByRole('button', { name: 'Show' }).click()
    t.match(await page.getByRole('alert').first().textContent(), /Since must be an RFC 3339 time/)
    await browser.screenshot('audit-log')
  })

  t.test('a member is turned away', async (t) => {
    await page.context().clearCookies()
    await signIn(page, server.url, 'bob@acme.test', PASSWORD)
    const response = await page.goto(`${server.url}/audit-log`)
    t.equal(response?.status(), 403)
    t.match(await page.getByRole('status').first().textContent(), /Only workspace admins manage the audit log/)
  })
}
