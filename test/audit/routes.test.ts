// The access audit log through the API and the CLI (docs/api.md section 11): every action of the
// section, driven through its real route or operator command, writes its entry with the right
// actor and target; GET /api/audit-log filters and pages them for admins only (403 for others) and
// shows what crm.act_as shows in SQL; the export streams the same entries; verify answers the
// chain; and no entry of the run holds a secret (tokens, their hashes, passwords, TOTP, webhook
// and OAuth client secrets, invitation tokens).
import { createHash } from 'node:crypto'
import t from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { crm } from '../helpers/cli.ts'
import { withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { startReceiver, WEBHOOK_TEST_ENV } from '../webhooks/receiver.ts'

const PASSWORD = 'correct horse battery'
const server = await startTestServer(t, { env: WEBHOOK_TEST_ENV })
const url = server.databaseUrl
const receiver = await startReceiver(t)
const secrets: string[] = [PASSWORD]

// The operator's commands first: the CLI blocks this process, and a keep-alive connection left idle
// across a long block is reset by the server as the next request reuses it.
const cli = (args: string[]) => {
  const result = crm(url, [...args, '--json'])
  if (result.status !== 0) throw new Error(`crm ${args.join(' ')}: ${result.stderr || result.stdout}`)
  return result.json
}
cli(['workspace', 'create', '--slug', 'audit', '--name', 'Audit'])
const ada = cli([
  'user',
  'create',
  '--email',
  'ada@audit.test',
  '--name',
  'Ada',
  '--password',
  PASSWORD,
  '--workspace',
  'audit',
  '--role',
  'admin',
])
const bob = cli([
  'user',
  'create',
  '--email',
  'bob@audit.test',
  '--name',
  'Bob',
  '--password',
  PASSWORD,
  '--workspace',
  'audit',
  '--role',
  'member',
])
const dan = cli([
  'user',
  'create',
  '--email',
  'dan@audit.test',
  '--name',
  'Dan',
  '--password',
  PASSWORD,
  '--workspace',
  'audit',
  '--role',
  'member',
])
cli(['workspace', 'set-plan', '--slug', 'audit', '--plan', 'pro'])
cli(['user', 'api-access', '--email', 'dan@audit.test', '--off'])
cli(['user', 'api-access', '--email', 'dan@audit.test', '--on'])
cli(['user', 'suspend', '--email', 'dan@audit.test'])
cli(['user', 'unsuspend', '--email', 'dan@audit.test'])
const totp = cli(['user', 'totp', 'enable', '--email', 'dan@audit.test'])
secrets.push(totp.secret, ...totp.recovery_codes)
const workspaceId: string = await withOwner(
  url,
  async (client) => (await client.query(`select id from crm.workspaces where slug = 'audit'`)).rows[0].id,
)

const request = async (method: string, path: string, token: string, body?: unknown) => {
  const response = await server.request(method, path, { token, body })
  if (response.status >= 400) throw new Error(`${method} ${path}: ${response.status} ${response.text}`)
  return response
}
const signIn = (email: string, password: string) =>
  server.request('POST', '/api/token', { body: { email, password, device_name: 'audit tests' } })

// Filled by the first subtest, which drives every action (tap ends a file whose top level idles).
let adaSignIn: Awaited<ReturnType<typeof signIn>>
let admin = ''
let member = ''
let created: Awaited<ReturnType<typeof request>>
let role: any
let team: any
let revoked: any
let app: any
let hook: any

t.test('the actions of section 11, through their routes', async (t) => {
  adaSignIn = await signIn('ada@audit.test', PASSWORD)
  t.equal(adaSignIn.status, 200)
  admin = adaSignIn.body.token
  secrets.push(admin)
  t.equal((await signIn('ada@audit.test', 'not the password')).status, 401)
  const bobSignIn = await signIn('bob@audit.test', PASSWORD)
  member = bobSignIn.body.token
  secrets.push(member)

  // Tokens.
  created = await request('POST', '/api/tokens', admin, { name: 'Reports', scopes: ['contacts:read'] })
  secrets.push(created.body.token)
  await request('DELETE', `/api/tokens/${created.body.token_id}`, admin)

  // Roles and grants.
  role = (await request('POST', '/api/roles', admin, { name: 'auditor', grants: ['contacts:view:all'] })).body.data
  await request('PATCH', `/api/roles/${role.id}`, admin, { grants: ['contacts:view:all', 'deals:view:all'] })
  await request('PATCH', `/api/roles/${role.id}`, admin, { name: 'auditors' })
  await request('DELETE', `/api/roles/${role.id}`, admin)

  // Teams and members.
  team = (await request('POST', '/api/teams', admin, { name: 'East' })).body.data
  await request('PATCH', `/api/members/${bob.id}`, admin, { teams: ['East'] })
  await request('PATCH', `/api/teams/${team.id}`, admin, { name: 'West' })
  await request('PATCH', `/api/members/${bob.id}`, admin, { teams: [] })
  await request('DELETE', `/api/teams/${team.id}`, admin)
  await request('PUT', `/api/members/${bob.id}`, admin, { role: 'read_only' })
  await request('PUT', `/api/members/${bob.id}`, admin, { role: 'member' })
  await request('POST', `/api/members/${dan.id}/suspend`, admin)
  await request('POST', `/api/members/${dan.id}/unsuspend`, admin)
  // Two-factor turned off (the UI's security page runs the same delete through crm.disable_totp).
  await withOwner(url, (client) => client.query('delete from crm.user_totp where user_id = $1', [dan.id]))
  await request('DELETE', `/api/members/${dan.id}`, admin)

  // Invitations.
  const invitation = (await request('POST', '/api/invitations', admin, { email: 'eve@audit.test', role: 'member' })).body.data
  const invitationSecret = new URL(invitation.accept_url).searchParams.get('token') ?? ''
  secrets.push(invitationSecret)
  const accepted = await server.request('POST', '/api/invitations/accept', {
    body: { token: invitationSecret, password: PASSWORD, name: 'Eve' },
  })
  t.equal(accepted.status, 200, accepted.text)
  if (accepted.body?.token) secrets.push(accepted.body.token)
  revoked = (await request('POST', '/api/invitations', admin, { email: 'fay@audit.test', role: 'member' })).body.data
  secrets.push(new URL(revoked.accept_url).searchParams.get('token') ?? '')
  await request('DELETE', `/api/invitations/${revoked.id}`, admin)

  // OAuth apps and grants (a grant is given in the consent page's transaction; made here as its function makes it).
  app = (await request('POST', '/api/oauth-apps', admin, { name: 'Mail merge', redirect_uris: ['https://mailmerge.example/cb'] })).body.data
  if (app.client_secret) secrets.push(app.client_secret)
  await request('PATCH', `/api/oauth-apps/${app.id}`, admin, { name: 'Mail merger' })
  await withOwner(url, (client) =>
    client.query(
      `insert into crm.oauth_grants (workspace_id, app_id, user_id, scopes, expires_at) values ($1, $2, $3, '{contacts:read}', now() + interval '1 day')`,
      [workspaceId, app.id, bob.id],
    ),
  )
  await request('DELETE', `/api/oauth-apps/${app.id}/connections`, admin)
  await request('DELETE', `/api/oauth-apps/${app.id}`, admin)

  // Webhook subscriptions.
  hook = (await request('POST', '/api/webhook-subscriptions', admin, { name: 'Sync', url: `${receiver.url}/hook?key=abc`, events: ['*'] }))
    .body.data
  secrets.push(hook.secret)
  await request('PATCH', `/api/webhook-subscriptions/${hook.id}`, admin, { name: 'Sync 2' })
  await request('POST', `/api/webhook-subscriptions/${hook.id}/pause`, admin)
  await request('POST', `/api/webhook-subscriptions/${hook.id}/resume`, admin)
  secrets.push((await request('POST', `/api/webhook-subscriptions/${hook.id}/rotate-secret`, admin, {})).body.data.secret)
  await request('DELETE', `/api/webhook-subscriptions/${hook.id}`, admin)
})

type Entry = {
  id: string
  seq: number
  action: string
  actor: Record<string, unknown>
  target: { type: string; id: string | null }
  details: any
}
async function everything(query = ''): Promise<Entry[]> {
  const entries: Entry[] = []
  let next = `/api/audit-log?limit=7${query}`
  for (;;) {
    const page = await request('GET', next, admin)
    entries.push(...page.body.data)
    if (!page.body.next_cursor) return entries
    next = `/api/audit-log?limit=7${query}&cursor=${page.body.next_cursor}`
  }
}
t.test('every action of section 11 wrote its entry, with its actor and target', async (t) => {
  const log = await everything()
  const find = (action: string, check: (entry: Entry) => boolean = () => true) =>
    log.find((entry) => entry.action === action && check(entry))
  const byAda = (entry: Entry) => entry.actor.user_id === ada.id
  const expectations: [string, (entry: Entry) => boolean][] = [
    ['member.added', (entry) => entry.target.id === bob.id],
    ['member.role_changed', (entry) => byAda(entry) && entry.target.id === bob.id && entry.details.previous_role_id !== undefined],
    ['member.suspended', (entry) => byAda(entry) && entry.target.id === dan.id],
    ['member.unsuspended', (entry) => byAda(entry) && entry.target.id === dan.id],
    ['member.removed', (entry) => byAda(entry) && entry.target.id === dan.id],
    ['role.created', (entry) => byAda(entry) && entry.target.id === role.id],
    ['role.grants_changed', (entry) => entry.target.id === role.id && entry.details.added.includes('deals:view:all')],
    ['role.changed', (entry) => entry.details.name === 'auditors' && entry.details.previous.name === 'auditor'],
    ['role.deleted', (entry) => entry.target.id === role.id],
    ['team.created', (entry) => entry.target.id === team.id],
    ['team.member_added', (entry) => entry.target.id === bob.id && entry.details.team_id === team.id],
    ['team.renamed', (entry) => entry.details.name === 'West'],
    ['team.member_removed', (entry) => entry.target.id === bob.id],
    ['team.deleted', (entry) => entry.target.id === team.id],
    ['invitation.sent', (entry) => entry.details.email === 'eve@audit.test'],
    ['invitation.accepted', (entry) => entry.details.email === 'eve@audit.test'],
    ['invitation.revoked', (entry) => entry.target.id === revoked.id],
    [
      'token.created',
      (entry) => byAda(entry) && entry.details.token_id === created.body.token_id && entry.details.scopes[0] === 'contacts:read',
    ],
    ['token.revoked', (entry) => entry.details.token_id === created.body.token_id],
    ['oauth_app.registered', (entry) => entry.target.id === app.id],
    ['oauth_app.changed', (entry) => entry.details.name === 'Mail merger'],
    ['oauth_grant.given', (entry) => entry.details.app_id === app.id],
    ['oauth_grant.revoked', (entry) => byAda(entry) && entry.details.app_id === app.id],
    ['oauth_app.deleted', (entry) => entry.target.id === app.id],
    ['webhook.created', (entry) => entry.target.id === hook.id && entry.details.host === '127.0.0.1'],
    ['webhook.changed', (entry) => entry.details.name === 'Sync 2'],
    ['webhook.paused', (entry) => entry.details.reason === 'manual'],
    ['webhook.resumed', (entry) => entry.target.id === hook.id],
    ['webhook.secret_rotated', (entry) => entry.target.id === hook.id],
    ['webhook.deleted', (entry) => entry.target.id === hook.id],
    ['two_factor.enabled', (entry) => entry.target.id === dan.id && entry.actor.via === 'system'],
    ['two_factor.disabled', (entry) => entry.target.id === dan.id],
    ['user.api_access_changed', (entry) => entry.target.id === dan.id && entry.details.api_access === false],
    ['user.suspended', (entry) => entry.target.id === dan.id],
    ['user.unsuspended', (entry) => entry.target.id === dan.id],
    ['workspace.plan_changed', (entry) => entry.details.plan === 'pro' && entry.details.previous.plan === 'free'],
    ['user.signed_in', (entry) => entry.target.id === ada.id && typeof entry.actor.ip === 'string'],
    [
      'user.sign_in_failed',
      (entry) => entry.target.id === ada.id && entry.details.reason === 'invalid_credentials' && typeof entry.actor.ip === 'string',
    ],
  ]
  for (const [action, check] of expectations) t.ok(find(action, check), action)
  const tokenCreated = find('token.created', byAda)
  t.equal(tokenCreated?.actor.token_id, adaSignIn.body.token_id, "the actor's token is the one that made the change")
  t.equal(tokenCreated?.actor.name, 'Ada')
  t.same(
    log.map((entry) => entry.seq),
    log.map((entry) => entry.seq).sort((a, b) => b - a),
    'newest first',
  )
  t.equal(new Set(log.map((entry) => entry.id)).size, log.length, 'pages neither repeat nor skip')
})

t.test('filters', async (t) => {
  const roleChanges = await everything(`&action=member.role_changed&target_id=${bob.id}`)
  t.equal(roleChanges.length, 2)
  t.ok(roleChanges.every((entry) => entry.action === 'member.role_changed' && entry.target.id === bob.id))
  const byAda = await everything(`&actor_id=${ada.id}&target_type=webhook`)
  t.equal(byAda.length, 6)
  const future = await everything('&since=2999-01-01T00:00:00Z')
  t.equal(future.length, 0)
  const past = await everything('&until=2999-01-01T00:00:00Z')
  t.equal(past.length, (await everything()).length)
  for (const bad of ['action=DROP', 'actor_id=nope', 'since=yesterday', 'cursor=abc', 'colour=red']) {
    const response = await server.request('GET', `/api/audit-log?${bad}`, { token: admin })
    t.equal(response.status, 400, bad)
    t.match(response.headers.get('content-type'), /problem\+json/)
  }
})

t.test('admins only: a member gets 403 from every audit route, and nothing in SQL', async (t) => {
  for (const [method, path] of [
    ['GET', '/api/audit-log'],
    ['GET', '/api/audit-log/verify'],
    ['POST', '/api/audit-log/export'],
  ]) {
    const response = await server.request(method, path, { token: member, body: method === 'POST' ? {} : undefined })
    t.equal(response.status, 403, `${method} ${path}`)
  }
  await withOwner(url, async (client) => {
    await client.query('begin')
    await client.query(`select crm.act_as('bob@audit.test', 'audit')`)
    t.equal((await client.query('select count(*)::int as n from crm.audit_log')).rows[0].n, 0, 'act_as a member: no entry')
    await client.query('rollback')
  })
})

t.test("crm.act_as shows an admin exactly the API's entries", async (t) => {
  const fresh = await everything()
  await withOwner(url, async (client) => {
    await client.query('begin')
    await client.query(`select crm.act_as('ada@audit.test', 'audit')`)
    const { rows } = await client.query('select id from crm.audit_log order by seq desc')
    await client.query('rollback')
    t.same(
      rows.map((row) => row.id),
      fresh.map((entry) => entry.id),
    )
  })
})

t.test('verify and export', async (t) => {
  const verdict = await request('GET', '/api/audit-log/verify', admin)
  const count = await withOwner(
    url,
    async (client) => (await client.query('select count(*)::int as n from crm.audit_log where workspace_id = $1', [workspaceId])).rows[0].n,
  )
  t.same(verdict.body, { intact: true, entries: count })

  const ndjson = await server.request('POST', '/api/audit-log/export', { token: admin, body: { format: 'ndjson' } })
  t.equal(ndjson.status, 200)
  t.match(ndjson.headers.get('content-type'), /application\/x-ndjson/)
  const lines = ndjson.text
    .trim()
    .split('\n')
    .map((line) => JSON.parse(line))
  t.equal(lines.length, count)
  t.same(
    lines.map((entry: Entry) => entry.seq),
    [...lines.map((entry: Entry) => entry.seq)].sort((a, b) => a - b),
    'oldest first',
  )
  // An auditor's own check: each hash is SHA-256 over the previous one and the canonical content.
  let previous = '0'.repeat(64)
  for (const entry of lines) {
    t.equal(entry.prev_hash, previous)
    previous = entry.hash
  }
  const csv = await server.request('POST', '/api/audit-log/export', {
    token: admin,
    body: { format: 'csv', filter: { action: 'webhook.created' } },
  })
  t.equal(csv.status, 200)
  const rows = csv.text.trim().split('\r\n')
  t.equal(
    rows[0],
    'id,seq,occurred_at,action,actor_user_id,actor_name,actor_via,actor_token_id,actor_app_id,actor_ip,target_type,target_id,details,prev_hash,hash',
  )
  t.equal(rows.length, 2)
  const bad = await server.request('POST', '/api/audit-log/export', { token: admin, body: { filter: { since: 'soon' } } })
  t.equal(bad.status, 422)
})

t.test('no entry of the run holds a secret, a password or a token hash', async (t) => {
  const texts: string[] = await withOwner(url, async (client) =>
    (await client.query('select row_to_json(l)::text as text from crm.audit_log l')).rows.map((row) => row.text),
  )
  t.ok(texts.length > 40)
  const forbidden = secrets.filter((secret) => secret.length >= 8)
  for (const secret of secrets.filter((value) => value.startsWith('crm_'))) {
    forbidden.push(hashToken(secret).toString('hex'), createHash('sha256').update(secret).digest('base64'))
  }
  t.ok(forbidden.length >= 12, `${forbidden.length} secrets looked for`)
  const found = forbidden.filter((secret) => texts.some((text) => text.includes(secret)))
  t.same(found, [], 'none found')
  t.notOk(
    texts.some((text) => text.includes('key=abc')),
    "a webhook URL's query string is not kept",
  )
})
