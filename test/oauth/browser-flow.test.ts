// The whole OAuth flow as a third-party app sees it, driven by a client nobody on this project
// wrote (oauth4webapi) and a real browser (Chromium through playwright-core): discovery from the
// metadata, PKCE, sign-in and the consent click, the callback checked for state and iss (RFC
// 9207), the code exchange, API calls with the access token, refresh with rotation, a used
// refresh token revoking the grant, revocation (RFC 7009), Deny, the user's "Connected apps" and
// the admin's view of the app with "Revoke for everyone".
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import * as oauth from 'oauth4webapi'
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { openBrowser, setPassword, signIn } from '../ui/browser.ts'
import { registerApp } from './helpers.ts'

const browser = await openBrowser(t)
if (browser) {
  const { page, context } = browser
  const PASSWORD = 'correct horse battery'
  const server = await startTestServer(t)
  const acme = await createTenant(server.databaseUrl, {
    slug: 'acme',
    members: { 'ada@acme.test': 'admin', 'bob@acme.test': 'member' },
  })
  const ada = acme.members['ada@acme.test']
  const bob = acme.members['bob@acme.test']
  await setPassword(server.databaseUrl, 'ada@acme.test', PASSWORD)
  await setPassword(server.databaseUrl, 'bob@acme.test', PASSWORD)

  // The app's redirect target: a native app listening on a loopback port it chose just now.
  const callbacks: string[] = []
  const receiver = createServer((req, res) => {
    // Chromium also asks the page's origin for /favicon.ico.
    if (req.url?.startsWith('/callback')) callbacks.push(req.url)
    res.setHeader('content-type', 'text/html; charset=utf-8')
    res.end('<!doctype html><title>Mail merge</title><p>You can close this window.</p>')
  })
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise((resolve) => receiver.close(resolve)))
  const redirectUri = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/callback`

  const registered = await registerApp(server, ada.token, { name: 'Mail merge', redirect_uris: ['http://127.0.0.1/callback'] })
  const insecure = { [oauth.allowInsecureRequests]: true }
  const issuer = new URL(server.url)
  let as: oauth.AuthorizationServer
  const client: oauth.Client = { client_id: registered.client_id }
  const clientAuth = oauth.ClientSecretBasic(registered.client_secret!)

  /** The browser goes through the authorization endpoint; returns the callback URL the app received. */
  async function authorizeInBrowser(scope: string, decision: 'Allow' | 'Deny', options: { signIn?: boolean; screenshot?: string } = {}) {
    const verifier = oauth.generateRandomCodeVerifier()
    const state = oauth.generateRandomState()
    const url = new URL(as.authorization_endpoint!)
    url.searchParams.set('client_id', client.client_id)
    url.searchParams.set('redirect_uri', redirectUri)
    url.searchParams.set('response_type', 'code')
    url.searchParams.set('scope', scope)
    url.searchParams.set('state', state)
    url.searchParams.set('code_challenge', await oauth.calculatePKCECodeChallenge(verifier))
    url.searchParams.set('code_challenge_method', 'S256')
    const before = callbacks.length
    await page.goto(url.toString())
    if (options.signIn) {
      await page.waitForURL(/\/sign-in\?next=/)
      await page.getByLabel('Email').fill('bob@acme.test')
      await page.getByLabel('Password').fill(PASSWORD)
      await page.getByRole('button', { name: 'Sign in' }).click()
    }
    await page.getByRole('heading', { name: 'Connect Mail merge' }).waitFor()
    if (options.screenshot) await browser!.screenshot(options.screenshot)
    await page.getByRole('button', { name: decision, exact: true }).click()
    await page.waitForURL(/^http:\/\/127\.0\.0\.1:\d+\/callback\?/)
    t.equal(callbacks.length, before + 1, 'the app received the callback')
    return { callback: new URL(callbacks.at(-1)!, redirectUri), state, verifier }
  }

  async function codeFlow(scope: string, options: { signIn?: boolean; screenshot?: string } = {}) {
    const { callback, state, verifier } = await authorizeInBrowser(scope, 'Allow', options)
    const parameters = oauth.validateAuthResponse(as!, client, callback, state)
    const response = await oauth.authorizationCodeGrantRequest(as!, client, clientAuth, parameters, redirectUri, verifier, insecure)
    return oauth.processAuthorizationCodeResponse(as!, client, response)
  }

  /** The `error` of a token endpoint refusal, as oauth4webapi reports it (a ResponseBodyError). */
  const refusal = (answer: Promise<unknown>) =>
    answer.then(
      () => 'accepted',
      (error: { error?: string }) => error.error,
    )

  // oauth4webapi's protectedResourceRequest throws on a 401 challenge; refusals are read with fetch.
  const api = (token: string, method: string, path: string, body?: unknown) =>
    fetch(server.url + path, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    })

  t.test('discovery from the metadata document', async (t) => {
    as = await oauth.processDiscoveryResponse(issuer, await oauth.discoveryRequest(issuer, { algorithm: 'oauth2', ...insecure }))
    t.equal(as.issuer, server.url)
    t.same(as.code_challenge_methods_supported, ['S256'])
    t.equal(as.authorization_response_iss_parameter_supported, true)
  })

  let tokens: oauth.TokenEndpointResponse
  t.test('sign-in, consent in Chromium, code exchange with PKCE, then the API with the access token', async (t) => {
    tokens = await codeFlow('contacts:read deals:read offline_access', { signIn: true, screenshot: 'oauth-consent' })
    t.equal(tokens.token_type, 'bearer')
    t.equal(tokens.expires_in, 3600)
    t.equal(tokens.scope, 'contacts:read deals:read offline_access')
    t.ok(tokens.refresh_token, 'offline_access brought a refresh token')
    const me = await oauth.protectedResourceRequest(
      tokens.access_token,
      'GET',
      new URL(`${server.url}/api/me`),
      undefined,
      undefined,
      insecure,
    )
    t.equal(me.status, 200)
    t.equal((await me.json()).data.user.email, 'bob@acme.test', 'the token acts for the user who allowed')
    const deals = await api(tokens.access_token, 'GET', '/api/deals')
    t.equal(deals.status, 200, 'a read the scopes cover')
  })

  t.test('a write outside the scopes is refused (403 insufficient_scope)', async (t) => {
    const refused = await api(tokens.access_token, 'POST', '/api/deals', { name: 'Not allowed' })
    t.equal(refused.status, 403)
    t.equal((await refused.json()).code, 'insufficient_scope')
    t.match(refused.headers.get('www-authenticate'), /error="insufficient_scope"/)
    t.match(refused.headers.get('www-authenticate'), /scope="deals:write"/, 'the challenge names the scope it needs')
    const admin = await api(tokens.access_token, 'GET', '/api/oauth-apps')
    t.equal(admin.status, 403, 'nor the admin routes (workspace:admin)')
  })

  t.test('refresh rotates; the old refresh token presented again revokes the whole grant', async (t) => {
    const rotated = await oauth.processRefreshTokenResponse(
      as,
      client,
      await oauth.refreshTokenGrantRequest(as, client, clientAuth, tokens.refresh_token!, insecure),
    )
    t.not(rotated.refresh_token, tokens.refresh_token, 'a new refresh token')
    t.equal((await api(rotated.access_token, 'GET', '/api/me')).status, 200)
    const reuse = await oauth.refreshTokenGrantRequest(as, client, clientAuth, tokens.refresh_token!, insecure)
    t.equal(await refusal(oauth.processRefreshTokenResponse(as, client, reuse)), 'invalid_grant', 'the used refresh token is refused')
    t.equal((await api(rotated.access_token, 'GET', '/api/me')).status, 401, 'every access token of the grant stopped')
    const newest = await oauth.refreshTokenGrantRequest(as, client, clientAuth, rotated.refresh_token!, insecure)
    t.equal(await refusal(oauth.processRefreshTokenResponse(as, client, newest)), 'invalid_grant', 'and the newest refresh token')
  })

  t.test('revocation (RFC 7009) stops the access token', async (t) => {
    const fresh = await codeFlow('deals:read')
    t.equal(fresh.refresh_token, undefined, 'no refresh token without offline_access')
    t.equal((await api(fresh.access_token, 'GET', '/api/me')).status, 200)
    await oauth.processRevocationResponse(await oauth.revocationRequest(as, client, clientAuth, fresh.access_token, insecure))
    t.equal((await api(fresh.access_token, 'GET', '/api/me')).status, 401)
  })

  t.test('Deny sends the user back with access_denied, state and iss', async (t) => {
    const { callback, state } = await authorizeInBrowser('deals:read', 'Deny')
    t.equal(callback.searchParams.get('error'), 'access_denied')
    t.equal(callback.searchParams.get('iss'), server.url)
    t.throws(() => oauth.validateAuthResponse(as, client, callback, state), 'the client reads it as a refused authorization')
  })

  t.test('the user sees the app under "Connected apps" and disconnects it', async (t) => {
    const connected = await codeFlow('contacts:read offline_access')
    await page.goto(`${server.url}/security`)
    const row = page.getByRole('region', { name: 'Connected apps' }).getByRole('row', { name: /Mail merge/ })
    t.match(await row.textContent(), /contacts:read[\s\S]*offline_access/)
    await browser.screenshot('security-connected-apps')
    await row.getByRole('button', { name: 'Disconnect Mail merge' }).click()
    await page.waitForURL(`${server.url}/security?done=revoked`)
    t.equal(
      await page
        .getByRole('region', { name: 'Connected apps' })
        .getByRole('row', { name: /Mail merge/ })
        .count(),
      0,
    )
    t.equal((await api(connected.access_token, 'GET', '/api/me')).status, 401, 'the app is cut off at once')
    const refresh = await oauth.refreshTokenGrantRequest(as, client, clientAuth, connected.refresh_token!, insecure)
    t.equal(await refusal(oauth.processRefreshTokenResponse(as, client, refresh)), 'invalid_grant', 'it cannot refresh either')
  })

  t.test('the admin sees who connected the app and revokes it for the whole workspace', async (t) => {
    const connected = await codeFlow('deals:read offline_access')
    // The browser profile is one; the admin signs in in place of bob, who signs in again below.
    await context.clearCookies()
    const adminPage = await context.newPage()
    await signIn(adminPage, server.url, 'ada@acme.test', PASSWORD)
    await adminPage.waitForURL(`${server.url}/contacts`)
    await adminPage.goto(`${server.url}/oauth-apps`)
    const card = adminPage.getByRole('article', { name: 'Mail merge' })
    t.match(await card.textContent(), /Connected users \(1\)[\s\S]*bob@acme\.test[\s\S]*deals:read offline_access/)
    if (process.env.UI_SCREENSHOT_DIR)
      await adminPage.screenshot({ path: `${process.env.UI_SCREENSHOT_DIR}/oauth-apps-connected.png`, fullPage: true })
    await card.getByRole('button', { name: 'Revoke Mail merge for the whole workspace' }).click()
    await adminPage.waitForURL(`${server.url}/oauth-apps?done=revoked`)
    t.match(await adminPage.getByRole('article', { name: 'Mail merge' }).textContent(), /Connected users \(0\)/)
    t.equal((await api(connected.access_token, 'GET', '/api/me')).status, 401, "bob's token stopped")
    await adminPage.close()
    await context.clearCookies()
  })

  t.test("a suspended user's app token is refused", async (t) => {
    const connected = await codeFlow('deals:read', { signIn: true })
    t.equal((await api(connected.access_token, 'GET', '/api/me')).status, 200)
    t.equal((await server.request('POST', `/api/members/${bob.id}/suspend`, { token: ada.token })).status, 200)
    const refused = await api(connected.access_token, 'GET', '/api/me')
    t.equal(refused.status, 401)
    t.equal((await refused.json()).code, 'user_suspended')
  })
}
