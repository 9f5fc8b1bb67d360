// The deal board in a real browser: a column per stage with its cards, a move by keyboard (the
// card's stage menu and Move) and by drag, each one deal.updated in the deal's history; a stale
// card is reported as a conflict; a read-only member sees no move controls and a forged move is
// refused by row-level security; axe finds nothing and the page does not scroll sideways at 375 px.
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { axeViolations, openBrowser, overflowX, setPassword, signIn, unlabelledFields } from './browser.ts'

const browser = await openBrowser(t)
if (browser) {
  const { page } = browser
  const PASSWORD = 'correct horse battery'
  const server = await startTestServer(t)
  const acme = await createTenant(server.databaseUrl, {
    slug: 'acme',
    members: { 'ada@acme.test': 'admin', 'rex@acme.test': 'read_only' },
  })
  const ada = acme.members['ada@acme.test']
  for (const email of ['ada@acme.test', 'rex@acme.test']) await setPassword(server.databaseUrl, email, PASSWORD)
  const asAda = (method: string, path: string, body?: unknown) =>
    server.request(method, path, { token: ada.token, headers: { 'x-tenant-slug': 'acme' }, body })

  const company = (await asAda('POST', '/api/companies', { name: 'Initech' })).body.data
  const atlas = (await asAda('POST', '/api/deals', { name: 'Atlas renewal', amount: '12500.00', company_id: company.id })).body.data
  const borealis = (await asAda('POST', '/api/deals', { name: 'Borealis pilot', amount: '900.00', stage: 'qualified' })).body.data

  const stageUpdates = async (id: string) => {
    const history = (await asAda('GET', `/api/deals/${id}/history`)).body.data as {
      action: string
      actor: { via: string }
      changes: Record<string, { from: unknown; to: unknown }>
    }[]
    return history.filter((entry) => entry.action === 'updated').map((entry) => ({ via: entry.actor.via, stage: entry.changes.stage }))
  }
  const column = (label: string) =>
    page.getByRole('region', { name: 'Deals by stage' }).locator('section', { has: page.getByRole('heading', { name: label }) })
  const cardIn = (label: string, deal: string) => column(label).getByRole('listitem', { name: deal })

  await signIn(page, server.url, 'ada@acme.test', PASSWORD)
  await page.waitForURL((url) => url.pathname !== '/sign-in')

  t.test('a column per stage, a card per deal with its amount and company', async (t) => {
    await page.goto(`${server.url}/deals/board`)
    const headings = await page.getByRole('region', { name: 'Deals by stage' }).getByRole('heading', { level: 2 }).allTextContents()
    t.same(
      headings.map((heading) => heading.replace(/ \(.*\)$/, '')),
      ['Lead', 'Qualified', 'Proposal', 'Negotiation', 'Won', 'Lost'],
      'the stages in pipeline order',
    )
    const card = cardIn('Lead', 'Atlas renewal')
    t.equal(await card.locator('.amount').textContent(), 'USD 12,500.00')
    t.equal(await card.locator('.company').textContent(), 'Initech')
    t.equal(await card.getByRole('link', { name: 'Atlas renewal' }).getAttribute('href'), `/deals/${atlas.id}`)
    t.equal(await cardIn('Qualified', 'Borealis pilot').count(), 1)
    t.same(await unlabelledFields(page), [], 'every field has a label')
    t.same(await axeViolations(page), [], 'axe finds no violation')
    await browser.screenshot('deal-board')
  })

  t.test('a move by keyboard is one deal.updated with the stage change', async (t) => {
    await page.goto(`${server.url}/deals/board`)
    await page.getByLabel('Stage of Atlas renewal').focus()
    await page.getByLabel('Stage of Atlas renewal').selectOption('proposal')
    await page.keyboard.press('Tab')
    await page.keyboard.press('Enter')
    await cardIn('Proposal', 'Atlas renewal').waitFor()
    t.equal(await cardIn('Lead', 'Atlas renewal').count(), 0, 'gone from Lead')
    t.same(await stageUpdates(atlas.id), [{ via: 'ui', stage: { from: 'lead', to: 'proposal' } }])
  })

  t.test('a move by drag goes the same way', async (t) => {
    await page.goto(`${server.url}/deals/board`)
    const from = await cardIn('Qualified', 'Borealis pilot').locator('.amount').boundingBox()
    const to = await column('Negotiation').locator('ul').boundingBox()
    if (!from || !to) throw new Error('the card or the column is not on screen')
    await page.mouse.move(from.x + from.width / 2, from.y + from.height / 2)
    await page.mouse.down()
    for (let step = 1; step <= 10; step++)
      await page.mouse.move(from.x + ((to.x + to.width / 2 - from.x) * step) / 10, from.y + ((to.y + 20 - from.y) * step) / 10)
    await page.mouse.up()
    await cardIn('Negotiation', 'Borealis pilot').waitFor()
    await page.waitForLoadState('load')
    t.same(await stageUpdates(borealis.id), [{ via: 'ui', stage: { from: 'qualified', to: 'negotiation' } }])
  })

  t.test('a card moved after the deal changed reports the conflict and changes nothing', async (t) => {
    await page.goto(`${server.url}/deals/board`)
    t.equal((await asAda('PATCH', `/api/deals/${atlas.id}`, { amount: '13000.00' })).status, 200, 'changed elsewhere')
    await page.getByLabel('Stage of Atlas renewal').selectOption('won')
    await page.getByRole('button', { name: 'Move Atlas renewal' }).click()
    await page.getByRole('alert').waitFor()
    t.match(await page.getByRole('alert').textContent(), /changed since the board was shown/)
    t.equal((await asAda('GET', `/api/deals/${atlas.id}`)).body.data.stage, 'proposal', 'not moved')
    t.equal(await cardIn('Proposal', 'Atlas renewal').locator('.amount').textContent(), 'USD 13,000.00', 'shown as it is now')
  })

  t.test('at 375 px the page does not scroll sideways; the board scrolls inside', async (t) => {
    await page.setViewportSize({ width: 375, height: 800 })
    await page.goto(`${server.url}/deals/board`)
    t.same(await overflowX(page), [], 'nothing reaches past the screen’s right edge')
    t.ok(
      await page.getByRole('region', { name: 'Deals by stage' }).evaluate((board) => board.scrollWidth > board.clientWidth),
      'the board scrolls in its own box',
    )
    t.same(await axeViolations(page), [])
    await page.setViewportSize({ width: 1200, height: 860 })
  })

  t.test('a read-only member sees no move controls, and a forged move is refused', async (t) => {
    await page.getByRole('button', { name: 'Sign out' }).click()
    await signIn(page, server.url, 'rex@acme.test', PASSWORD)
    await page.waitForURL((url) => url.pathname !== '/sign-in')
    await page.goto(`${server.url}/deals/board`)
    t.equal(await cardIn('Proposal', 'Atlas renewal').count(), 1, 'the deal is on the board')
    t.equal(await page.locator('form.move').count(), 0, 'no move forms')
    t.equal(await page.locator('script[src="/ui/board.js"]').count(), 0, 'no drag script')
    t.same(await axeViolations(page), [])

    const csrf = await page.locator('input[name=csrf]').first().inputValue()
    const current = await asAda('GET', `/api/deals/${atlas.id}`)
    const forged = await page.request.post(`${server.url}/deals/board/${atlas.id}/move`, {
      form: { csrf, stage: 'won', version: current.headers.get('etag') ?? '' },
      maxRedirects: 0,
    })
    t.equal(forged.status(), 403, 'refused')
    t.equal((await asAda('GET', `/api/deals/${atlas.id}`)).body.data.stage, 'proposal', 'not moved')
    t.equal((await stageUpdates(atlas.id)).length, 2, 'no new deal.updated (only the move and the amount change)')
  })
}
