// POST /api/signup and the invitation round trip: invite, list, withdraw, accept as a new or an
// existing user, seats, and the mail that goes out when SMTP_URL is set.
import t from 'tap'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startSmtpSink } from './smtp-sink.ts'

const PASSWORD = 'correct horse battery'
const sink = await startSmtpSink()
t.teardown(() => sink.close())
const server = await startTestServer(t, { env: { SMTP_URL: sink.url } })
const url = server.databaseUrl

const signUp = (body: Record<string, unknown>) => server.request('POST', '/api/signup', { body })

t.test('sign-up makes a user, a workspace they administer with a 14-day trial, and a token', async (t) => {
  const response = await signUp({ email: 'Ada@Example.com', password: PASSWORD, name: 'Ada', workspace_name: 'Acme' })
  t.equal(response.status, 201, response.text)
  t.match(response.body, { token: /^crm_/, token_type: 'Bearer', token_id: /^[0-9a-f-]{36}$/, expires_at: /Z$/ })
  t.same(Object.keys(response.body).sort(), ['expires_at', 'token', 'token_id', 'token_type'], 'exactly the token body')
  const me = await server.request('GET', '/api/me', { token: response.body.token })
  t.equal(me.status, 200)
  t.match(me.body.data, {
    user: { email: 'ada@example.com', name: 'Ada' },
    workspace: { slug: 'acme', name: 'Acme', plan: 'free' },
    role: { name: 'admin', is_admin: true },
  })
  const trialDays = (Date.parse(me.body.data.workspace.trial_ends_at) - Date.now()) / 86_400_000
  t.ok(trialDays > 13.99 && trialDays <= 14, `trial ends in 14 days (${trialDays})`)
  const signIn = await server.request('POST', '/api/token', {
    body: { email: 'ada@example.com', password: PASSWORD, device_name: 'laptop' },
  })
  t.equal(signIn.status, 200, 'the password works for sign-in')

  const second = await signUp({ email: 'bo@example.com', password: PASSWORD, name: 'Bo', workspace_name: 'ACME' })
  const third = await signUp({ email: 'cy@example.com', password: PASSWORD, name: 'Cy', workspace_name: 'Acmé!!' })
  const slugOf = async (token: string) => (await server.request('GET', '/api/me', { token })).body.data.workspace.slug
  t.equal(await slugOf(second.body.token), 'acme-2', 'slugs are made unique')
  t.equal(await slugOf(third.body.token), 'acme-3')
  const odd = await signUp({ email: 'dee@example.com', password: PASSWORD, name: 'Dee', workspace_name: '  Müller & Söhne GmbH  ' })
  t.equal(await slugOf(odd.body.token), 'muller-sohne-gmbh')
  const symbols = await signUp({ email: 'eve@example.com', password: PASSWORD, name: 'Eve', workspace_name: '東京' })
  t.equal(await slugOf(symbols.body.token), 'workspace', 'a name with no ASCII letters gets a neutral slug')
})

t.test('sign-up refuses bad input with problems', async (t) => {
  const short = await signUp({ email: 'x@example.com', password: 'short', name: 'X', workspace_name: 'X' })
  t.equal(short.status, 422)
  t.match(short.body, { code: 'validation_failed', errors: [{ pointer: '/password' }] })
  const sameAsEmail = await signUp({ email: 'longname@example.com', password: 'LongName@example.com', name: 'X', workspace_name: 'X' })
  t.equal(sameAsEmail.status, 422)
  t.match(sameAsEmail.body.errors, [{ pointer: '/password', message: /email/ }])
  const taken = await signUp({ email: 'ADA@example.com', password: PASSWORD, name: 'Ada again', workspace_name: 'Other' })
  t.equal(taken.status, 409)
  t.match(taken.body, { code: 'duplicate', errors: [{ pointer: '/email' }] })
  const badEmail = await signUp({ email: 'not-an-email', password: PASSWORD, name: 'X', workspace_name: 'X' })
  t.equal(badEmail.status, 422)
  t.match(badEmail.body.errors, [{ pointer: '/email' }])
  const missing = await signUp({ email: 'y@example.com', password: PASSWORD })
  t.match(missing.body.errors, [
    { pointer: '/name', code: 'required' },
    { pointer: '/workspace_name', code: 'required' },
  ])
  const unknown = await signUp({ email: 'y@example.com', password: PASSWORD, name: 'Y', workspace_name: 'Y', plan: 'pro' })
  t.match(unknown.body.errors, [{ pointer: '/plan', code: 'unknown_field' }])
  const blank = await signUp({ email: 'y@example.com', password: PASSWORD, name: '   ', workspace_name: 'Y' })
  t.match(blank.body.errors, [{ pointer: '/name' }])
  t.equal(
    (await server.request('POST', '/api/signup', { raw: '{', headers: { 'content-type': 'application/json' } })).body.code,
    'invalid_json',
  )
  await withOwner(url, async (client) => {
    const { rows } = await client.query(
      `select count(*)::int as n from crm.users where email in ('x@example.com', 'y@example.com', 'longname@example.com')`,
    )
    t.equal(rows[0].n, 0, 'nothing was created')
  })
})

t.test('invitations: create, list, withdraw; admins only', async (t) => {
  const tenant = await createTenant(url, {
    slug: 'inv',
    members: { 'admin@inv.test': 'admin', 'mo@inv.test': 'member' },
    teams: { east: [], west: [] },
  })
  const admin = tenant.members['admin@inv.test'].token
  const created = await server.request('POST', '/api/invitations', {
    token: admin,
    body: { email: 'New@Example.com', role: 'read_only', teams: ['east'] },
  })
  t.equal(created.status, 201, created.text)
  t.match(created.body.data, { id: /^[0-9a-f-]{36}$/, email: 'new@example.com', role: 'read_only', teams: ['east'], status: 'pending' })
  t.match(
    created.body.data.accept_url,
    new RegExp(`^${server.url.replaceAll('.', '\\.')}/invitations/accept\\?token=inv_[A-Za-z0-9_-]{43}$`),
    'without PUBLIC_BASE_URL the base URL is the listening address',
  )
  const validDays = (Date.parse(created.body.data.expires_at) - Date.now()) / 86_400_000
  t.ok(validDays > 6.99 && validDays <= 7, 'valid 7 days')
  const secret = new URL(created.body.data.accept_url).searchParams.get('token')!
  await withOwner(url, async (client) => {
    const { rows } = await client.query('select token_hash from crm.invitations where id = $1', [created.body.data.id])
    t.equal(rows[0].token_hash.length, 32, 'only a SHA-256 is stored')
    t.not(rows[0].token_hash.toString('utf8'), secret)
  })

  const mail = sink.messages.find((message) => message.to.some((to) => to.includes('new@example.com'))) ?? (await sink.next())
  t.match(mail.to, [/new@example\.com/])
  t.ok(mail.data.replace(/=\r\n/g, '').includes(secret), 'the mail carries the accept link')

  const list = await server.request('GET', '/api/invitations', { token: admin })
  t.equal(list.status, 200)
  t.same(
    list.body.data.map((row: any) => row.email),
    ['new@example.com'],
  )
  t.notOk('accept_url' in list.body.data[0], 'the secret is never shown again')
  t.equal(list.body.next_cursor, null)

  const again = await server.request('POST', '/api/invitations', { token: admin, body: { email: 'new@example.com', role: 'member' } })
  t.equal(again.status, 201)
  const afterReinvite = await server.request('GET', '/api/invitations', { token: admin })
  t.same(
    afterReinvite.body.data.map((row: any) => [row.email, row.role]),
    [['new@example.com', 'member']],
    'inviting again replaces the pending invitation',
  )
  const oldLink = await server.request('POST', '/api/invitations/accept', { body: { token: secret, password: PASSWORD, name: 'New' } })
  t.equal(oldLink.status, 422, 'the replaced link no longer works')
  t.match(oldLink.body.errors, [{ pointer: '/token' }])

  const member = tenant.members['mo@inv.test'].token
  t.equal((await server.request('GET', '/api/invitations', { token: member })).status, 403)
  const forbidden = await server.request('POST', '/api/invitations', { token: member, body: { email: 'z@example.com', role: 'member' } })
  t.equal(forbidden.status, 403)
  t.equal(forbidden.body.code, 'forbidden')
  t.equal((await server.request('DELETE', `/api/invitations/${again.body.data.id}`, { token: member })).status, 403)

  const problems = [
    [{ email: 'z@example.com', role: 'boss' }, '/role'],
    [{ email: 'z@example.com', role: 'member', teams: ['east', 'north'] }, '/teams/1'],
    [{ email: 'mo@inv.test', role: 'member' }, '/email'],
    [{ email: 'z@example.com' }, '/role'],
    [{ email: 'z@example.com', role: 'member', extra: 1 }, '/extra'],
  ] as const
  for (const [body, pointer] of problems) {
    const response = await server.request('POST', '/api/invitations', { token: admin, body })
    t.ok(response.status === 422 || response.status === 409, `${JSON.stringify(body)}: ${response.status}`)
    t.equal(response.body.errors?.[0]?.pointer, pointer)
  }
  t.equal(
    (await server.request('POST', '/api/invitations', { token: admin, body: { email: 'mo@inv.test', role: 'member' } })).status,
    409,
    'a member cannot be invited again',
  )

  t.equal((await server.request('DELETE', `/api/invitations/${again.body.data.id}`, { token: admin })).status, 204)
  t.equal((await server.request('DELETE', `/api/invitations/${again.body.data.id}`, { token: admin })).status, 404)
  t.equal((await server.request('DELETE', '/api/invitations/not-a-uuid', { token: admin })).status, 404)
  t.same((await server.request('GET', '/api/invitations', { token: admin })).body.data, [])
})

const invite = async (admin: string, body: Record<string, unknown>) => {
  const response = await server.request('POST', '/api/invitations', { token: admin, body })
  if (response.status !== 201) throw new Error(response.text)
  return { id: response.body.data.id as string, secret: new URL(response.body.data.accept_url).searchParams.get('token')! }
}

t.test('accepting as a new user: membership with role and teams, a token, single use', async (t) => {
  const tenant = await createTenant(url, { slug: 'acc', members: { 'admin@acc.test': 'admin' }, teams: { east: [] } })
  const admin = tenant.members['admin@acc.test'].token
  const { secret } = await invite(admin, { email: 'grace@example.com', role: 'read_only', teams: ['east'] })

  const missing = await server.request('POST', '/api/invitations/accept', { body: { token: secret } })
  t.equal(missing.status, 422)
  t.match(missing.body.errors, [
    { pointer: '/password', code: 'required' },
    { pointer: '/name', code: 'required' },
  ])
  const weak = await server.request('POST', '/api/invitations/accept', {
    body: { token: secret, password: 'grace@example.com', name: 'Grace' },
  })
  t.equal(weak.status, 422)
  t.match(weak.body.errors, [{ pointer: '/password' }])
  const wrong = await server.request('POST', '/api/invitations/accept', { body: { token: 'inv_nope', password: PASSWORD, name: 'Grace' } })
  t.equal(wrong.status, 422)
  t.match(wrong.body.errors, [{ pointer: '/token' }])

  const accepted = await server.request('POST', '/api/invitations/accept', { body: { token: secret, password: PASSWORD, name: 'Grace' } })
  t.equal(accepted.status, 200, accepted.text)
  t.match(accepted.body, { token: /^crm_/, token_type: 'Bearer' })
  const me = await server.request('GET', '/api/me', { token: accepted.body.token })
  t.match(me.body.data, { user: { email: 'grace@example.com', name: 'Grace' }, workspace: { slug: 'acc' }, role: { name: 'read_only' } })
  const members = await server.request('GET', '/api/members', { token: admin })
  t.match(
    members.body.data.find((row: any) => row.email === 'grace@example.com'),
    { role: 'read_only', teams: ['east'], suspended_at: null },
  )

  const reused = await server.request('POST', '/api/invitations/accept', { body: { token: secret, password: PASSWORD, name: 'Grace' } })
  t.equal(reused.status, 422, 'single use')
  t.match(reused.body.errors, [{ pointer: '/token', message: /already used/ }])
  t.same((await server.request('GET', '/api/invitations', { token: admin })).body.data, [], 'an accepted invitation leaves the list')
})

t.test('accepting as an existing user with their bearer token; the email must match', async (t) => {
  const home = await createTenant(url, { slug: 'home', members: { 'hal@example.com': 'member', 'ida@example.com': 'member' } })
  const target = await createTenant(url, { slug: 'target', members: { 'admin@target.test': 'admin' } })
  const admin = target.members['admin@target.test'].token
  const { secret } = await invite(admin, { email: 'hal@example.com', role: 'member' })

  const newUserPath = await server.request('POST', '/api/invitations/accept', { body: { token: secret, password: PASSWORD, name: 'Hal' } })
  t.equal(newUserPath.status, 409, 'an existing account must accept with its token')
  t.equal(newUserPath.body.code, 'duplicate')
  const otherUser = await server.request('POST', '/api/invitations/accept', {
    token: home.members['ida@example.com'].token,
    body: { token: secret },
  })
  t.equal(otherUser.status, 403)
  const badBearer = await server.request('POST', '/api/invitations/accept', { token: 'crm_' + 'x'.repeat(43), body: { token: secret } })
  t.equal(badBearer.status, 401)
  t.equal(badBearer.body.code, 'token_invalid')

  const hal = home.members['hal@example.com'].token
  const accepted = await server.request('POST', '/api/invitations/accept', { token: hal, body: { token: secret } })
  t.equal(accepted.status, 200, accepted.text)
  const me = await server.request('GET', '/api/me', { token: accepted.body.token })
  t.equal(me.body.data.workspace.slug, 'home', 'the last used workspace stays (slug-less calls keep going where they went)')
  t.equal(
    (await server.request('GET', '/api/me', { token: accepted.body.token, headers: { 'x-tenant-slug': 'target' } })).status,
    200,
    'the joined workspace is one X-Tenant-Slug away',
  )
  const workspaces = await server.request('GET', '/api/workspaces', { token: hal })
  t.same(workspaces.body.data.map((row: any) => row.slug).sort(), ['home', 'target'])

  const { secret: second } = await invite(admin, { email: 'jo@example.com', role: 'member' })
  const jo = await withOwner(url, async (client) => {
    const { rows } = await client.query(`insert into crm.users (email, name) values ('jo@example.com', 'Jo') returning id`)
    return mintToken(client, rows[0].id)
  })
  const noWorkspaceYet = await server.request('POST', '/api/invitations/accept', { token: jo, body: { token: second } })
  t.equal(noWorkspaceYet.status, 200, 'a user who belongs to no workspace yet can accept too')
})

t.test('seats are enforced on acceptance; expired invitations are refused', async (t) => {
  const tenant = await createTenant(url, { slug: 'full', seats: 2, members: { 'admin@full.test': 'admin', 'kim@full.test': 'member' } })
  const admin = tenant.members['admin@full.test'].token
  const { secret } = await invite(admin, { email: 'lee@example.com', role: 'member' })
  const full = await server.request('POST', '/api/invitations/accept', { body: { token: secret, password: PASSWORD, name: 'Lee' } })
  t.equal(full.status, 422)
  t.equal(full.body.code, 'seat_limit_reached')
  await withOwner(url, async (client) => {
    const { rows } = await client.query(`select count(*)::int as n from crm.users where email = 'lee@example.com'`)
    t.equal(rows[0].n, 0, 'the refused acceptance left no user behind')
  })
  const seats = await server.request('GET', '/api/members', { token: admin })
  t.same(seats.body.seats, { used: 2, limit: 2 })

  t.equal((await server.request('POST', `/api/members/${tenant.members['kim@full.test'].id}/suspend`, { token: admin })).status, 200)
  const now = await server.request('POST', '/api/invitations/accept', { body: { token: secret, password: PASSWORD, name: 'Lee' } })
  t.equal(now.status, 200, 'a suspension frees a seat')

  const { id, secret: late } = await invite(admin, { email: 'max@example.com', role: 'member' })
  await withOwner(url, (client) => client.query(`update crm.invitations set expires_at = now() - interval '1 second' where id = $1`, [id]))
  const listed = await server.request('GET', '/api/invitations', { token: admin })
  t.equal(listed.body.data[0].status, 'expired')
  const expired = await server.request('POST', '/api/invitations/accept', { body: { token: late, password: PASSWORD, name: 'Max' } })
  t.equal(expired.status, 422)
  t.match(expired.body.errors, [{ pointer: '/token', message: /expired/ }])
})

t.test('PUBLIC_BASE_URL sets the accept link; without SMTP_URL nothing is mailed', async (t) => {
  const plain = await startTestServer(t, { databaseUrl: url, env: { PUBLIC_BASE_URL: 'https://crm.example.com/' } })
  const tenant = await createTenant(url, { slug: 'nomail', members: { 'admin@nomail.test': 'admin' } })
  const before = sink.messages.length
  const created = await plain.request('POST', '/api/invitations', {
    token: tenant.members['admin@nomail.test'].token,
    body: { email: 'quiet@example.com', role: 'member' },
  })
  t.equal(created.status, 201)
  t.match(created.body.data.accept_url, /^https:\/\/crm\.example\.com\/invitations\/accept\?token=inv_/)
  await new Promise((resolve) => setTimeout(resolve, 300))
  t.equal(sink.messages.length, before)
})
