// The OAuth 2.0 authorization server over HTTP (docs/api.md section 4a): the metadata, the
// authorization endpoint's refusals (an error page for an unknown client or redirect URI, a
// redirect with the error otherwise), the token endpoint's RFC 6749 errors (wrong verifier, wrong
// redirect URI, expired code, reused code, unknown client, public client without PKCE), refresh
// rotation with reuse detection, revocation, connected apps for users and admins, suspension, and
// what the database refuses on its own. The whole flow with an independent client in a real
// browser: browser-flow.test.ts.
import { createHash, randomUUID } from 'node:crypto'
import fc from 'fast-check'
import pg from 'pg'
import t from 'tap'
import { SCOPE_DESCRIPTIONS, TOKEN_SCOPES } from '../../src/auth/scopes.ts'
import { hashToken } from '../../src/auth/tokens.ts'
import { ensureRuntimeRole, ensureWorkerRole } from '../../src/db/runtime-role.ts'
import { addMember, createTenant, mintToken, type Teardown, withOwner } from '../helpers/fixtures.ts'
import { startTestServer, TEST_APP_SECRET } from '../helpers/server.ts'
import { authorize, clientFields, codeFor, consent, pkcePair, registerApp, sessionCookie, tokenRequest } from './helpers.ts'

const server = await startTestServer(t, { env: { OAUTH_CODE_TTL_SECONDS: '1' } })
const acme = await createTenant(server.databaseUrl, {
  slug: 'acme',
  members: { 'ada@acme.test': 'admin', 'bob@acme.test': 'member', 'eve@acme.test': 'member' },
})
const ada = acme.members['ada@acme.test']
const bob = acme.members['bob@acme.test']
const other = await createTenant(server.databaseUrl, { slug: 'other', members: { 'zed@other.test': 'admin' } })
const app = await registerApp(server, ada.token)
const publicApp = await registerApp(server, ada.token, {
  name: 'Desktop sync',
  confidential: false,
  redirect_uris: ['http://127.0.0.1/callback'],
})
const bobCookie = await sessionCookie(server, bob.id)
const me = (token: string) => server.request('GET', '/api/me', { token })

/** A user's consent and the code exchange over HTTP: the token endpoint's answer. */
async function connect(cookie: string, to = app, scope = 'contacts:read deals:read offline_access') {
  const grant = await codeFor(server, cookie, to, { scope })
  const answer = await tokenRequest(server, {
    grant_type: 'authorization_code',
    code: grant.code,
    redirect_uri: grant.redirect_uri,
    code_verifier: grant.verifier,
    ...clientFields(to),
  })
  if (answer.status !== 200) throw new Error(`the code exchange answered ${answer.status}: ${JSON.stringify(answer.body)}`)
  return answer.body as { access_token: string; refresh_token?: string; scope: string }
}

/** A plain client of a login role, closed when the test ends. */
async function loginAs(t: Teardown, connectionString: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString })
  await client.connect()
  t.teardown(() => client.end())
  return client
}
const codeOf = (client: pg.Client, text: string, values: unknown[] = []) =>
  client.query(text, values).then(
    () => null,
    (error: { code?: string }) => error.code ?? 'error',
  )

t.test('metadata (RFC 8414): the issuer is the base URL, PKCE S256 only', async (t) => {
  const response = await server.request('GET', '/.well-known/oauth-authorization-server')
  t.equal(response.status, 200)
  t.equal(response.body.issuer, server.url)
  t.equal(response.body.token_endpoint, `${server.url}/oauth/token`)
  t.equal(response.body.authorization_endpoint, `${server.url}/oauth/authorize`)
  t.equal(response.body.revocation_endpoint, `${server.url}/oauth/revoke`)
  t.same(response.body.code_challenge_methods_supported, ['S256'])
  t.same(response.body.grant_types_supported, ['authorization_code', 'refresh_token'])
  t.equal(response.body.authorization_response_iss_parameter_supported, true)
  t.ok(response.body.scopes_supported.includes('offline_access'))
})

t.test('apps: admins only; a confidential app gets its secret once, a public app none; redirect URI rules', async (t) => {
  t.match(app.client_secret, /^crmsec_[A-Za-z0-9_-]{43}$/)
  t.equal(publicApp.confidential, false)
  t.notOk('client_secret' in publicApp, 'a public app has no secret')
  const listed = await server.request('GET', '/api/oauth-apps', { token: ada.token })
  t.same(listed.body.data.map((one: { name: string }) => one.name).sort(), ['Desktop sync', 'Mail merge'])
  t.notOk(JSON.stringify(listed.body).includes('crmsec_'), 'the list never shows a secret')
  t.equal((await server.request('GET', '/api/oauth-apps', { token: bob.token })).body.code, 'forbidden', 'members are refused')
  t.equal(
    (await server.request('GET', `/api/oauth-apps/${app.id}`, { token: other.members['zed@other.test'].token })).status,
    404,
    "another workspace's admin does not see it",
  )
  const stored = await withOwner(server.databaseUrl, (client) =>
    client.query('select client_secret_hash from crm.oauth_apps where id = $1', [app.id]),
  )
  t.same(stored.rows[0].client_secret_hash, createHash('sha256').update(app.client_secret!).digest(), 'only a hash of the secret')

  for (const [uri, why] of [
    ['http://localhost:8080/cb', /127\.0\.0\.1/],
    ['http://example.com/cb', /https/],
    ['https://example.com/cb#x', /fragment/],
    ['https://user:pw@example.com/cb', /user name/],
    ['myapp:/cb', /https/],
  ] as const) {
    const refused = await server.request('POST', '/api/oauth-apps', { token: ada.token, body: { name: 'x', redirect_uris: [uri] } })
    t.equal(refused.status, 422, uri)
    t.equal(refused.body.errors[0].pointer, '/redirect_uris/0')
    t.match(refused.body.errors[0].message, why)
  }
  const changed = await server.request('PATCH', `/api/oauth-apps/${publicApp.id}`, {
    token: ada.token,
    body: { redirect_uris: ['http://127.0.0.1/callback', 'http://[::1]/callback'] },
  })
  t.equal(changed.status, 200)
  t.same(changed.body.data.redirect_uris, ['http://127.0.0.1/callback', 'http://[::1]/callback'])
  // The database holds the rule on its own, whatever the API checks.
  const refused = await withOwner(server.databaseUrl, (client) =>
    client.query(`update crm.oauth_apps set redirect_uris = array['http://localhost/cb'] where id = $1`, [app.id]).then(
      () => 'stored',
      (error: { constraint?: string }) => error.constraint,
    ),
  )
  t.equal(refused, 'oauth_apps_redirect_uris_valid')
})

t.test('authorize: unknown client or redirect URI → an error page, never a redirect', async (t) => {
  const { challenge } = pkcePair()
  for (const [label, parameters] of [
    ['unknown client', { client_id: 'crmapp_AAAAAAAAAAAAAAAAAAAAAA', redirect_uri: 'https://app.example/callback' }],
    ['unregistered redirect URI', { client_id: app.client_id, redirect_uri: 'https://evil.example/callback' }],
    ['a longer path', { client_id: app.client_id, redirect_uri: 'https://app.example/callback/more' }],
    ['another loopback path', { client_id: app.client_id, redirect_uri: 'http://127.0.0.1:4000/other' }],
    ['no redirect URI', { client_id: app.client_id, redirect_uri: '' }],
  ] as const) {
    const response = await authorize(server, { ...parameters, scope: 'deals:read', state: 's', code_challenge: challenge }, bobCookie)
    t.equal(response.status, 400, label)
    t.equal(response.headers.get('location'), null, `${label}: no redirect`)
    t.match(await response.text(), /not valid/)
  }
})

t.test('authorize: other problems go back to the app with error, state and iss', async (t) => {
  const { challenge } = pkcePair()
  const base = { client_id: publicApp.client_id, redirect_uri: 'http://127.0.0.1:53682/callback', state: 'st@te', scope: 'deals:read' }
  const cases = [
    ['public client without PKCE', { ...base, code_challenge: '' }, 'invalid_request'],
    ['plain PKCE', { ...base, code_challenge: challenge, code_challenge_method: 'plain' }, 'invalid_request'],
    ['unknown scope', { ...base, code_challenge: challenge, scope: 'deals:read everything' }, 'invalid_scope'],
    ['no scope', { ...base, code_challenge: challenge, scope: '' }, 'invalid_scope'],
    ['response_type token', { ...base, code_challenge: challenge, response_type: 'token' }, 'unsupported_response_type'],
  ] as const
  for (const [label, parameters, error] of cases) {
    const response = await authorize(server, parameters, bobCookie)
    t.equal(response.status, 303, label)
    const location = new URL(response.headers.get('location')!)
    t.equal(location.origin + location.pathname, 'http://127.0.0.1:53682/callback', `${label}: the loopback redirect keeps its port`)
    t.equal(location.searchParams.get('error'), error, label)
    t.equal(location.searchParams.get('state'), 'st@te')
    t.equal(location.searchParams.get('iss'), server.url)
  }
  const signedOut = await authorize(server, { ...base, code_challenge: challenge })
  t.equal(signedOut.status, 303)
  t.match(
    signedOut.headers.get('location'),
    /^\/sign-in\?next=%2Foauth%2Fauthorize%3F/,
    'a signed-out browser signs in first, then comes back',
  )

  const denied = await consent(server, bobCookie, { ...base, code_challenge: challenge }, 'deny')
  t.equal(denied.searchParams.get('error'), 'access_denied')
  t.equal(denied.searchParams.get('state'), 'st@te')
  t.equal(denied.searchParams.get('iss'), server.url)
  t.equal(denied.searchParams.get('code'), null)
})

t.test('authorize: an error goes back to the app only for a signed-in user who may connect it', async (t) => {
  // Anyone may register an app with an https address: a redirect before sign-in, or for a user
  // outside the app's workspace, would make this origin a redirector to it (RFC 9700 4.11.2).
  const zedCookie = await sessionCookie(server, other.members['zed@other.test'].id)
  const browsers = [
    { who: 'signed out', cookie: undefined, sentBack: false },
    {
      who: 'with a session that is no longer valid',
      cookie: 'crm_session=crm_notAValidSessionTokenAtAllxxxxxxxxxxxxxxxxxx',
      sentBack: false,
    },
    { who: 'outside the app’s workspace', cookie: zedCookie, sentBack: false },
    { who: 'a member of the app’s workspace', cookie: bobCookie, sentBack: true },
  ]
  const { challenge } = pkcePair()
  const valid: [string, string][] = [
    ['client_id', app.client_id],
    ['redirect_uri', 'https://app.example/callback'],
    ['response_type', 'code'],
    ['scope', 'deals:read'],
    ['state', 'st'],
    ['code_challenge', challenge],
    ['code_challenge_method', 'S256'],
  ]
  // Each spoils one parameter other than client_id and redirect_uri, as a careless or hostile link would.
  const spoilers = fc.constantFrom<[string, string | null | 'twice']>(
    ['response_type', 'token'],
    ['response_type', 'id_token'],
    ['response_type', 'code token'],
    ['response_type', null],
    ['response_type', 'twice'],
    ['scope', 'everything'],
    ['scope', 'deals:read deals:read'],
    ['scope', null],
    ['scope', 'twice'],
    ['state', 'x'.repeat(2001)],
    ['state', 'twice'],
    ['code_challenge', null],
    ['code_challenge', 'short'],
    ['code_challenge', `${'a'.repeat(42)}!`],
    ['code_challenge', 'twice'],
    ['code_challenge_method', 'plain'],
    ['code_challenge_method', null],
    ['code_challenge_method', 'twice'],
  )
  await fc.assert(
    fc.asyncProperty(fc.uniqueArray(spoilers, { minLength: 1, maxLength: 3, selector: ([name]) => name }), async (spoiled) => {
      const search = new URLSearchParams()
      for (const [name, value] of valid) {
        const spoiler = spoiled.find(([spoiledName]) => spoiledName === name)
        if (!spoiler) search.append(name, value)
        else if (spoiler[1] === 'twice') search.append(name, value), search.append(name, value)
        else if (spoiler[1] !== null) search.append(name, spoiler[1])
      }
      for (const { who, cookie, sentBack } of browsers) {
        const response = await fetch(`${server.url}/oauth/authorize?${search}`, { redirect: 'manual', headers: cookie ? { cookie } : {} })
        const location = response.headers.get('location')
        const text = await response.text()
        const label = `${who}, ${spoiled.map(([name, value]) => `${name}=${String(value).slice(0, 12)}`).join(', ')}`
        if (sentBack) {
          const back = new URL(location ?? 'about:blank')
          if (response.status !== 303 || back.origin + back.pathname !== 'https://app.example/callback' || !back.searchParams.get('error'))
            throw new Error(`${label}: not sent back with an error (${response.status} ${location})`)
        } else if (location !== null && !location.startsWith('/')) {
          throw new Error(`${label}: sent to ${location} (${response.status})`)
        } else if (location === null && (response.status !== 400 || !/not valid/.test(text))) {
          throw new Error(`${label}: answered ${response.status} without the error`)
        }
      }
    }),
    { numRuns: 40 },
  )
  t.pass('no error sent a browser to the app’s address unless its user may connect the app')
})

t.test('the consent page names the app, the workspace and each scope; a non-member cannot connect', async (t) => {
  const { challenge } = pkcePair()
  const page = await authorize(
    server,
    {
      client_id: app.client_id,
      redirect_uri: 'https://app.example/callback',
      scope: 'deals:read offline_access',
      state: 's',
      code_challenge: challenge,
    },
    bobCookie,
  )
  const text = await page.text()
  t.equal(page.status, 200)
  t.match(text, /Connect Mail merge/)
  t.match(text, /Workspace<\/dt><dd>acme/)
  t.match(text, /See and export deals, their stages and associations/)
  t.match(text, /Stay connected: receive a refresh token/)
  t.match(page.headers.get('content-security-policy'), /form-action 'self' https:\/\/app\.example/, 'the form may redirect to the app')
  const zedCookie = await sessionCookie(server, other.members['zed@other.test'].id)
  const outsider = await authorize(
    server,
    { client_id: app.client_id, redirect_uri: 'https://app.example/callback', scope: 'deals:read', state: 's', code_challenge: challenge },
    zedCookie,
  )
  t.equal(outsider.status, 403)
  const outsiderText = await outsider.text()
  t.match(outsiderText, /not an active member/)
  t.notMatch(outsiderText, /acme/i, 'the outsider is not told which workspace the app belongs to')
  t.notMatch(outsiderText, /app\.example/, 'nor given a link to the app’s address')
})

t.test('SQL: the workspace behind a client id only for a user who may connect the app', async (t) => {
  const zed = other.members['zed@other.test']
  const suspended = await withOwner(server.databaseUrl, async (client) => {
    const member = await addMember(client, acme.id, 'sid@acme.test', 'member')
    await client.query('update crm.memberships set suspended_at = now() where workspace_id = $1 and user_id = $2', [acme.id, member.id])
    // Signed in through the other workspace: the token still proves who they are.
    await addMember(client, other.id, 'sid@acme.test', 'member')
    return member
  })
  const lookUp = (token: string, slug: string) =>
    withOwner(server.databaseUrl, async (client) => {
      await client.query('begin')
      try {
        await client.query(`select a.failure, set_config('role', 'crm_api', true) from crm.authenticate($1, $2, 'ui', 600) a`, [
          hashToken(token),
          slug,
        ])
        const { rows } = await client.query(
          `select app_name, workspace_id, workspace_slug, workspace_name, redirect_uri_ok, user_may_connect
             from crm.oauth_authorization_client($1, 'https://app.example/callback')`,
          [app.client_id],
        )
        return rows[0]
      } finally {
        await client.query('rollback')
      }
    })
  t.same(
    await lookUp(bob.token, 'acme'),
    {
      app_name: 'Mail merge',
      workspace_id: acme.id,
      workspace_slug: 'acme',
      workspace_name: 'acme',
      redirect_uri_ok: true,
      user_may_connect: true,
    },
    'a member of the app’s workspace sees it',
  )
  const hidden = {
    app_name: 'Mail merge',
    workspace_id: null,
    workspace_slug: null,
    workspace_name: null,
    redirect_uri_ok: true,
    user_may_connect: false,
  }
  t.same(await lookUp(zed.token, 'other'), hidden, 'a user of another workspace does not')
  t.same(await lookUp(suspended.token, 'other'), hidden, 'nor a member suspended in it')
})

t.test('token endpoint: the code exchange and its RFC 6749 refusals', async (t) => {
  const exchange = (grant: { code: string; verifier: string; redirect_uri: string }, extra: Record<string, string> = {}, client = app) =>
    tokenRequest(server, {
      grant_type: 'authorization_code',
      code: grant.code,
      redirect_uri: grant.redirect_uri,
      code_verifier: grant.verifier,
      ...clientFields(client),
      ...extra,
    })

  t.test('a good exchange (client_secret_post) answers a Bearer token for one hour, a refresh token and the scope', async (t) => {
    const grant = await codeFor(server, bobCookie, app)
    const answer = await exchange(grant)
    t.equal(answer.status, 200)
    t.equal(answer.headers.get('cache-control'), 'no-store')
    t.match(answer.body, { token_type: 'Bearer', expires_in: 3600, scope: 'contacts:read deals:read offline_access' })
    t.match(answer.body.access_token, /^crm_[A-Za-z0-9_-]{43}$/)
    t.match(answer.body.refresh_token, /^crmrt_[A-Za-z0-9_-]{43}$/)
    const caller = await me(answer.body.access_token)
    t.equal(caller.status, 200, 'the access token works on the API')
    t.equal(caller.body.data.user.email, 'bob@acme.test')
    const lifetime = (Date.parse(caller.body.data.token.expires_at) - Date.now()) / 1000
    t.ok(lifetime > 3500 && lifetime <= 3600, 'it expires in an hour')
    const stored = await withOwner(server.databaseUrl, (client) =>
      client.query(
        `select (select count(*)::int from crm.oauth_codes where code_hash = $1) as codes,
                (select count(*)::int from crm.oauth_refresh_tokens where token_hash = $2) as refresh`,
        [createHash('sha256').update(grant.code).digest(), createHash('sha256').update(answer.body.refresh_token).digest()],
      ),
    )
    t.same(stored.rows[0], { codes: 1, refresh: 1 }, 'codes and refresh tokens are stored as SHA-256 only')

    const again = await exchange(grant)
    t.equal(again.status, 400)
    t.equal(again.body.error, 'invalid_grant', 'a code works once')
    t.equal((await me(answer.body.access_token)).body.code, 'token_revoked', 'its second use revokes the token issued from it')
    const refresh = await tokenRequest(server, {
      grant_type: 'refresh_token',
      refresh_token: answer.body.refresh_token,
      ...clientFields(app),
    })
    t.equal(refresh.body.error, 'invalid_grant', 'and the refresh token')
  })

  t.test('client_secret_basic works; a wrong or missing secret is invalid_client (401)', async (t) => {
    const grant = await codeFor(server, bobCookie, app)
    const wrong = await tokenRequest(
      server,
      { grant_type: 'authorization_code', code: grant.code, redirect_uri: grant.redirect_uri, code_verifier: grant.verifier },
      { basic: [app.client_id, 'crmsec_wrong'] },
    )
    t.equal(wrong.status, 401)
    t.equal(wrong.body.error, 'invalid_client')
    t.match(wrong.headers.get('www-authenticate'), /^Basic/)
    const missing = await exchange(grant, { client_secret: '' })
    t.equal(missing.body.error, 'invalid_client', 'a confidential client must authenticate')
    const basic = await tokenRequest(
      server,
      { grant_type: 'authorization_code', code: grant.code, redirect_uri: grant.redirect_uri, code_verifier: grant.verifier },
      { basic: [app.client_id, app.client_secret!] },
    )
    t.equal(basic.status, 200, 'failed client authentication does not use the code up')
  })

  t.test('unknown client', async (t) => {
    const grant = await codeFor(server, bobCookie, app)
    const answer = await exchange(grant, { client_id: 'crmapp_AAAAAAAAAAAAAAAAAAAAAA' })
    t.equal(answer.status, 401)
    t.equal(answer.body.error, 'invalid_client')
  })

  t.test('wrong verifier: invalid_grant, and the code is used up', async (t) => {
    const grant = await codeFor(server, bobCookie, app)
    const wrong = await exchange(grant, { code_verifier: pkcePair().verifier })
    t.equal(wrong.status, 400)
    t.equal(wrong.body.error, 'invalid_grant')
    t.equal((await exchange(grant)).body.error, 'invalid_grant', 'the right verifier comes too late')
    const missing = await exchange(await codeFor(server, bobCookie, app), { code_verifier: '' })
    t.equal(missing.body.error, 'invalid_request', 'no verifier at all is a malformed request')
  })

  t.test('wrong redirect URI', async (t) => {
    const grant = await codeFor(server, bobCookie, app)
    const answer = await exchange(grant, { redirect_uri: 'http://127.0.0.1/callback' })
    t.equal(answer.body.error, 'invalid_grant')
  })

  t.test('expired code (OAUTH_CODE_TTL_SECONDS=1 here; the database caps it at 60)', async (t) => {
    const grant = await codeFor(server, bobCookie, app)
    await new Promise((resolve) => setTimeout(resolve, 1500))
    const answer = await exchange(grant)
    t.equal(answer.body.error, 'invalid_grant')
    t.match(answer.body.error_description, /expired/)
    const refused = await withOwner(server.databaseUrl, (client) =>
      client.query(`update crm.oauth_codes set expires_at = created_at + interval '61 seconds'`).then(
        () => 'stored',
        (error: { constraint?: string }) => error.constraint,
      ),
    )
    t.equal(refused, 'oauth_codes_lifetime', 'no code lives longer than 60 seconds')
  })

  t.test('a code of another app', async (t) => {
    const grant = await codeFor(server, bobCookie, app)
    const answer = await exchange(grant, {}, publicApp)
    t.equal(answer.body.error, 'invalid_grant')
  })

  t.test('a public client exchanges with PKCE alone; a secret from it is refused', async (t) => {
    const grant = await codeFor(server, bobCookie, publicApp, { redirect_uri: 'http://[::1]:61000/callback', scope: 'deals:read' })
    const withSecret = await exchange(grant, { client_secret: 'crmsec_x' }, publicApp)
    t.equal(withSecret.body.error, 'invalid_client')
    const answer = await exchange(grant, {}, publicApp)
    t.equal(answer.status, 200)
    t.equal(answer.body.scope, 'deals:read')
    t.notOk('refresh_token' in answer.body, 'no refresh token without offline_access')
  })

  t.test('malformed requests', async (t) => {
    t.equal((await tokenRequest(server, { grant_type: 'password', ...clientFields(app) })).body.error, 'unsupported_grant_type')
    t.equal((await tokenRequest(server, { ...clientFields(app) })).body.error, 'invalid_request')
    const json = await server.request('POST', '/oauth/token', { body: { grant_type: 'authorization_code' } })
    t.equal(json.status, 400)
    t.equal(json.body.error, 'invalid_request', 'a JSON body is not a form')
    const twice = await fetch(`${server.url}/oauth/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: 'grant_type=refresh_token&grant_type=refresh_token',
    })
    t.equal((await twice.json()).error, 'invalid_request', 'a parameter sent twice')
  })
})

t.test('refresh tokens rotate; a used one presented again revokes the grant', async (t) => {
  const grant = await codeFor(server, bobCookie, app)
  const first = (
    await tokenRequest(server, {
      grant_type: 'authorization_code',
      code: grant.code,
      redirect_uri: grant.redirect_uri,
      code_verifier: grant.verifier,
      ...clientFields(app),
    })
  ).body
  const refresh = (refreshToken: string, extra: Record<string, string> = {}) =>
    tokenRequest(server, { grant_type: 'refresh_token', refresh_token: refreshToken, ...clientFields(app), ...extra })

  const wider = await refresh(first.refresh_token, { scope: 'deals:write' })
  t.equal(wider.body.error, 'invalid_scope', 'a refresh cannot widen the scope')
  const second = await refresh(first.refresh_token, { scope: 'deals:read' })
  t.equal(second.status, 200, 'the refresh token is still good after the refused widening')
  t.equal(second.body.scope, 'deals:read', 'a narrower scope for the new access token')
  t.not(second.body.refresh_token, first.refresh_token, 'a new refresh token')
  const third = await refresh(second.body.refresh_token)
  t.equal(third.body.scope, 'contacts:read deals:read offline_access', 'the refresh token kept the granted scopes')
  t.equal((await me(third.body.access_token)).status, 200)

  const reused = await refresh(first.refresh_token)
  t.equal(reused.body.error, 'invalid_grant')
  t.match(reused.body.error_description, /already used/)
  t.equal((await me(third.body.access_token)).body.code, 'token_revoked', 'every access token of the grant stops')
  t.equal((await me(first.access_token)).body.code, 'token_revoked')
  t.equal((await refresh(third.body.refresh_token)).body.error, 'invalid_grant', 'and the newest refresh token')
})

t.test('revocation (RFC 7009): a refresh or an access token revokes the grant; unknown tokens answer 200', async (t) => {
  const issue = async () => {
    const grant = await codeFor(server, bobCookie, app)
    return (
      await tokenRequest(server, {
        grant_type: 'authorization_code',
        code: grant.code,
        redirect_uri: grant.redirect_uri,
        code_verifier: grant.verifier,
        ...clientFields(app),
      })
    ).body
  }
  const revoke = (token: string, client = app) => tokenRequest(server, { token, ...clientFields(client) }, { path: '/oauth/revoke' })

  const one = await issue()
  t.equal((await revoke(one.refresh_token)).status, 200)
  t.equal((await me(one.access_token)).body.code, 'token_revoked')
  const two = await issue()
  t.equal((await revoke(two.access_token, publicApp)).status, 200, "another app's token: answered like an unknown one")
  t.equal((await me(two.access_token)).status, 200, 'and left alone')
  t.equal((await revoke(two.access_token)).status, 200)
  t.equal((await me(two.access_token)).body.code, 'token_revoked')
  const refreshed = await tokenRequest(server, { grant_type: 'refresh_token', refresh_token: two.refresh_token, ...clientFields(app) })
  t.equal(refreshed.body.error, 'invalid_grant', 'revoking the access token revoked the grant')
  t.equal((await revoke('crm_not_a_token_at_all')).status, 200)
  t.equal((await revoke('x', { ...app, client_secret: 'crmsec_wrong' })).status, 401)
})

t.test('connected apps: the user lists and revokes theirs; the admin lists and revokes the app for everyone', async (t) => {
  const eve = acme.members['eve@acme.test']
  const eveCookie = await sessionCookie(server, eve.id)
  const grant = await codeFor(server, eveCookie, app, { scope: 'deals:read offline_access' })
  const tokens = (
    await tokenRequest(server, {
      grant_type: 'authorization_code',
      code: grant.code,
      redirect_uri: grant.redirect_uri,
      code_verifier: grant.verifier,
      ...clientFields(app),
    })
  ).body
  const listed = (await server.request('GET', '/api/tokens', { token: eve.token })).body.data
  const connected = listed.filter((entry: { kind: string }) => entry.kind === 'oauth')
  t.equal(connected.length, 1, 'one entry per connected app')
  t.match(connected[0], {
    name: 'Mail merge',
    app: { id: app.id, name: 'Mail merge' },
    scopes: ['deals:read', 'offline_access'],
    current: false,
  })

  const connections = await server.request('GET', `/api/oauth-apps/${app.id}/connections`, { token: ada.token })
  t.ok(
    connections.body.data.some((entry: { user: { email: string } }) => entry.user.email === 'eve@acme.test'),
    'the admin sees eve',
  )
  t.equal((await server.request('GET', `/api/oauth-apps/${app.id}/connections`, { token: eve.token })).status, 403)

  t.equal((await server.request('DELETE', `/api/tokens/${connected[0].id}`, { token: eve.token })).status, 204)
  t.equal((await me(tokens.access_token)).body.code, 'token_revoked', 'disconnecting stops the access token')
  const refreshed = await tokenRequest(server, { grant_type: 'refresh_token', refresh_token: tokens.refresh_token, ...clientFields(app) })
  t.equal(refreshed.body.error, 'invalid_grant', 'and the refresh token')

  const again = await codeFor(server, eveCookie, app)
  const more = (
    await tokenRequest(server, {
      grant_type: 'authorization_code',
      code: again.code,
      redirect_uri: again.redirect_uri,
      code_verifier: again.verifier,
      ...clientFields(app),
    })
  ).body
  t.equal((await server.request('DELETE', `/api/oauth-apps/${app.id}/connections`, { token: eve.token })).status, 403, 'members cannot')
  t.equal((await server.request('DELETE', `/api/oauth-apps/${app.id}/connections`, { token: ada.token })).status, 204)
  t.equal((await me(more.access_token)).body.code, 'token_revoked', "the admin's revocation stops every member's token")
  const left = await server.request('GET', `/api/oauth-apps/${app.id}/connections`, { token: ada.token })
  t.same(left.body.data, [], 'nobody is connected any more')
})

t.test("a suspended user's app token is refused, and it cannot be refreshed", async (t) => {
  const carl = await withOwner(server.databaseUrl, (client) => addMember(client, acme.id, 'carl@acme.test', 'member'))
  const carlCookie = await sessionCookie(server, carl.id)
  const grant = await codeFor(server, carlCookie, app)
  const tokens = (
    await tokenRequest(server, {
      grant_type: 'authorization_code',
      code: grant.code,
      redirect_uri: grant.redirect_uri,
      code_verifier: grant.verifier,
      ...clientFields(app),
    })
  ).body
  t.equal((await me(tokens.access_token)).status, 200)
  t.equal((await server.request('POST', `/api/members/${carl.id}/suspend`, { token: ada.token })).status, 200)
  const refused = await me(tokens.access_token)
  t.equal(refused.status, 401)
  t.equal(refused.body.code, 'user_suspended')
  const refreshed = await tokenRequest(server, { grant_type: 'refresh_token', refresh_token: tokens.refresh_token, ...clientFields(app) })
  t.equal(refreshed.body.error, 'invalid_grant')
})

t.test('the runtime role reaches codes, refresh tokens and secrets only through the OAuth functions', async (t) => {
  const answers = await withOwner(server.databaseUrl, async (client) => {
    const results: Record<string, string> = {}
    for (const [label, statement] of [
      ['codes', 'select * from crm.oauth_codes'],
      ['refresh tokens', 'select * from crm.oauth_refresh_tokens'],
      ['client secrets', 'select client_secret_hash from crm.oauth_apps'],
      [
        'inserting a grant',
        `insert into crm.oauth_grants (workspace_id, app_id, user_id, scopes, expires_at) values (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), array['deals:read'], now())`,
      ],
      ['the internal client check', `select crm.oauth_client('x', null)`],
    ]) {
      await client.query('begin')
      await client.query('set local role crm_api')
      results[label] = await client.query(statement).then(
        () => 'allowed',
        (error: { code?: string }) => error.code ?? 'error',
      )
      await client.query('rollback')
    }
    return results
  })
  t.same(answers, {
    codes: '42501',
    'refresh tokens': '42501',
    'client secrets': '42501',
    'inserting a grant': '42501',
    'the internal client check': '42501',
  })
})

t.test('housekeeping removes grants a week after they were revoked, with their tokens and refresh tokens', async (t) => {
  const grant = await codeFor(server, bobCookie, app)
  const tokens = (
    await tokenRequest(server, {
      grant_type: 'authorization_code',
      code: grant.code,
      redirect_uri: grant.redirect_uri,
      code_verifier: grant.verifier,
      ...clientFields(app),
    })
  ).body
  await tokenRequest(server, { token: tokens.refresh_token, ...clientFields(app) }, { path: '/oauth/revoke' })
  const worker = await loginAs(t, await ensureWorkerRole(server.databaseUrl, TEST_APP_SECRET))
  const hash = createHash('sha256').update(tokens.access_token).digest()
  await withOwner(server.databaseUrl, (client) =>
    client.query(
      `update crm.oauth_grants set revoked_at = now() - interval '8 days'
        where id = (select oauth_grant_id from crm.tokens where token_hash = $1)`,
      [hash],
    ),
  )
  // The worker's housekeeping (crm_worker) runs crm.prune_oauth with the other prune_* functions.
  const pruned = await worker.query(`select removed::int from crm.housekeeping(30) where step = 'crm.prune_oauth'`)
  t.equal(await codeOf(worker, 'select crm.prune_oauth(30)'), '42501', 'only through housekeeping')
  const left = await withOwner(server.databaseUrl, async (client) => {
    const token = await client.query('select count(*)::int as n from crm.tokens where token_hash = $1', [hash])
    return { pruned: pruned.rows[0].removed, token: token.rows[0].n }
  })
  t.ok(left.pruned >= 1, `crm.prune_oauth removed ${left.pruned} rows`)
  t.equal(left.token, 0, 'the access token went with its grant')
})

t.test('the token endpoint: a confidential client counts as itself, anything else against its address', async (t) => {
  const LIMIT = 3
  const CLIENT_LIMIT = 6
  const limited = await startTestServer(t, {
    env: { UNAUTHENTICATED_RATE_LIMIT_PER_MINUTE: String(LIMIT), OAUTH_CLIENT_RATE_LIMIT_PER_MINUTE: String(CLIENT_LIMIT) },
  })
  const { members } = await createTenant(limited.databaseUrl, { members: { 'ada@limits.test': 'admin' } })
  const admin = members['ada@limits.test'].token
  const busy = await registerApp(limited, admin, { name: 'Busy sync' })
  const quiet = await registerApp(limited, admin, { name: 'Quiet sync' })
  const desktop = await registerApp(limited, admin, { name: 'Desktop', confidential: false, redirect_uris: ['http://127.0.0.1/callback'] })
  // A refresh token nobody issued: the client is checked, then the grant is refused (400 invalid_grant).
  const refresh = (fields: Record<string, string>) =>
    tokenRequest(limited, { grant_type: 'refresh_token', refresh_token: `crmrt_${'A'.repeat(43)}`, ...fields })
  // Counts are per clock minute: 2 × the limit + 1 requests hold more than the limit on one side
  // of wherever a minute ends among them, so a refusal must show up.
  const statusesOf = async (count: number, send: () => Promise<{ status: number }>) => {
    const statuses: number[] = []
    for (let i = 0; i < count; i++) statuses.push((await send()).status)
    return statuses
  }

  const busyStatuses = await statusesOf(2 * CLIENT_LIMIT + 1, () => refresh(clientFields(busy)))
  t.same(
    busyStatuses.slice(0, CLIENT_LIMIT),
    new Array(CLIENT_LIMIT).fill(400),
    'one client refreshing for many users is not held to the per-address limit',
  )
  t.ok(busyStatuses.includes(429), `past its own limit it is refused (${busyStatuses.join(' ')})`)
  t.equal((await refresh(clientFields(quiet))).status, 400, 'another client from the same address has its own count')

  const guesses = await statusesOf(2 * LIMIT + 1, () => refresh({ client_id: quiet.client_id, client_secret: `crmsec_${randomUUID()}` }))
  t.same(
    guesses.filter((status) => status !== 429),
    guesses.filter((status) => status === 401),
    'a wrong secret is invalid_client',
  )
  t.ok(guesses.includes(429), `made-up secrets count against the address (${guesses.join(' ')})`)

  const publicStatuses = await statusesOf(2 * LIMIT + 1, () => refresh(clientFields(desktop)))
  t.ok(publicStatuses.includes(429), `a public client counts against its address (${publicStatuses.join(' ')})`)
  const anonymous = await statusesOf(2 * LIMIT + 1, () =>
    tokenRequest(limited, { grant_type: 'refresh_token', refresh_token: 'x', client_id: 'x' }),
  )
  t.ok(anonymous.includes(429), `so does an unknown client (${anonymous.join(' ')})`)
})

t.test('a change made through an app names the app in the event (actor via oauth, app_id)', async (t) => {
  const tokens = await connect(bobCookie, app, 'deals:write')
  const created = await server.request('POST', '/api/deals', { token: tokens.access_token, body: { name: 'Through Mail merge' } })
  t.equal(created.status, 201)
  const actor = await withOwner(server.databaseUrl, async (client) => {
    const { rows } = await client.query(`select actor from crm.events where record_id = $1 and event = 'deal.created'`, [
      created.body.data.id,
    ])
    return rows[0].actor
  })
  t.same(actor, { type: 'user', id: bob.id, via: 'oauth', app_id: app.id })
  const personal = await server.request('POST', '/api/deals', { token: bob.token, body: { name: 'By hand' } })
  const byHand = await withOwner(server.databaseUrl, async (client) => {
    const { rows } = await client.query(`select actor from crm.events where record_id = $1 and event = 'deal.created'`, [
      personal.body.data.id,
    ])
    return rows[0].actor
  })
  t.same(byHand, { type: 'user', id: bob.id, via: 'api' }, 'a personal token names no app')
})

t.test("an app's access token sees and revokes only its own authorization, and lists only its workspace", async (t) => {
  const dora = await withOwner(server.databaseUrl, async (client) => {
    const member = await addMember(client, acme.id, 'dora@acme.test', 'member')
    await addMember(client, other.id, 'dora@acme.test', 'member')
    return member
  })
  const doraCookie = await sessionCookie(server, dora.id)
  const otherApp = await registerApp(server, ada.token, { name: 'Calendar sync' })
  const mine = await connect(doraCookie, app, 'deals:read offline_access')
  const sameAppAgain = await connect(doraCookie, app, 'contacts:read')
  const theOtherApp = await connect(doraCookie, otherApp, 'deals:read')
  const grantOf = (tokens: { access_token: string }) =>
    withOwner(server.databaseUrl, async (client) => {
      const { rows } = await client.query('select oauth_grant_id from crm.tokens where token_hash = $1', [hashToken(tokens.access_token)])
      return rows[0].oauth_grant_id as string
    })
  const [myGrant, sameAppGrant, otherAppGrant] = [await grantOf(mine), await grantOf(sameAppAgain), await grantOf(theOtherApp)]
  type Entry = { id: string; kind: string }
  const list = async (token: string) => (await server.request('GET', '/api/tokens', { token })).body.data as Entry[]
  const revoke = async (token: string, id: string) => (await server.request('DELETE', `/api/tokens/${id}`, { token })).status

  const seen = await list(mine.access_token)
  t.equal(seen.length, 1, 'GET /api/tokens: one entry, its own authorization')
  t.match(seen[0], {
    id: myGrant,
    kind: 'oauth',
    app: { id: app.id, name: 'Mail merge' },
    scopes: ['deals:read', 'offline_access'],
    current: true,
  })
  const everything = await list(dora.token)
  t.same(
    everything
      .filter((entry) => entry.kind === 'oauth')
      .map((entry) => entry.id)
      .sort(),
    [myGrant, sameAppGrant, otherAppGrant].sort(),
    "the user's own token sees every connection",
  )
  const personal = everything.find((entry) => entry.kind === 'token')!

  const workspaces = (await server.request('GET', '/api/workspaces', { token: mine.access_token })).body.data
  t.same(
    workspaces.map((entry: { slug: string }) => entry.slug),
    ['acme'],
    'GET /api/workspaces: its own workspace only',
  )
  const both = (await server.request('GET', '/api/workspaces', { token: dora.token })).body.data
  t.same(both.map((entry: { slug: string }) => entry.slug).sort(), ['acme', 'other'], "the user's own token lists both")

  t.equal(await revoke(mine.access_token, personal.id), 404, "the user's personal token is not found for the app")
  t.equal(await revoke(mine.access_token, otherAppGrant), 404, "nor another app's connection")
  t.equal(await revoke(mine.access_token, sameAppGrant), 404, 'nor another connection of the same app')
  t.equal((await me(dora.token)).status, 200)
  t.equal((await me(theOtherApp.access_token)).status, 200)
  t.equal((await me(sameAppAgain.access_token)).status, 200)

  t.equal((await server.request('DELETE', '/api/tokens', { token: mine.access_token })).status, 204, 'DELETE /api/tokens')
  t.equal((await me(mine.access_token)).body.code, 'token_revoked', 'revoked its own authorization')
  const refreshed = await tokenRequest(server, { grant_type: 'refresh_token', refresh_token: mine.refresh_token!, ...clientFields(app) })
  t.equal(refreshed.body.error, 'invalid_grant', 'with its refresh token')
  t.equal((await me(dora.token)).status, 200, "and nothing else: the user's personal token works")
  t.equal((await me(theOtherApp.access_token)).status, 200, 'the other app too')
  t.equal((await me(sameAppAgain.access_token)).status, 200, 'and the other connection of the same app')

  t.equal(await revoke(sameAppAgain.access_token, sameAppGrant), 204, 'DELETE /api/tokens/{its own grant}')
  t.equal((await me(sameAppAgain.access_token)).body.code, 'token_revoked')
  t.equal((await me(theOtherApp.access_token)).status, 200)
})

t.test('a scoped personal token keeps the whole token list and every workspace', async (t) => {
  const eva = await withOwner(server.databaseUrl, async (client) => {
    const member = await addMember(client, acme.id, 'eva@acme.test', 'member')
    await addMember(client, other.id, 'eva@acme.test', 'member')
    return { ...member, scoped: await mintToken(client, member.id, { scopes: ['deals:read'] }) }
  })
  const tokens = (await server.request('GET', '/api/tokens', { token: eva.scoped })).body.data
  t.equal(tokens.length, 3, 'its own and the two unscoped ones')
  const workspaces = (await server.request('GET', '/api/workspaces', { token: eva.scoped })).body.data
  t.same(workspaces.map((entry: { slug: string }) => entry.slug).sort(), ['acme', 'other'])
  const refused = await server.request('GET', '/api/oauth-apps', { token: eva.scoped })
  t.equal(refused.status, 403)
  t.equal(refused.body.code, 'insufficient_scope', 'the OAuth apps need workspace:admin')
  t.match(refused.headers.get('www-authenticate'), /scope="workspace:admin"/)
})

t.test("SQL: in an app's proven context the user's other tokens, apps and workspaces are not there", async (t) => {
  const finn = await withOwner(server.databaseUrl, async (client) => {
    const member = await addMember(client, acme.id, 'finn@acme.test', 'member')
    await addMember(client, other.id, 'finn@acme.test', 'member')
    return member
  })
  const finnCookie = await sessionCookie(server, finn.id)
  const viaApp = await connect(finnCookie, app, 'deals:read')
  await connect(finnCookie, publicApp, 'deals:read')
  const answers = await withOwner(server.databaseUrl, async (client) => {
    const inContext = async (token: string) => {
      await client.query('begin')
      try {
        await client.query(`select a.failure, set_config('role', 'crm_api', true) from crm.authenticate($1, 'acme', 'api', 600) a`, [
          hashToken(token),
        ])
        const { rows } = await client.query(
          `select
            (select count(*)::int from crm.tokens) as tokens,
            (select count(*)::int from crm.oauth_grants) as grants,
            (select count(*)::int from crm.oauth_apps) as apps,
            (select count(*)::int from crm.workspaces) as workspaces,
            (select count(*)::int from crm.memberships where user_id = $1) as memberships`,
          [finn.id],
        )
        const { rowCount } = await client.query('update crm.tokens set revoked_at = now() where kind <> $1', ['oauth'])
        return { ...rows[0], revocable: rowCount }
      } finally {
        await client.query('rollback')
      }
    }
    return { app: await inContext(viaApp.access_token), personal: await inContext(finn.token) }
  })
  t.same(answers.app, { tokens: 1, grants: 1, apps: 1, workspaces: 1, memberships: 1, revocable: 0 }, 'the app: its own')
  t.same(
    answers.personal,
    // Two personal tokens (one per membership made), the session and the two apps' access tokens.
    { tokens: 5, grants: 2, apps: 2, workspaces: 2, memberships: 2, revocable: 3 },
    'the personal token: every token, connection and workspace of the user',
  )
})

t.test('the token endpoint functions are the runtime role’s: SQL inside a request cannot call them', async (t) => {
  const runtime = await loginAs(t, await ensureRuntimeRole(server.databaseUrl, TEST_APP_SECRET))
  const calls = [
    `select * from crm.oauth_exchange_code('x', null, $1, 'https://app.example/callback', 'v', $1, null)`,
    `select * from crm.oauth_refresh('x', null, $1, null, $1, null)`,
    `select crm.oauth_revoke('x', null, $1)`,
    `select crm.oauth_client_redirect_ok('x', 'https://app.example/callback')`,
  ]
  const hash = Buffer.alloc(32)
  for (const call of calls) {
    t.equal(await codeOf(runtime, call, call.includes('$1') ? [hash] : []), null, `crm_runtime: ${call.slice(0, 40)}`)
    await runtime.query('begin')
    await runtime.query(`select set_config('role', 'crm_api', true)`)
    t.equal(await codeOf(runtime, call, call.includes('$1') ? [hash] : []), '42501', `as crm_api: refused`)
    await runtime.query('rollback')
  }
})

t.test('the OpenAPI document: the oauth2 scheme lists the scopes, each operation names the ones it accepts', async (t) => {
  const document = (await server.request('GET', '/api/openapi.json')).body
  const scheme = document.components.securitySchemes.oauth2
  t.equal(scheme.type, 'oauth2')
  t.same(Object.keys(scheme.flows.authorizationCode.scopes).sort(), [...TOKEN_SCOPES].sort(), 'every scope, with its words')
  t.equal(scheme.flows.authorizationCode.scopes['deals:read'], SCOPE_DESCRIPTIONS['deals:read'])
  const requirement = (path: string, method: string) =>
    document.paths[path][method].security.find((entry: Record<string, string[]>) => 'oauth2' in entry).oauth2
  t.same(requirement('/api/deals', 'get'), ['deals:read', 'deals:write'])
  t.same(requirement('/api/deals', 'post'), ['deals:write'])
  t.same(requirement('/api/oauth-apps', 'get'), ['workspace:admin'])
  t.same(requirement('/api/oauth-apps/{id}/connections', 'delete'), ['workspace:admin'])
  t.same(requirement('/api/me', 'get'), [], 'a route every token may call')
  t.same(document.paths['/oauth/token'].post.security, [], 'the token endpoint authenticates the client itself')
})
