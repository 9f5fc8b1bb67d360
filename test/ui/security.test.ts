// The security screen in a real browser: API tokens shown once and revoked (the API then refuses
// them), two-factor enrollment (QR code, a code from oathtool, recovery codes once) and turning it
// off, "Revoke all" ending this browser session too, and OAuth app registration.

import { execFileSync, spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { otpauthUri } from '../../src/auth/two-factor.ts'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { openBrowser, setPassword, signIn, unlabelledFields } from './browser.ts'

const browser = await openBrowser(t)
if (browser) {
  const { page, context } = browser
  const PASSWORD = 'correct horse battery'
  const server = await startTestServer(t)
  const acme = await createTenant(server.databaseUrl, { slug: 'acme', members: { 'ada@acme.test': 'admin' } })
  const ada = acme.members['ada@acme.test']
  await setPassword(server.databaseUrl, 'ada@acme.test', PASSWORD)
  const me = (token: string) => server.request('GET', '/api/me', { token })

  await signIn(page, server.url, 'ada@acme.test', PASSWORD)
  await page.waitForURL(`${server.url}/contacts`)

  t.test('the session is listed; a new API token is shown once, works, and stops when revoked', async (t) => {
    await page.getByRole('link', { name: 'Security' }).click()
    await page.waitForURL(`${server.url}/security`)
    const sessionRow = page.getByRole('row', { name: /this browser/ })
    t.match(await sessionRow.textContent(), /Browser session/)
    t.same((await page.getByRole('columnheader').allTextContents()).slice(0, 6), [
      'Name',
      'Type',
      'Scopes',
      'Created',
      'Last used',
      'Expires',
    ])
    t.match(await sessionRow.textContent(), /Full role/, 'a session is not scoped')

    await page.getByLabel('Name').fill('ERP sync')
    t.equal(await page.getByLabel('Expires in').inputValue(), '14', 'a new token expires in 14 days unless told otherwise')
    await page.getByLabel('Expires in').selectOption({ label: '7 days' })
    // Scopes limit the token; none checked would give it the whole role.
    await page.getByLabel('contacts:read', { exact: true }).check()
    await page.getByLabel('deals:write', { exact: true }).check()
    await page.getByRole('button', { name: 'Create token' }).click()
    await page.waitForURL(`${server.url}/security`)
    const token = await page.getByLabel('Token', { exact: true }).inputValue()
    t.match(token, /^crm_[A-Za-z0-9_-]{43}$/)
    await browser.screenshot('security-token-created')
    t.same(await unlabelledFields(page), [], 'every field has a label')
    const works = await me(token)
    t.equal(works.status, 200, 'the API accepts the new token')
    t.equal(works.body.data.token.name, 'ERP sync')
    t.same(works.body.data.token.scopes, ['contacts:read', 'deals:write'], 'the checked scopes, in the documented order')
    t.equal((await server.request('GET', '/api/companies', { token })).body.code, 'insufficient_scope', 'and only them')
    const lifetimeDays = (Date.parse(works.body.data.token.expires_at) - Date.now()) / 86_400_000
    t.ok(lifetimeDays > 6.9 && lifetimeDays <= 7, 'expires in 7 days')

    await page.reload()
    t.equal(await page.getByLabel('Token', { exact: true }).count(), 0, 'shown only once')
    const row = page.getByRole('row', { name: /ERP sync/ })
    t.match(await row.textContent(), /API token/)
    t.match(await row.textContent(), /contacts:read\s*deals:write/, 'the list shows the scopes')
    await row.getByRole('button', { name: 'Revoke' }).click()
    await page.waitForURL(`${server.url}/security?done=revoked`)
    t.equal(await page.getByRole('row', { name: /ERP sync/ }).count(), 0, 'gone from the list')
    const refused = await me(token)
    t.equal(refused.status, 401, 'the API refuses the revoked token')
    t.equal(refused.body.code, 'token_revoked')
  })

  const oathtool = spawnSync('oathtool', ['--version']).status === 0
  t.test(
    'two-factor enrollment: QR code, a code from oathtool, recovery codes once; turning it off needs a code',
    { skip: oathtool ? false : 'oathtool is not installed' },
    async (t) => {
      await page.goto(`${server.url}/security`)
      await page.getByRole('button', { name: 'Set up two-factor' }).click()
      await page.waitForURL(`${server.url}/security/two-factor`)
      const secret = (await page.locator('#totp-secret').textContent())!.replace(/\s+/g, '')
      t.match(secret, /^[A-Z2-7]{16,}$/)
      const qr = page.getByRole('img', { name: 'QR code for your authenticator app' })
      t.equal(await qr.evaluate((element) => element.tagName.toLowerCase()), 'svg', 'the QR code is an inline SVG')
      if (spawnSync('zbarimg', ['--version']).status === 0) {
        const file = join(mkdtempSync(join(tmpdir(), 'crm-qr-')), 'qr.png')
        writeFileSync(file, await qr.screenshot())
        const decoded = execFileSync('zbarimg', ['--quiet', '--raw', file], { stdio: ['ignore', 'pipe', 'ignore'] })
          .toString()
          .trim()
        t.equal(decoded, otpauthUri('ada@acme.test', secret), 'zbarimg reads the otpauth URI from the QR code')
        t.match(decoded, /^otpauth:\/\/totp\/CRM:ada%40acme\.test\?secret=[A-Z2-7]+&issuer=CRM$/)
      } else {
        t.comment('zbarimg is not installed: the QR code is not decoded')
      }
      await browser.screenshot('security-two-factor-setup')
      const code = (offset = 'now') => execFileSync('oathtool', ['--totp', '-b', '-N', offset, secret]).toString().trim()

      await page.getByLabel('Authentication code').fill(code('now - 5 minutes'))
      await page.getByRole('button', { name: 'Turn on two-factor' }).click()
      await page.getByRole('alert').waitFor()
      t.match(await page.getByRole('alert').textContent(), /That code is not right/)

      await page.getByLabel('Authentication code').fill(code())
      await page.getByRole('button', { name: 'Turn on two-factor' }).click()
      await page.waitForURL(`${server.url}/security/two-factor/recovery-codes`)
      const codes = await page.locator('#recovery-codes li').allTextContents()
      t.equal(codes.length, 10)
      t.match(codes[0], /^[a-z2-9]{4}-[a-z2-9]{4}-[a-z2-9]{4}$/)
      await browser.screenshot('security-recovery-codes')
      await page.reload()
      await page.waitForURL(`${server.url}/security`)
      t.pass('recovery codes are shown once')
      t.match(
        await page.getByRole('region', { name: 'Two-factor sign-in' }).textContent(),
        /Two-factor sign-in is on\. 10 recovery codes left\./,
      )

      // A new sign-in now asks for a code; a recovery code from the page works.
      const other = await context.newPage()
      await other.context().clearCookies()
      await signIn(other, server.url, 'ada@acme.test', PASSWORD)
      await other.waitForURL(/\/sign-in\/two-factor/)
      await other.getByRole('link', { name: 'Use a recovery code instead' }).click()
      await other.getByLabel('Recovery code').fill(codes[3])
      await other.getByRole('button', { name: 'Verify' }).click()
      await other.waitForURL(`${server.url}/contacts`)
      await other.close()

      await page.goto(`${server.url}/security`)
      t.match(await page.getByRole('region', { name: 'Two-factor sign-in' }).textContent(), /9 recovery codes left/)
      await page.getByLabel('Authentication code').fill('000000')
      await page.getByRole('button', { name: 'Turn off two-factor' }).click()
      await page.getByRole('alert').waitFor()
      t.match(await page.getByRole('alert').textContent(), /still on/)
      // The next step's code: the step that turned two-factor on is used up, and this may still be it.
      await page.getByLabel('Authentication code').fill(code('now + 30 seconds'))
      await page.getByRole('button', { name: 'Turn off two-factor' }).click()
      await page.waitForURL(`${server.url}/security?done=two-factor-off`)
      t.match(await page.getByRole('region', { name: 'Two-factor sign-in' }).textContent(), /Two-factor sign-in is off/)
    },
  )

  t.test('OAuth apps: register one and get a client id and a secret shown once', async (t) => {
    await page.goto(`${server.url}/oauth-apps`)
    await page.getByLabel('Name').fill('Zapier bridge')
    await page.getByLabel('Redirect URIs').fill('ftp://example.com/callback')
    await page.getByRole('button', { name: 'Register app' }).click()
    await page.getByRole('alert').waitFor()
    t.match(await page.getByRole('alert').textContent(), /must use https/)

    await page.getByLabel('Redirect URIs').fill('https://zapier.example.com/oauth/callback\nhttp://127.0.0.1:8080/callback')
    await page.getByRole('button', { name: 'Register app' }).click()
    await page.waitForURL(`${server.url}/oauth-apps`)
    const clientId = await page.getByLabel('Client ID').inputValue()
    const clientSecret = await page.getByLabel('Client secret').inputValue()
    t.match(clientId, /^crmapp_[A-Za-z0-9_-]{22}$/)
    t.match(clientSecret, /^crmsec_[A-Za-z0-9_-]{43}$/)
    await browser.screenshot('oauth-apps')
    const card = page.getByRole('article', { name: 'Zapier bridge' })
    t.match(
      await card.textContent(),
      new RegExp(
        `${clientId}[\\s\\S]*…${clientSecret.slice(-4)}[\\s\\S]*https://zapier\\.example\\.com/oauth/callback[\\s\\S]*http://127.0.0.1:8080/callback`,
      ),
    )
    const stored = await withOwner(server.databaseUrl, (client) =>
      client.query('select client_secret_hash from crm.oauth_apps where client_id = $1', [clientId]),
    )
    t.same(stored.rows[0].client_secret_hash, createHash('sha256').update(clientSecret).digest(), 'only a hash of the secret is stored')
    await page.reload()
    t.equal(await page.getByLabel('Client secret').count(), 0, 'shown only once')
  })

  t.test('"Revoke all" stops every token and ends this browser session too', async (t) => {
    const other = await withOwner(server.databaseUrl, (client) => mintToken(client, ada.id))
    t.equal((await me(other)).status, 200)
    await page.goto(`${server.url}/security`)
    await browser.screenshot('security')
    await page.getByRole('button', { name: 'Revoke all' }).click()
    await page.waitForURL(/\/sign-in\?notice=signed-out$/)
    t.equal((await me(other)).body.code, 'token_revoked', 'API tokens stop')
    t.equal((await me(ada.token)).body.code, 'token_revoked', 'every one of them')
    await page.goto(`${server.url}/security`)
    await page.waitForURL(/\/sign-in/)
    t.ok(await page.getByRole('button', { name: 'Sign in' }).isVisible(), 'the browser must sign in again')
  })
}
