// The UI over plain HTTP (no browser needed): security headers, cookie flags behind an https
// proxy, CSRF, escaping, and that /api keeps answering JSON, never HTML.
import t from 'tap'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { setPassword } from './browser.ts'

// The test client stands in for an https proxy, so the proxy's address is trusted.
const server = await startTestServer(t, { env: { TRUST_PROXY: '127.0.0.1/32, ::1' } })
const acme = await createTenant(server.databaseUrl, { slug: 'acme', members: { 'ada@acme.test': 'admin' } })
await setPassword(server.databaseUrl, 'ada@acme.test', 'correct horse battery')
const session = await withOwner(server.databaseUrl, (client) => mintToken(client, acme.members['ada@acme.test'].id, { kind: 'session' }))
const get = (path: string, headers: Record<string, string> = {}) => fetch(server.url + path, { headers, redirect: 'manual' })
const csrfOf = (text: string) => /name="csrf" value="([^"]+)"/.exec(text)?.[1] ?? ''

t.test('pages carry the security headers', async (t) => {
  for (const path of ['/sign-in', '/security', '/ui/style.css']) {
    const response = await get(path, path === '/sign-in' ? {} : { cookie: `crm_session=${session}` })
    t.equal(response.status, 200, path)
    t.match(response.headers.get('content-security-policy'), /default-src 'none'.*script-src 'self'.*frame-ancestors 'none'/)
    t.equal(response.headers.get('x-frame-options'), 'DENY')
    t.equal(response.headers.get('x-content-type-options'), 'nosniff')
    t.equal(response.headers.get('referrer-policy'), 'same-origin')
  }
  t.equal((await get('/security', { cookie: `crm_session=${session}` })).headers.get('cache-control'), 'no-store')
})

t.test('cookies are Secure behind an https proxy, HttpOnly and SameSite=Lax always', async (t) => {
  const plain = await get('/sign-in')
  t.match(plain.headers.get('set-cookie'), /^crm_pre_session=[^;]+; Path=\/; HttpOnly; SameSite=Lax; Max-Age=3600$/)
  const proxied = await get('/sign-in', { 'x-forwarded-proto': 'https' })
  const cookie = proxied.headers.get('set-cookie') ?? ''
  t.match(cookie, /; Secure$/)
  const csrf = csrfOf(await proxied.text())
  const signedIn = await fetch(server.url + '/sign-in', {
    method: 'POST',
    redirect: 'manual',
    headers: { 'x-forwarded-proto': 'https', 'content-type': 'application/x-www-form-urlencoded', cookie: cookie.split(';')[0] },
    body: new URLSearchParams({ csrf, email: 'ada@acme.test', password: 'correct horse battery' }).toString(),
  })
  t.equal(signedIn.status, 303)
  t.equal(signedIn.headers.get('location'), '/')
  const sessionCookie = signedIn.headers.getSetCookie().find((line) => line.startsWith('__Host-crm_session='))
  t.match(sessionCookie, /^__Host-crm_session=crm_[A-Za-z0-9_-]+; Path=\/; HttpOnly; SameSite=Lax; Max-Age=\d+; Secure$/)
})

t.test('over https every cookie carries its prefix, and only the prefixed name is read', async (t) => {
  const proxied = { 'x-forwarded-proto': 'https' }
  const signInPage = await get('/sign-in', proxied)
  const preSession = signInPage.headers.get('set-cookie') ?? ''
  t.match(preSession, /^__Host-crm_pre_session=[^;]+; Path=\/; HttpOnly; SameSite=Lax; Max-Age=3600; Secure$/, 'the CSRF pre-session')
  t.notMatch(preSession, /Domain=/i)
  // The session as the browser keeps it over https: read under its prefixed name.
  t.equal((await get('/security', { ...proxied, cookie: `__Host-crm_session=${session}` })).status, 200, 'signed in')
  // A plain crm_session planted from http or a sibling domain is not the session over https.
  const planted = await get('/security', { ...proxied, cookie: `crm_session=${session}` })
  t.equal(planted.status, 303, 'a plain-named session cookie is ignored over https')
  t.match(planted.headers.get('location'), /^\/sign-in/)
  // Over plain http (make run) browsers refuse the prefixes: the names stay plain.
  t.equal((await get('/security', { cookie: `crm_session=${session}` })).status, 200, 'plain names over http')
  // A sign-out over https clears the prefixed name (a session of its own: the others go on using theirs).
  const own = await withOwner(server.databaseUrl, (client) => mintToken(client, acme.members['ada@acme.test'].id, { kind: 'session' }))
  const page = await get('/security', { ...proxied, cookie: `__Host-crm_session=${own}` })
  const csrf = csrfOf(await page.text())
  const signOut = await fetch(server.url + '/sign-out', {
    method: 'POST',
    redirect: 'manual',
    headers: { ...proxied, 'content-type': 'application/x-www-form-urlencoded', cookie: `__Host-crm_session=${own}` },
    body: `csrf=${csrf}`,
  })
  t.ok(
    signOut.headers.getSetCookie().some((line) => /^__Host-crm_session=; Path=\/; HttpOnly; SameSite=Lax; Max-Age=0; Secure$/.test(line)),
    'sign-out clears the prefixed session cookie',
  )
})

t.test('a CSRF token from another session is refused', async (t) => {
  const other = await withOwner(server.databaseUrl, (client) => mintToken(client, acme.members['ada@acme.test'].id, { kind: 'session' }))
  const foreign = csrfOf(await (await get('/security', { cookie: `crm_session=${other}` })).text())
  const response = await fetch(server.url + '/security/tokens/revoke-all', {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded', cookie: `crm_session=${session}` },
    body: `csrf=${foreign}`,
  })
  t.equal(response.status, 403)
  t.equal((await get('/security', { cookie: `crm_session=${session}` })).status, 200, 'nothing was revoked')
})

t.test('values are escaped', async (t) => {
  const name = '<img src=x onerror=alert(1)>'
  await withOwner(server.databaseUrl, (client) => client.query("update crm.tokens set name = $1 where kind = 'session'", [name]))
  const text = await (await get('/security', { cookie: `crm_session=${session}` })).text()
  t.notMatch(text, /<img src=x/)
  t.match(text, /&lt;img src=x onerror=alert\(1\)&gt;/)
})

t.test('signed-out visitors are sent to sign-in; /api stays JSON', async (t) => {
  const page = await get('/webhooks')
  t.equal(page.status, 303)
  t.equal(page.headers.get('location'), '/sign-in?next=%2Fwebhooks')
  const api = await get('/api/nothing-here')
  t.equal(api.status, 404)
  t.equal(api.headers.get('content-type'), 'application/problem+json')
  const expired = await get('/security', { cookie: 'crm_session=crm_' + 'A'.repeat(43) })
  t.equal(expired.status, 303)
  t.equal(expired.headers.get('location'), '/sign-in?notice=session-ended')
  t.match(expired.headers.get('set-cookie'), /^crm_session=; Path=\/; HttpOnly; SameSite=Lax; Max-Age=0$/)
})

t.test('a browser gets an HTML 404 page for a page or a record it may not see; /api stays JSON', async (t) => {
  const browser = { accept: 'text/html,application/xhtml+xml,*/*;q=0.8' }
  for (const path of ['/no-such-page', '/contacts/nope/more/segments']) {
    const missing = await get(path, { ...browser, cookie: `crm_session=${session}` })
    t.equal(missing.status, 404, path)
    t.match(missing.headers.get('content-type'), /^text\/html/, `${path} answers HTML`)
    t.match(await missing.text(), /<h1>Not found<\/h1>/)
  }
  const unseen = await get('/contacts/01935f3c-9e00-7b22-8e3f-4d5c6b7a8f9e', { ...browser, cookie: `crm_session=${session}` })
  t.equal(unseen.status, 404, 'a record that does not exist or is not visible')
  t.match(unseen.headers.get('content-type'), /^text\/html/)
  const api = await get('/api/no-such-route', browser)
  t.equal(api.status, 404)
  t.equal(api.headers.get('content-type'), 'application/problem+json', '/api/ keeps problem JSON even for a browser')
  const client = await get('/no-such-page', { accept: 'application/json' })
  t.equal(client.headers.get('content-type'), 'application/problem+json', 'a client that does not ask for HTML gets problem JSON')
})

t.test('a list filters with the API operators, sorts and pages by cursor', async (t) => {
  const token = acme.members['ada@acme.test'].token
  const inputs = Array.from({ length: 55 }, (_, i) => ({ first_name: `Pager${String(i).padStart(2, '0')}`, email: `pager${i}@list.test` }))
  const created = await fetch(`${server.url}/api/contacts/batch/create`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ inputs }),
  })
  t.equal(created.status, 200)
  const page = async (query: string) => (await get(`/contacts?${query}`, { cookie: `crm_session=${session}` })).text()
  const names = (text: string) => [...text.matchAll(/<th scope="row"><a href="\/contacts\/[^"]+">([^<]+)<\/a>/g)].map((match) => match[1])
  const first = await page('field=email&op=starts_with&value=pager')
  t.match(first, /Showing contacts 1–50\./)
  const next = /href="([^"]+)">Next</.exec(first)?.[1]?.replaceAll('&amp;', '&')
  t.ok(next, 'a Next link')
  const second = (await get(next ?? '', { cookie: `crm_session=${session}` })).text()
  t.match(await second, /Showing contacts 51–55\./, 'the next page by cursor')
  t.match(await second, />Previous</)
  const sorted = names(await page('field=email&op=starts_with&value=pager&sort=-first_name'))
  t.same(sorted.slice(0, 2), ['Pager54', 'Pager53'], 'sorted by the column, descending')
  const filtered = names(await page('field=first_name&op=eq&value=Pager07'))
  t.same(filtered, ['Pager07'], 'filter[first_name][eq]')
  const refused = await get('/contacts?field=first_name&op=gt&value=x&sort=nonsense', { cookie: `crm_session=${session}` })
  t.equal(refused.status, 400, 'a sort the API refuses is its 400, shown on the page')
  t.match(await refused.text(), /role="alert"/)
})

t.test('Export posts the list’s filter to the API’s export and offers the CSV file', async (t) => {
  const cookie = `crm_session=${session}`
  const csrf = csrfOf(await (await get('/contacts', { cookie })).text())
  const response = await fetch(`${server.url}/contacts/export`, {
    method: 'POST',
    redirect: 'manual',
    headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ csrf, query: 'field=first_name&op=starts_with&value=Pager0&sort=-first_name' }).toString(),
  })
  t.equal(response.status, 200)
  t.match(response.headers.get('content-type'), /^text\/csv/)
  t.match(response.headers.get('content-disposition'), /^attachment; filename="contacts-\d{4}-\d{2}-\d{2}\.csv"$/)
  const lines = (await response.text()).trim().split('\r\n')
  t.equal(lines.length, 11, 'a header and the 10 contacts the filter keeps')
  t.match(lines[1], /Pager09/, 'in the list’s sort')
})

t.test('an Export from the page takes the workspace’s export slot like the API’s route: none left is 429 on the page', async (t) => {
  const cookie = `crm_session=${session}`
  const exportFromPage = async () =>
    fetch(`${server.url}/contacts/export`, {
      method: 'POST',
      redirect: 'manual',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ csrf: csrfOf(await (await get('/contacts', { cookie })).text()), query: '' }).toString(),
    })
  const slots = server.routeSlots
  if (!slots) throw new Error('the test server runs the API')
  const held = Array.from({ length: 4 }, () => slots.workspace.take('exports', acme.id))
  const refused = await exportFromPage()
  t.equal(refused.status, 429, 'the workspace’s four exports are running')
  t.match(await refused.text(), /already has 4 exports in progress/)
  for (const release of held) release()
  const allowed = await exportFromPage()
  t.equal(allowed.status, 200)
  await allowed.text()
  t.equal(slots.workspace.inUse('exports', acme.id), 0, 'the page gives its slot back when the file is sent')
  t.equal(slots.streams.inUse(), 0, 'and the process’s stream slot')
})
