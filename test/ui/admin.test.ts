// The workspace-administration screens in real browsers: sign up, invite a member and accept as
// them in a second browser, build a custom role in the grid and see the API obey it, suspend a
// member (their open session and API tokens stop at once), teams, and the plain-word refusals
// (seat limit, last admin, role in use).

import type { Page } from 'playwright-core'
import t, { type Test } from 'tap'
import { mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { openBrowser, unlabelledFields } from './browser.ts'

const admin = await openBrowser(t)
const member = admin ? await openBrowser(t) : null
if (admin && member) {
  const server = await startTestServer(t)
  const page = admin.page
  const other = member.page
  const PASSWORD = 'correct horse battery'
  const GRACE_PASSWORD = 'grace hopper 1906'

  const userId = (email: string) =>
    withOwner(
      server.databaseUrl,
      async (client) => (await client.query('select id from crm.users where email = $1', [email])).rows[0].id as string,
    )
  const tokenFor = async (email: string) => withOwner(server.databaseUrl, async (client) => mintToken(client, await userId(email)))
  const seats = async (p: Page) => (await p.locator('#seats').textContent())?.replace(/\s+/g, ' ').trim()
  const nav = (p: Page, name: string) => p.getByRole('navigation', { name: 'Main' }).getByRole('link', { name, exact: true })
  const alert = async (p: Page) => (await p.getByRole('alert').first().textContent())?.trim()
  /** Accessibility and CSRF basics of the page shown: labelled fields, a token in every posting form. */
  const checkForms = async (t: Test, p: Page) => {
    t.same(await unlabelledFields(p), [], 'every field has a label')
    const missing = await p.evaluate(() =>
      [...document.querySelectorAll('form[method=post]')]
        .filter((form) => !(form.querySelector('input[name=csrf]') as HTMLInputElement | null)?.value)
        .map((form) => form.getAttribute('action')),
    )
    t.same(missing, [], 'every form carries a CSRF token')
  }

  let acceptUrl = ''

  t.test('sign up creates the workspace and signs the admin in', async (t) => {
    await page.goto(`${server.url}/sign-up`)
    await page.getByLabel('Your name').fill('Ada Lovelace')
    await page.getByLabel('Email').fill('ada@example.test')
    await page.getByLabel('Password').fill('short')
    await page.getByLabel('Workspace name').fill('Analytical Engines')
    await checkForms(t, page)
    await admin.screenshot('sign-up')
    await page.getByRole('button', { name: 'Sign up' }).click()
    t.match(await alert(page), /password/i, 'a too-short password is refused in plain words')
    t.equal(await page.getByLabel('Email').inputValue(), 'ada@example.test', 'the form keeps its values')
    await page.getByLabel('Password').fill(PASSWORD)
    await page.getByRole('button', { name: 'Sign up' }).click()
    await page.waitForURL(`${server.url}/members?welcome=1`)
    await page.getByRole('heading', { name: 'Members', exact: true }).waitFor()
    t.match(await page.getByRole('status').first().textContent(), /Your workspace is ready/)
    t.equal(await seats(page), 'Seats: 1 used of unlimited')
    t.equal(await page.getByLabel('Role of Ada Lovelace', { exact: true }).inputValue(), 'admin')
    const tokens = await withOwner(
      server.databaseUrl,
      async (client) =>
        (await client.query('select kind, name, revoked_at is not null as revoked from crm.tokens order by created_at')).rows,
    )
    t.same(
      tokens.map((row) => [row.kind, row.revoked]),
      [
        ['token', true],
        ['session', false],
      ],
      'a browser session; the API token of the sign-up is revoked',
    )
    const workspace = await withOwner(
      server.databaseUrl,
      async (client) => (await client.query('select slug, trial_ends_at > now() as trial from crm.workspaces')).rows[0],
    )
    t.same(workspace, { slug: 'analytical-engines', trial: true })
    await withOwner(server.databaseUrl, (client) => client.query('update crm.workspaces set seat_limit = 2'))
  })

  t.test('teams: create one', async (t) => {
    await nav(page, 'Teams').click()
    await page.getByLabel('Team name').fill('East')
    await page.getByRole('button', { name: 'Create team' }).click()
    await page.getByRole('article', { name: 'East' }).waitFor()
    await page.getByLabel('Team name').fill('East')
    await page.getByRole('button', { name: 'Create team' }).click()
    t.match(await alert(page), /already taken/, 'a duplicate name is refused in plain words')
    await page.getByLabel('Team name').fill('West')
    await page.getByRole('button', { name: 'Create team' }).click()
    await page.getByRole('article', { name: 'West' }).waitFor()
    t.equal(await page.getByRole('article').count(), 2)
  })

  t.test('invite a member: the accept link is shown to the admin', async (t) => {
    await nav(page, 'Members').click()
    t.equal(await seats(page), 'Seats: 1 used of 2')
    await page.getByLabel('Email').fill('grace@example.test')
    await page.getByLabel('Role', { exact: true }).selectOption('member')
    await page.getByLabel('East', { exact: true }).check()
    await checkForms(t, page)
    await page.getByRole('button', { name: 'Invite member' }).click()
    await page.getByRole('heading', { name: 'Invitation for grace@example.test created' }).waitFor()
    acceptUrl = await page.getByLabel('Accept link').inputValue()
    t.match(acceptUrl, new RegExp(`^${server.url}/invitations/accept\\?token=inv_[A-Za-z0-9_-]{43}$`))
    t.match(await page.locator('#invited-heading + p').textContent(), /Outgoing mail is not set up \(SMTP_URL\)/)
    const pending = page.getByRole('row', { name: /grace@example\.test/ })
    t.match(await pending.textContent(), /member\s*East\s*Pending/)
    await page.reload()
    t.equal(await page.getByLabel('Accept link').count(), 0, 'the link is shown once')
  })

  t.test('the member accepts in a second browser', async (t) => {
    await other.goto(acceptUrl)
    await other.getByRole('heading', { name: 'Accept invitation' }).waitFor()
    t.match(await other.locator('p.lead').textContent(), /join Analytical Engines as member, with the email grace@example\.test/)
    t.equal(await other.getByLabel('Email').inputValue(), 'grace@example.test')
    await other.getByLabel('Your name').fill('Grace Hopper')
    await checkForms(t, other)
    await member.screenshot('accept-invitation')
    await other.getByLabel('Choose a password').fill('grace@example.test')
    await other.getByRole('button', { name: 'Accept invitation' }).click()
    t.match(await alert(other), /password/i, 'the password rule is the API’s, in plain words')
    t.equal(await other.getByLabel('Your name').inputValue(), 'Grace Hopper')
    await other.getByLabel('Choose a password').fill(GRACE_PASSWORD)
    await other.getByRole('button', { name: 'Accept invitation' }).click()
    await other.waitForURL(`${server.url}/contacts`)
    t.match(await other.locator('header .who').textContent(), /grace@example\.test/)
    t.equal(await nav(other, 'Members').count(), 0, 'no admin links for a member')

    await other.goto(acceptUrl)
    t.match(await other.getByRole('status').textContent(), /already accepted/, 'the link works once')

    await page.reload()
    t.equal(await seats(page), 'Seats: 2 used of 2 Full')
    const row = page.getByRole('row', { name: /Grace Hopper/ })
    t.match(await row.textContent(), /grace@example\.test[\s\S]*East[\s\S]*Active/)
    t.equal(await page.getByText('No pending invitations.').count(), 1)
  })

  t.test('seats: a full workspace refuses another invitation’s acceptance in plain words', async (t) => {
    await page.getByLabel('Email').fill('linus@example.test')
    await page.getByRole('button', { name: 'Invite member' }).click()
    const link = await page.getByLabel('Accept link').inputValue()
    await other.context().clearCookies()
    await other.goto(link)
    await other.getByLabel('Your name').fill('Linus')
    await other.getByLabel('Choose a password').fill('linus torvalds 1969')
    await other.getByRole('button', { name: 'Accept invitation' }).click()
    t.match(await alert(other), /^Seat limit reached: all 2 seats of this workspace are in use\./)
    await page.getByRole('button', { name: 'Withdraw invitation of linus@example.test' }).click()
    await page.getByText('Invitation withdrawn').waitFor()
    await other.goto(link)
    t.match(await alert(other), /not valid/, 'a withdrawn link stops working')
  })

  let roleUrl = ''
  t.test('a custom role from the grid, assigned, and obeyed by the API', async (t) => {
    await nav(page, 'Roles').click()
    t.match(await page.getByRole('row', { name: /^admin/ }).textContent(), /built-in/)
    await page.getByLabel('Name', { exact: true }).fill('own_deals')
    await page.getByLabel('Deals: view').selectOption('own')
    await page.getByLabel('Deals: update').selectOption('own')
    await page.getByLabel('Contacts: view').selectOption('team')
    await checkForms(t, page)
    await page.getByRole('button', { name: 'Create role' }).click()
    await page.getByText('Role own_deals created').waitFor()
    const row = page.getByRole('row', { name: /^own_deals/ })
    t.match(await row.textContent(), /custom[\s\S]*0[\s\S]*contacts:view:team\s*deals:update:own\s*deals:view:own/)
    await row.getByRole('link', { name: 'own_deals' }).click()
    roleUrl = page.url()
    t.equal(await page.getByLabel('Deals: view').inputValue(), 'own', 'the grid shows the saved scopes')
    t.equal(await page.getByLabel('Deals: delete').inputValue(), 'none')
    await admin.screenshot('roles-grid')

    await nav(page, 'Members').click()
    await page.getByLabel('Role of Grace Hopper', { exact: true }).selectOption('own_deals')
    await page.getByRole('button', { name: 'Save role of Grace Hopper' }).click()
    await page.getByText('Role changed to own_deals.').waitFor()
    t.equal(await page.getByLabel('Role of Grace Hopper', { exact: true }).inputValue(), 'own_deals')

    const adaToken = await tokenFor('ada@example.test')
    const graceToken = await tokenFor('grace@example.test')
    const grace = await userId('grace@example.test')
    for (const [name, owner] of [
      ['Ada’s deal', await userId('ada@example.test')],
      ['Grace’s deal', grace],
    ]) {
      const created = await server.request('POST', '/api/deals', { token: adaToken, body: { name, owner_id: owner } })
      t.equal(created.status, 201, created.text)
    }
    const seen = await server.request('GET', '/api/deals', { token: graceToken })
    t.equal(seen.status, 200)
    t.same(
      seen.body.data.map((deal: any) => deal.name),
      ['Grace’s deal'],
      'deals:view:own: only her own deal',
    )
    t.equal((await server.request('POST', '/api/deals', { token: graceToken, body: { name: 'New' } })).status, 403, 'no create grant')
    const me = await server.request('GET', '/api/me', { token: graceToken })
    t.equal(me.body.data.role.name, 'own_deals')

    await page.goto(roleUrl)
    await page.getByRole('button', { name: 'Delete role' }).click()
    t.match(await alert(page), /^This role is still in use/, 'role in use, in plain words')
  })

  t.test('the last admin cannot be demoted', async (t) => {
    await nav(page, 'Members').click()
    await page.getByLabel('Role of Ada Lovelace', { exact: true }).selectOption('member')
    await page.getByRole('button', { name: 'Save role of Ada Lovelace' }).click()
    t.match(await alert(page), /^This is the last admin of the workspace/)
    await page.goto(`${server.url}/members`)
    t.equal(await page.getByLabel('Role of Ada Lovelace', { exact: true }).inputValue(), 'admin')
  })

  t.test('suspending a member stops their open session and their API tokens at once', async (t) => {
    await other.goto(`${server.url}/sign-in`)
    await other.getByLabel('Email').fill('grace@example.test')
    await other.getByLabel('Password').fill(GRACE_PASSWORD)
    await other.getByRole('button', { name: 'Sign in' }).click()
    await other.waitForURL(`${server.url}/contacts`)
    const graceToken = await tokenFor('grace@example.test')
    t.equal((await server.request('GET', '/api/deals', { token: graceToken })).status, 200)

    await page.getByRole('button', { name: 'Suspend Grace Hopper' }).click()
    await page.getByText('Member suspended').waitFor()
    t.match(await page.getByRole('row', { name: /Grace Hopper/ }).textContent(), /Suspended/)
    t.equal(await seats(page), 'Seats: 1 used of 2')
    await admin.screenshot('members')

    await other.reload()
    await other.waitForURL(`${server.url}/sign-in?notice=session-ended`)
    t.match(await other.getByRole('status').textContent(), /Your session has ended/)
    const refused = await server.request('GET', '/api/deals', { token: graceToken })
    t.equal(refused.status, 401)
    t.equal(refused.body.code, 'user_suspended')

    await withOwner(server.databaseUrl, (client) => client.query('update crm.workspaces set seat_limit = 1'))
    await page.getByRole('button', { name: 'Unsuspend Grace Hopper' }).click()
    t.match(await alert(page), /^Seat limit reached: all 1 seats/, 'unsuspend needs a free seat')
    await withOwner(server.databaseUrl, (client) => client.query('update crm.workspaces set seat_limit = 2'))
    await page.goto(`${server.url}/members`)
    await page.getByRole('button', { name: 'Unsuspend Grace Hopper' }).click()
    await page.getByText('Member unsuspended.').waitFor()
    t.equal((await server.request('GET', '/api/deals', { token: graceToken })).status, 200, 'the token works again')
  })

  t.test('teams: add and remove members', async (t) => {
    await nav(page, 'Teams').click()
    const west = page.getByRole('article', { name: 'West' })
    await west.getByLabel('Add to West').selectOption({ label: 'Grace Hopper (grace@example.test)' })
    await west.getByRole('button', { name: 'Add' }).click()
    await page.getByText('Member added to the team.').waitFor()
    const people = (team: string) => page.getByRole('article', { name: team }).getByRole('listitem').allTextContents()
    t.match((await people('West')).join('|'), /Grace Hopper/)
    t.match((await people('East')).join('|'), /Grace Hopper/, 'still in East')
    await checkForms(t, page)
    await admin.screenshot('teams')
    await page.getByRole('button', { name: 'Remove Grace Hopper from East' }).click()
    await page.getByText('Member removed from the team.').waitFor()
    t.same(await people('East'), [], 'East has no members left')
    await nav(page, 'Members').click()
    t.match(await page.getByRole('row', { name: /Grace Hopper/ }).textContent(), /West/)
  })

  t.test('admin pages are for admins only', async (t) => {
    await other.goto(`${server.url}/sign-in`)
    await other.getByLabel('Email').fill('grace@example.test')
    await other.getByLabel('Password').fill(GRACE_PASSWORD)
    await other.getByRole('button', { name: 'Sign in' }).click()
    await other.waitForURL(`${server.url}/contacts`)
    for (const path of ['/members', '/roles', '/teams']) {
      const response = await other.goto(`${server.url}${path}`)
      t.equal(response?.status(), 403, path)
    }
  })
}
