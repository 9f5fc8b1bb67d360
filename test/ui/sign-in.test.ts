// Signing in through the browser: password only, with two-factor (codes from oathtool), the
// errors in plain words, and signing out.
import { execFileSync, spawnSync } from 'node:child_process'
import t from 'tap'
import { crm } from '../helpers/cli.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { openBrowser, setPassword, signIn, unlabelledFields } from './browser.ts'

const browser = await openBrowser(t)
if (browser) {
  const { page, context } = browser
  const PASSWORD = 'correct horse battery'
  const server = await startTestServer(t)
  const tenant = await createTenant(server.databaseUrl, {
    slug: 'acme',
    members: { 'ada@acme.test': 'admin', 'grace@acme.test': 'member' },
  })
  await setPassword(server.databaseUrl, 'ada@acme.test', PASSWORD)
  await setPassword(server.databaseUrl, 'grace@acme.test', PASSWORD)

  t.test('a wrong password is refused in plain words', async (t) => {
    await signIn(page, server.url, 'ada@acme.test', 'not the password')
    await page.getByRole('alert').waitFor()
    t.equal((await page.getByRole('alert').textContent())?.trim(), 'The email or password is wrong.')
    t.equal(await page.getByLabel('Email').inputValue(), 'ada@acme.test', 'the email is kept')
    await browser.screenshot('sign-in-error')
  })

  t.test('password sign-in starts a session cookie that is HttpOnly and SameSite=Lax', async (t) => {
    await page.goto(`${server.url}/sign-in`)
    await browser.screenshot('sign-in')
    await signIn(page, server.url, 'ada@acme.test', PASSWORD)
    await page.waitForURL(`${server.url}/contacts`)
    t.equal(await page.getByRole('heading', { level: 1 }).textContent(), 'Contacts', 'admins land on Contacts too')
    const cookie = (await context.cookies()).find((c) => c.name === 'crm_session')
    t.ok(cookie, 'a session cookie')
    t.equal(cookie?.httpOnly, true)
    t.equal(cookie?.sameSite, 'Lax')
    t.equal(cookie?.secure, false, 'not Secure over plain http')
    t.match(cookie?.value, /^crm_/)
    const tokens = await server.request('GET', '/api/tokens', { token: tenant.members['ada@acme.test'].token })
    t.ok(
      tokens.body.data.some((row: any) => row.kind === 'session' && /^Web session: Chrome/.test(row.name)),
      'stored as a session token',
    )
    await page.getByRole('button', { name: 'Sign out' }).click()
    await page.waitForURL(/\/sign-in\?notice=signed-out$/)
    t.equal((await page.getByRole('status').textContent())?.trim(), 'You are signed out.')
    await page.goto(`${server.url}/security`)
    await page.waitForURL(/\/sign-in/)
    t.pass('signed-out browsers land on sign-in')
  })

  const oathtool = spawnSync('oathtool', ['--version']).status === 0
  t.test(
    'two-factor sign-in with a code from oathtool, and with a recovery code',
    { skip: oathtool ? false : 'oathtool is not installed' },
    async (t) => {
      const enabled = crm(server.databaseUrl, ['user', 'totp', 'enable', '--email', 'grace@acme.test', '--json'])
      t.equal(enabled.status, 0, enabled.stderr)
      const code = (offset = 'now') => execFileSync('oathtool', ['--totp', '-b', '-N', offset, enabled.json.secret]).toString().trim()
      await context.clearCookies()

      await signIn(page, server.url, 'grace@acme.test', PASSWORD)
      await page.waitForURL(`${server.url}/sign-in/two-factor`)
      await browser.screenshot('sign-in-two-factor')
      await page.getByLabel('Authentication code').fill(code('now - 5 minutes'))
      await page.getByRole('button', { name: 'Verify' }).click()
      await page.getByRole('alert').waitFor()
      t.match(await page.getByRole('alert').textContent(), /That code is not right/)
      t.notOk(
        (await context.cookies()).some((c) => c.name === 'crm_session'),
        'no session after a wrong code',
      )

      await page.getByLabel('Authentication code').fill(code())
      await page.getByRole('button', { name: 'Verify' }).click()
      await page.waitForURL(`${server.url}/contacts`)
      t.ok(
        (await context.cookies()).some((c) => c.name === 'crm_session'),
        'signed in after the right code',
      )
      t.notOk(await page.getByRole('link', { name: 'Webhooks' }).count(), 'members see no admin screens')

      await context.clearCookies()
      await signIn(page, server.url, 'grace@acme.test', PASSWORD)
      await page.waitForURL(/\/sign-in\/two-factor/)
      await page.getByRole('link', { name: 'Use a recovery code instead' }).click()
      await page.getByLabel('Recovery code').fill(enabled.json.recovery_codes[0])
      await page.getByRole('button', { name: 'Verify' }).click()
      await page.waitForURL(`${server.url}/contacts`)
      t.pass('a recovery code signs in')
    },
  )

  t.test('sign-in works from the keyboard alone, in page order', async (t) => {
    await context.clearCookies()
    await page.goto(`${server.url}/sign-in`)
    const focused = () => page.evaluate(() => document.activeElement?.id || document.activeElement?.textContent)
    t.equal(await focused(), 'email', 'focus starts in Email')
    t.same(await unlabelledFields(page), [], 'every field has a label')
    await page.keyboard.type('ada@acme.test')
    await page.keyboard.press('Tab')
    t.equal(await focused(), 'password')
    await page.keyboard.type(PASSWORD)
    await page.keyboard.press('Tab')
    t.equal(await focused(), 'Sign in')
    await page.keyboard.press('Enter')
    await page.waitForURL(`${server.url}/contacts`)
    await page.keyboard.press('Tab')
    t.equal(await focused(), 'Skip to content', 'the skip link comes first')
    await page.keyboard.press('Enter')
    await page.keyboard.press('Tab')
    t.ok(await page.evaluate(() => document.activeElement?.closest('main') !== null), 'after the skip link, Tab goes into the main content')
  })

  t.test('forms without the CSRF token are refused', async (t) => {
    const response = await page.request.post(`${server.url}/security/tokens`, { form: { name: 'forged', expires_in_days: '30' } })
    t.equal(response.status(), 403)
    t.match(await response.text(), /This form has expired/)
  })
}
