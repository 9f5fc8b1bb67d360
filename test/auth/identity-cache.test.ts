// The cached identity (sql/definitions/20_tenancy_and_access.sql, src/auth/identity-cache.ts): a token's second
// request runs crm.resume_identity instead of crm.authenticate, and every way a token stops or a
// grant changes is effective on the very next request in every process. Process A is this test's
// server; process B is a `crm serve --no-worker` child against the same database, whose cache is
// warmed before A (or a DBA in SQL) changes something.
import { randomBytes } from 'node:crypto'
import pg from 'pg'
import t, { type Test } from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { createTenant, type Member, withOwner } from '../helpers/fixtures.ts'
import { startCrm } from '../helpers/processes.ts'
import { startTestServer } from '../helpers/server.ts'

const a = await startTestServer(t, { countQueries: true })
const b = await startCrm(t, 'api', { databaseUrl: a.databaseUrl })
const people = ['revoked', 'suspended', 'no-api', 'member-suspended', 'removed', 'expired', 'promoted', 'regranted', 'sql']
const tenant = await createTenant(a.databaseUrl, {
  slug: 'cache',
  members: { 'admin@cache.test': 'admin', ...Object.fromEntries(people.map((name) => [`${name}@cache.test`, 'member'])) },
})
const admin = tenant.members['admin@cache.test']
const person = (name: string): Member => tenant.members[`${name}@cache.test`]

async function call(base: string, method: string, path: string, token: string, body?: unknown) {
  const response = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await response.text()
  return { status: response.status, body: text ? JSON.parse(text) : null, headers: response.headers }
}

/** Two requests through process B: the first fills its cache, the second is served from it. */
async function warm(t: Test, token: string, path = '/api/contacts') {
  for (let i = 0; i < 2; i++)
    t.equal((await call(b.url, 'GET', path, token)).status, 200, `B serves ${path} (${i === 0 ? 'fills' : 'cached'})`)
}

t.test("a token's second request resumes its cached identity (one statement, no crm.authenticate)", async (t) => {
  const token = admin.token
  a.queries.length = 0
  t.equal((await a.request('GET', '/api/contacts', { token })).status, 200)
  t.equal((await a.request('GET', '/api/contacts', { token })).status, 200)
  t.equal((await a.request('POST', '/api/contacts', { token, body: { email: 'c1@cache.test' } })).status, 201)
  const auth = a.queries.filter((text) => /crm\.(authenticate|resume_identity)\(/.test(text))
  t.equal(auth.length, 3, 'one authentication per request')
  t.match(auth[0], /crm\.authenticate\(/, 'the first request authenticates in full')
  t.match(auth[1], /crm\.resume_identity\(/, 'the second resumes (a single-statement read)')
  t.match(auth[2], /crm\.resume_identity\(/, 'and so does a write in its transaction')
})

t.test('process A revokes the token; process B refuses its very next request', async (t) => {
  const { token } = person('revoked')
  await warm(t, token)
  t.equal((await call(a.url, 'DELETE', '/api/tokens', token)).status, 204, 'revoked through A')
  const next = await call(b.url, 'GET', '/api/contacts', token)
  t.equal(next.status, 401)
  t.equal(next.body.code, 'token_revoked')
})

t.test('every other way a token stops is effective on the next request through B', async (t) => {
  const cases: { name: string; change: (member: Member) => Promise<unknown>; status: number; code: string }[] = [
    {
      name: 'suspended',
      change: (m) => withOwner(a.databaseUrl, (db) => db.query('update crm.users set suspended_at = now() where id = $1', [m.id])),
      status: 401,
      code: 'user_suspended',
    },
    {
      name: 'no-api',
      change: (m) => withOwner(a.databaseUrl, (db) => db.query('update crm.users set api_access = false where id = $1', [m.id])),
      status: 401,
      code: 'api_access_disabled',
    },
    {
      name: 'member-suspended',
      change: (m) => call(a.url, 'POST', `/api/members/${m.id}/suspend`, admin.token),
      status: 401,
      code: 'user_suspended',
    },
    {
      name: 'removed',
      change: (m) => call(a.url, 'DELETE', `/api/members/${m.id}`, admin.token),
      status: 404,
      code: 'workspace_not_found',
    },
    {
      name: 'expired',
      change: (m) =>
        withOwner(a.databaseUrl, (db) =>
          db.query("update crm.tokens set expires_at = now() - interval '1 second' where token_hash = $1", [hashToken(m.token)]),
        ),
      status: 401,
      code: 'token_expired',
    },
  ]
  for (const { name, change, status, code } of cases) {
    const member = person(name)
    await warm(t, member.token)
    const changed = (await change(member)) as { status?: number } | undefined
    if (changed && 'status' in changed) t.ok(changed.status && changed.status < 300, `${name}: changed through A`)
    const next = await call(b.url, 'GET', '/api/contacts', member.token)
    t.equal(next.status, status, `${name}: refused on the next request`)
    t.equal(next.body.code, code, `${name}: ${code}`)
  }
})

t.test("a role change through A gives B's next request the new role", async (t) => {
  const member = person('promoted')
  await warm(t, member.token)
  t.equal((await call(b.url, 'GET', '/api/webhook-subscriptions', member.token)).status, 403, 'a member is not an admin')
  t.equal((await call(b.url, 'GET', '/api/webhook-subscriptions', member.token)).status, 403, 'still not, from the cache')
  t.equal((await call(a.url, 'PATCH', `/api/members/${member.id}`, admin.token, { role: 'admin' })).status, 200, 'promoted through A')
  t.equal((await call(b.url, 'GET', '/api/webhook-subscriptions', member.token)).status, 200, 'an admin on the next request')
  t.equal((await call(a.url, 'PATCH', `/api/members/${member.id}`, admin.token, { role: 'member' })).status, 200, 'and back')
  t.equal((await call(b.url, 'GET', '/api/webhook-subscriptions', member.token)).status, 403, 'a member again on the next request')
})

t.test("a grant taken from the role through A applies to B's next request", async (t) => {
  const member = person('regranted')
  const created = await call(a.url, 'POST', '/api/contacts', admin.token, { email: 'seen@cache.test' })
  await warm(t, member.token, `/api/contacts/${created.body.data.id}`)
  const role = await withOwner(a.databaseUrl, async (db) => {
    await db.query(
      `insert into crm.roles (workspace_id, name) values ($1, 'no_contacts');
       insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
       select $1, id, 'deals', 'view', 'all' from crm.roles where workspace_id = $1 and name = 'no_contacts'`.replace(
        /\$1/g,
        `'${tenant.id}'`,
      ),
    )
    return 'no_contacts'
  })
  t.equal((await call(a.url, 'PATCH', `/api/members/${member.id}`, admin.token, { role })).status, 200, 'moved to a role without contacts')
  t.equal((await call(b.url, 'GET', `/api/contacts/${created.body.data.id}`, member.token)).status, 404, 'the contact is out of sight')
})

t.test('SQL: every change to what a membership grants bumps its access_version, in the same transaction', async (t) => {
  const member = person('sql')
  await withOwner(a.databaseUrl, async (db) => {
    const version = async () =>
      Number(
        (await db.query('select access_version from crm.memberships where workspace_id = $1 and user_id = $2', [tenant.id, member.id]))
          .rows[0].access_version,
      )
    const roleOf = `(select role_id from crm.memberships where workspace_id = '${tenant.id}' and user_id = '${member.id}')`
    const steps: [string, string, boolean][] = [
      ['an unrelated membership column', `update crm.memberships set joined_at = joined_at where user_id = '${member.id}'`, false],
      [
        'a grant added to the role',
        `insert into crm.role_grants (workspace_id, role_id, resource, action, scope) values ('${tenant.id}', ${roleOf}, 'deals', 'export', 'own') on conflict do nothing`,
        true,
      ],
      [
        'a grant of the role changed',
        `update crm.role_grants set scope = 'team' where role_id = ${roleOf} and resource = 'deals' and action = 'export'`,
        true,
      ],
      [
        'a grant taken from the role',
        `delete from crm.role_grants where role_id = ${roleOf} and resource = 'deals' and action = 'export'`,
        true,
      ],
      ['the role renamed', `update crm.roles set name = name where id = ${roleOf}`, false],
      ['the membership suspended', `update crm.memberships set suspended_at = now() where user_id = '${member.id}'`, true],
      ['the suspension lifted', `update crm.memberships set suspended_at = null where user_id = '${member.id}'`, true],
    ]
    // The member role is built in (its grants are protected): give the member a role of its own.
    await db.query(
      `insert into crm.roles (workspace_id, name) values ($1, 'sql_role');
       update crm.memberships set role_id = (select id from crm.roles where workspace_id = $1 and name = 'sql_role')
        where workspace_id = $1 and user_id = $2`
        .replace(/\$1/g, `'${tenant.id}'`)
        .replace(/\$2/g, `'${member.id}'`),
    )
    for (const [what, statement, bumps] of steps) {
      const before = await version()
      await db.query(statement)
      const after = await version()
      t.ok(bumps ? after > before : after === before, `${what}: ${bumps ? 'moved on' : 'unchanged'}`)
    }
    const before = await version()
    await db.query(`update crm.roles set is_admin = true where id = ${roleOf}`)
    t.ok((await version()) > before, "the role's admin flag: moved on")
    const current = await version()
    await db.query(`update crm.memberships set access_version = ${current - 1} where user_id = '${member.id}'`)
    t.ok((await version()) > current, 'set by hand to an older value: it moves on instead')
  })
})

t.test('SQL: crm.resume_identity proves the token and the version, or sets nothing', async (t) => {
  const member = person('sql')
  const client = new pg.Client({ connectionString: a.databaseUrl })
  await client.connect()
  t.teardown(() => client.end())
  const { rows } = await client.query('select access_version::text as v from crm.memberships where workspace_id = $1 and user_id = $2', [
    tenant.id,
    member.id,
  ])
  const version = rows[0].v
  const resume = async (hash: Buffer, accessVersion: string, follows = false) => {
    await client.query('begin')
    try {
      await client.query('set local role crm_api')
      const answer = await client.query('select failure from crm.resume_identity($1, $2, $3, $4, $5)', [
        hash,
        tenant.id,
        accessVersion,
        'api',
        follows,
      ])
      const context = await client.query('select crm.current_user_id() as user_id, crm.current_workspace_id() as workspace_id')
      return { failure: answer.rows[0].failure, ...context.rows[0] }
    } finally {
      await client.query('rollback')
    }
  }
  t.same(
    await resume(hashToken(member.token), version),
    { failure: null, user_id: member.id, workspace_id: tenant.id },
    'current: the proven context',
  )
  t.same(
    await resume(hashToken(member.token), String(Number(version) - 1)),
    { failure: 'stale', user_id: null, workspace_id: null },
    'another version: stale, nothing set',
  )
  t.same(
    await resume(randomBytes(32), version),
    { failure: 'stale', user_id: null, workspace_id: null },
    'without the token: nobody can be resumed',
  )
  await client.query('update crm.users set last_workspace_id = null where id = $1', [member.id])
  t.same(
    await resume(hashToken(member.token), version, true),
    { failure: 'stale', user_id: null, workspace_id: null },
    'the last used workspace moved: stale',
  )
  await client.query('begin')
  await client.query('set local role crm_api')
  await t.rejects(
    client.query('update crm.memberships set access_version = 1 where user_id = $1', [member.id]),
    { code: '42501' },
    'crm_api cannot write a version',
  )
  await client.query('rollback')
})
