// The import wizard in a real browser with the worker: upload a few rows of the people fixture
// plus a row that repeats an email, map a column to a custom field, dry run (its error shown, nothing
// written), import (progress until done), the errors.csv link, the past imports; axe finds no
// violation and the pages do not scroll sideways at 375 px.
import { readFileSync } from 'node:fs'
import t from 'tap'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { axeViolations, openBrowser, overflowX, setPassword, signIn, unlabelledFields } from './browser.ts'

const browser = await openBrowser(t)
if (browser) {
  const { page } = browser
  const PASSWORD = 'correct horse battery'
  const server = await startTestServer(t, { worker: true })
  const acme = await createTenant(server.databaseUrl, { slug: 'acme', members: { 'mia@acme.test': 'admin', 'sam@acme.test': 'member' } })
  const mia = acme.members['mia@acme.test']
  await setPassword(server.databaseUrl, 'mia@acme.test', PASSWORD)
  const asMia = (path: string) => server.request('GET', path, { token: mia.token, headers: { 'x-tenant-slug': 'acme' } })

  // The header and 5 people, then the first person's email again: row 6 fails as a duplicate.
  const lines = readFileSync(new URL('../fixtures/csv/people-100.csv', import.meta.url), 'utf8')
    .split(/\r?\n/)
    .slice(0, 6)
  const repeated = lines[1].split(',')
  repeated[0] = '6'
  repeated[2] = 'Twin'
  const file = Buffer.from(`${[...lines, repeated.join(',')].join('\n')}\n`)
  const heading = (name: RegExp) => page.getByRole('heading', { name })

  await signIn(page, server.url, 'mia@acme.test', PASSWORD)
  await page.waitForURL((url) => url.pathname !== '/sign-in')

  t.test('upload, mapping with a custom field, dry run, import, errors.csv', async (t) => {
    await page.goto(`${server.url}/contacts/import`)
    t.ok(await page.getByText('No imports yet.').isVisible())
    t.same(await axeViolations(page), [], 'axe: the upload page')
    await page.getByLabel('CSV file', { exact: true }).setInputFiles({ name: 'people.csv', mimeType: 'text/csv', buffer: file })
    await page.getByRole('button', { name: 'Upload' }).click()
    await heading(/^2\. Map the columns$/).waitFor()
    t.equal(await page.getByLabel('Field for column Email').inputValue(), 'email', 'the suggested mapping')
    await page.getByLabel('Field for column Sex').selectOption('custom_fields.sex')
    t.same(await unlabelledFields(page), [], 'every menu has a label')
    t.same(await axeViolations(page), [], 'axe: the mapping')

    await page.getByRole('button', { name: 'Dry run' }).click()
    await heading(/^3\. Dry run: completed$/).waitFor()
    const errors = page.getByRole('region', { name: 'Rows with errors' })
    t.match(await errors.locator('tbody tr').first().textContent(), /^6\s*Email\s*duplicate/, 'row 6, column Email, a duplicate')
    t.equal((await asMia('/api/contacts')).body.data.length, 0, 'a dry run writes nothing')
    t.equal(await page.getByLabel('Field for column Sex').inputValue(), 'custom_fields.sex', 'the mapping is kept')
    t.same(await axeViolations(page), [], 'axe: the dry run')

    await page.getByRole('button', { name: 'Import' }).click()
    await heading(/^4\. Import: completed$/).waitFor()
    t.equal(await page.locator('dt', { hasText: 'Created' }).locator('xpath=following-sibling::dd[1]').textContent(), '5')
    t.equal(await page.locator('dt', { hasText: 'Failed' }).locator('xpath=following-sibling::dd[1]').textContent(), '1')
    const link = page.getByRole('link', { name: 'Download errors.csv' })
    const download = await page.request.get(`${server.url}${await link.getAttribute('href')}`)
    t.equal(download.status(), 200)
    t.match(download.headers()['content-type'], /^text\/csv/)
    const csv = (await download.text()).split('\r\n')
    t.equal(csv[0], `${lines[0]},row,error`)
    t.match(csv[1], /^6,.*,Twin,.*,6,/, 'the failed row with its number')
    const contacts = (await asMia('/api/contacts?limit=10')).body.data as { custom_fields: Record<string, unknown> }[]
    t.equal(contacts.length, 5)
    t.ok(
      contacts.every((contact) => typeof contact.custom_fields.sex === 'string'),
      'the mapped custom field',
    )
    t.same(await axeViolations(page), [], 'axe: the result')
    await browser.screenshot('import-wizard')

    await page.getByRole('link', { name: 'All imports' }).click()
    const past = page.getByRole('region', { name: 'Past imports' })
    t.equal(await past.getByRole('link', { name: 'people.csv' }).count(), 1, 'listed with the past imports')
  })

  t.test('an upload without the page’s CSRF token is refused before it lands', async (t) => {
    const before = (await asMia('/api/contacts/import')).body.data.length
    for (const query of ['', '?csrf=forged']) {
      const forged = await page.request.post(`${server.url}/contacts/import${query}`, {
        multipart: { file: { name: 'forged.csv', mimeType: 'text/csv', buffer: file } },
        maxRedirects: 0,
      })
      t.equal(forged.status(), 403, `refused (${query || 'no token'})`)
    }
    t.equal((await asMia('/api/contacts/import')).body.data.length, before, 'no upload stored')
  })

  t.test('a member whose role grants no import gets a 403 page saying so, without an upload form', async (t) => {
    const session = await withOwner(server.databaseUrl, (client) =>
      mintToken(client, acme.members['sam@acme.test'].id, { kind: 'session' }),
    )
    const answer = await fetch(`${server.url}/contacts/import`, { headers: { cookie: `crm_session=${session}` } })
    t.equal(answer.status, 403)
    const text = await answer.text()
    t.match(text, /Your role does not allow importing contacts/)
    t.notMatch(text, /type="file"/, 'no upload form')
  })

  t.test('at 375 px the wizard does not scroll sideways', async (t) => {
    await page.setViewportSize({ width: 375, height: 800 })
    await page.goto(`${server.url}/contacts/import`)
    t.same(await overflowX(page), [], 'nothing reaches past the screen’s right edge')
    await page.getByRole('link', { name: 'people.csv' }).click()
    t.same(await overflowX(page), [], 'nothing reaches past the screen’s right edge')
    t.same(await axeViolations(page), [])
  })
}
