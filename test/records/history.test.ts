// A record's history (docs/api.md section 5b): GET /api/{type}/{id}/history and the view
// crm.record_history under the record's own row-level security, which must agree for every caller.
import { isDeepStrictEqual } from 'node:util'
import fc from 'fast-check'
import pg from 'pg'
import t from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { encodeCursor } from '../../src/paging.ts'
import { addMember, createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { importCsv } from '../imports/helpers.ts'
import { clientFor, createRole } from './helpers.ts'

const server = await startTestServer(t, { worker: true, env: { RATE_LIMIT_PER_MINUTE: '100000' } })
const url = server.databaseUrl
const acme = await createTenant(url, {
  slug: 'acme',
  members: { 'admin@acme.test': 'admin', 'ann@acme.test': 'member', 'bob@acme.test': 'member', 'reader@acme.test': 'read_only' },
})
await createRole(url, acme.id, 'seller', ['deals:view:own', 'deals:create:own', 'deals:update:own', 'contacts:view:own'])
await createRole(url, acme.id, 'outsider', [])
const other = await createTenant(url, { slug: 'other', members: { 'admin@other.test': 'admin' } })
await withOwner(url, async (client) => {
  acme.members['carol@acme.test'] = await addMember(client, acme.id, 'carol@acme.test', 'seller')
  acme.members['nobody@acme.test'] = await addMember(client, acme.id, 'nobody@acme.test', 'outsider')
})

const as = (email: string) =>
  clientFor(server, email.endsWith('@other.test') ? other : acme, (email.endsWith('@other.test') ? other : acme).members[email])
const admin = as('admin@acme.test')
const ann = as('ann@acme.test')
const userId = (email: string) => acme.members[email].id
const tokenIdOf = (token: string) =>
  withOwner(
    url,
    async (client) => (await client.query('select id from crm.tokens where token_hash = $1', [hashToken(token)])).rows[0].id as string,
  )

const history = async (email: string, path: string, query = '') => as(email).get(`/api/${path}/history${query}`)

t.test('each change names its fields with old and new values, custom fields by key, associations as ids, and its actor', async (t) => {
  const created = await ann.post('/api/deals', { name: 'Boiler', amount: '100.00', custom_fields: { tier: 'gold', seats: 3 } })
  t.equal(created.status, 201, created.text)
  const id = created.body.data.id
  const updated = await ann.patch(`/api/deals/${id}`, {
    name: 'Boiler room',
    amount: '250.00',
    custom_fields: { tier: 'silver', region: 'eu' },
  })
  t.equal(updated.status, 200, updated.text)
  const contact = await ann.post('/api/contacts', { first_name: 'Linda' })
  t.equal((await ann.put(`/api/associations/deals/${id}`, { contacts: [contact.body.data.id] })).status, 200)

  const answer = await history('ann@acme.test', `deals/${id}`)
  t.equal(answer.status, 200, answer.text)
  t.same(
    answer.body.data.map((entry: any) => entry.action),
    ['updated', 'updated', 'created'],
    'newest first',
  )
  const [linked, changed, first] = answer.body.data
  t.strictSame(linked.changes, { 'associations.contacts': { added: [contact.body.data.id], removed: [] } })
  t.strictSame(changed.changes, {
    name: { from: 'Boiler', to: 'Boiler room' },
    amount: { from: '100.00', to: '250.00' },
    'custom_fields.tier': { from: 'gold', to: 'silver' },
    'custom_fields.seats': { from: 3, to: null },
    'custom_fields.region': { from: null, to: 'eu' },
  })
  t.match(first.changes, {
    name: { from: null, to: 'Boiler' },
    amount: { from: null, to: '100.00' },
    stage: { from: null, to: 'lead' },
    owner_id: { from: null, to: userId('ann@acme.test') },
    'custom_fields.tier': { from: null, to: 'gold' },
  })
  for (const bookkeeping of ['id', 'created_at', 'updated_at', 'created_by', 'updated_by', 'custom_fields', 'close_date'])
    t.notOk(bookkeeping in first.changes, `a create does not list ${bookkeeping}`)
  t.strictSame(first.actor, {
    user_id: userId('ann@acme.test'),
    name: 'ann@acme.test',
    via: 'api',
    token_id: await tokenIdOf(ann.member.token),
  })
  t.match(first.occurred_at, /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/)
  t.equal(answer.body.next_cursor, null)
})

t.test('an OAuth app and an import are named as the actor', async (t) => {
  const app = await withOwner(
    url,
    async (client) =>
      (
        await client.query(
          `insert into crm.oauth_apps (workspace_id, name, client_id, redirect_uris, confidential)
           values ($1, 'Mail merge', 'crmapp_abcdefghijklmnopqrstuv', '{https://mailmerge.example/callback}', false) returning id`,
          [acme.id],
        )
      ).rows[0].id as string,
  )
  const appToken = await withOwner(url, (client) =>
    mintToken(client, userId('ann@acme.test'), { kind: 'oauth', scopes: ['deals:write'], workspaceId: acme.id, oauthAppId: app }),
  )
  const created = await server.request('POST', '/api/deals', { token: appToken, body: { name: 'Through the app' } })
  t.equal(created.status, 201, created.text)
  const [entry] = (await history('ann@acme.test', `deals/${created.body.data.id}`)).body.data
  t.strictSame(entry.actor, {
    user_id: userId('ann@acme.test'),
    name: 'ann@acme.test',
    via: 'oauth',
    token_id: await tokenIdOf(appToken),
    app_id: app,
  })

  const { job } = await importCsv(server, admin.member.token, 'contacts', 'First Name,Email\nImported,imported@example.com\n')
  t.equal(job.counts.created, 1, JSON.stringify(job))
  const listed = await admin.get('/api/contacts?filter[email]=imported@example.com')
  const [imported] = (await history('admin@acme.test', `contacts/${listed.body.data[0].id}`)).body.data
  t.equal(imported.action, 'created')
  t.equal(imported.actor.user_id, userId('admin@acme.test'))
  t.equal(imported.actor.via, 'import')
  t.same(imported.changes.email, { from: null, to: 'imported@example.com' })
})

t.test('pages newest first with cursors; bad parameters are 400', async (t) => {
  const id = (await ann.post('/api/deals', { name: 'v0' })).body.data.id
  for (let version = 1; version <= 7; version++) t.equal((await ann.patch(`/api/deals/${id}`, { name: `v${version}` })).status, 200)
  const whole = (await history('ann@acme.test', `deals/${id}`, '?limit=200')).body.data
  t.equal(whole.length, 8)
  t.same(
    whole.map((entry: any) => entry.changes.name.to),
    ['v7', 'v6', 'v5', 'v4', 'v3', 'v2', 'v1', 'v0'],
  )
  const seen: unknown[] = []
  let query = '?limit=3'
  let pages = 0
  for (;;) {
    const answer = await history('ann@acme.test', `deals/${id}`, query)
    t.equal(answer.status, 200, answer.text)
    seen.push(...answer.body.data)
    pages++
    if (answer.body.next_cursor === null) {
      t.notOk(answer.headers.get('link'), 'no Link on the last page')
      break
    }
    t.match(answer.headers.get('link'), `/api/deals/${id}/history?limit=3&cursor=`)
    query = `?limit=3&cursor=${answer.body.next_cursor}`
  }
  t.equal(pages, 3)
  t.same(seen, whole, 'the pages together are the whole history, each change once')

  for (const bad of ['?limit=0', '?limit=201', '?cursor=nope', '?cursor=eyJzIjoiaWQiLCJrIjpbIngiXX0', '?sort=id'])
    t.equal((await history('ann@acme.test', `deals/${id}`, bad)).status, 400, bad)
})

t.test('404 for a record the caller may not view, in any workspace; the token scopes apply as for GET one', async (t) => {
  const id = (await ann.post('/api/deals', { name: 'Ann’s' })).body.data.id
  t.equal((await history('bob@acme.test', `deals/${id}`)).status, 200, 'view all')
  t.equal((await history('reader@acme.test', `deals/${id}`)).status, 200, 'read only views all')
  t.equal((await history('carol@acme.test', `deals/${id}`)).status, 404, 'own scope, not hers')
  t.equal((await history('nobody@acme.test', `deals/${id}`)).status, 404, 'no grant')
  t.equal((await history('admin@other.test', `deals/${id}`)).status, 404, 'another workspace')
  t.equal((await history('admin@other.test', `deals/${id}`)).body.code, 'not_found')
  t.equal((await history('ann@acme.test', `contacts/${id}`)).status, 404, 'the id of another type')
  t.equal((await history('ann@acme.test', 'deals/01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a')).status, 404, 'no such record')
  t.equal((await history('ann@acme.test', 'deals/not-an-id')).status, 404, 'not an id')

  const carolsOwn = (await as('carol@acme.test').post('/api/deals', { name: 'Carol’s' })).body.data.id
  t.equal((await history('carol@acme.test', `deals/${carolsOwn}`)).status, 200, 'own scope, her own')

  const contactsOnly = await withOwner(url, (client) => mintToken(client, userId('ann@acme.test'), { scopes: ['contacts:read'] }))
  const refused = await server.request('GET', `/api/deals/${id}/history`, { token: contactsOnly })
  t.equal(refused.status, 403)
  t.equal(refused.body.code, 'insufficient_scope')
  const dealsRead = await withOwner(url, (client) => mintToken(client, userId('ann@acme.test'), { scopes: ['deals:read'] }))
  t.equal((await server.request('GET', `/api/deals/${id}/history`, { token: dealsRead })).status, 200)
})

t.test('an admin reads the history of a deleted record; a member does not', async (t) => {
  const id = (await ann.post('/api/deals', { name: 'Gone soon', custom_fields: { tier: 'gold' } })).body.data.id
  t.equal((await ann.del(`/api/deals/${id}`)).status, 204)
  const read = await history('admin@acme.test', `deals/${id}`)
  t.equal(read.status, 200, read.text)
  t.same(
    read.body.data.map((entry: any) => entry.action),
    ['deleted', 'created'],
  )
  t.match(read.body.data[0].changes, { name: { from: 'Gone soon', to: null }, 'custom_fields.tier': { from: 'gold', to: null } })
  t.equal(read.body.data[0].actor.user_id, userId('ann@acme.test'))
  for (const email of ['ann@acme.test', 'bob@acme.test', 'reader@acme.test', 'admin@other.test'])
    t.equal((await history(email, `deals/${id}`)).status, 404, `${email}: not any more`)
  // A page past the last change is empty, not 404, for whoever may read the history (the first
  // page says so by its entries; a later one asks for any change of the record).
  const oldest = read.body.data.at(-1).id as string
  const past = `?limit=2&cursor=${encodeCursor('-id', [oldest])}`
  const afterLast = await history('admin@acme.test', `deals/${id}`, past)
  t.equal(afterLast.status, 200, afterLast.text)
  t.same(afterLast.body.data, [], 'the admin: an empty page after the last change')
  t.equal((await history('ann@acme.test', `deals/${id}`, past)).status, 404, 'ann: still no such record with a cursor')
  const adminContactsOnly = await withOwner(url, (client) =>
    mintToken(client, userId('admin@acme.test'), { scopes: ['contacts:read', 'deals:write'] }),
  )
  t.equal((await server.request('GET', `/api/deals/${id}/history`, { token: adminContactsOnly })).status, 200, 'deals:write covers reading')
  const adminContactsRead = await withOwner(url, (client) => mintToken(client, userId('admin@acme.test'), { scopes: ['contacts:read'] }))
  t.equal((await server.request('GET', `/api/contacts/${id}/history`, { token: adminContactsRead })).status, 404, 'a deal id is no contact')
})

t.test('in SQL: no context sees nothing; crm.act_as sees what the API answers, for every member and record', async (t) => {
  // Records of several owners, some changed, linked and deleted, in both workspaces.
  const records: { path: string; id: string }[] = []
  for (const email of ['admin@acme.test', 'ann@acme.test', 'bob@acme.test', 'carol@acme.test']) {
    const deal = (await as(email).post('/api/deals', { name: `Deal of ${email}` })).body.data.id
    const contact = (await admin.post('/api/contacts', { first_name: email, owner_id: userId(email) })).body.data.id
    await as(email).patch(`/api/deals/${deal}`, { amount: '10.00', custom_fields: { k: email } })
    records.push({ path: 'deals', id: deal }, { path: 'contacts', id: contact })
  }
  const company = (await admin.post('/api/companies', { name: 'Linked' })).body.data.id
  records.push({ path: 'companies', id: company })
  t.equal((await admin.put(`/api/associations/companies/${company}`, { deals: [records[0].id, records[2].id] })).status, 200)
  const doomed = (await ann.post('/api/deals', { name: 'Doomed' })).body.data.id
  await ann.del(`/api/deals/${doomed}`)
  records.push({ path: 'deals', id: doomed })
  const elsewhere = (await as('admin@other.test').post('/api/deals', { name: 'Elsewhere' })).body.data.id
  records.push({ path: 'deals', id: elsewhere })

  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(() => client.end())

  await client.query('begin')
  await client.query(`select set_config('role', 'crm_api', true)`)
  t.equal(
    (await client.query('select count(*)::int as n from crm.record_history')).rows[0].n,
    0,
    'crm_api without a context sees no history',
  )
  await client.query('rollback')

  const emails = [
    'admin@acme.test',
    'ann@acme.test',
    'bob@acme.test',
    'reader@acme.test',
    'carol@acme.test',
    'nobody@acme.test',
    'admin@other.test',
  ]
  const inSql = async (email: string, record: { path: string; id: string }) => {
    await client.query('begin')
    try {
      await client.query('select crm.act_as($1, $2)', [email, email.endsWith('@other.test') ? 'other' : 'acme'])
      const { rows } = await client.query(
        `select id, crm.api_time(occurred_at) as occurred_at, action, actor, changes from crm.record_history
          where record_type = $1 and record_id = $2 order by id desc`,
        [{ deals: 'deal', contacts: 'contact', companies: 'company' }[record.path], record.id],
      )
      return rows
    } finally {
      await client.query('rollback')
    }
  }
  // crm.act_as acts with via system and no token: the actor's fields are the writer's either way.
  await fc.assert(
    fc.asyncProperty(fc.constantFrom(...emails), fc.constantFrom(...records), async (email, record) => {
      const overHttp = await history(email, `${record.path}/${record.id}`, '?limit=200')
      const rows = await inSql(email, record)
      if (overHttp.status === 404) return rows.length === 0
      return overHttp.status === 200 && isDeepStrictEqual(overHttp.body.data, rows)
    }),
    { numRuns: 60, seed: 41 },
  )
  // And exhaustively on the rules that matter most: a deleted record, another workspace.
  t.equal((await inSql('ann@acme.test', records.at(-2)!)).length, 0, 'a member: no history of a deleted record')
  t.equal((await inSql('admin@acme.test', records.at(-2)!)).length, 2, 'an admin: created and deleted')
  t.equal((await inSql('admin@acme.test', records.at(-1)!)).length, 0, 'another workspace’s record')
  t.equal((await inSql('admin@other.test', records.at(-1)!)).length, 1, 'its own workspace’s record')
  t.equal((await inSql('carol@acme.test', records[0])).length, 0, 'own scope: not the admin’s deal')
  t.ok((await inSql('carol@acme.test', records[6])).length > 0, 'own scope: her own deal')
})

/** The changes a history entry should list between two states of a record as the API shows them. */
function expectedChanges(before: Record<string, any>, after: Record<string, any>): Record<string, unknown> {
  const changes: Record<string, unknown> = {}
  const differ = (a: unknown, b: unknown) => !isDeepStrictEqual(a ?? null, b ?? null)
  for (const key of new Set([...Object.keys(before), ...Object.keys(after)])) {
    if (['id', 'created_at', 'updated_at', 'created_by', 'updated_by', 'custom_fields'].includes(key)) continue
    if (differ(before[key], after[key])) changes[key] = { from: before[key] ?? null, to: after[key] ?? null }
  }
  const [oldFields, newFields] = [before.custom_fields ?? {}, after.custom_fields ?? {}]
  for (const key of new Set([...Object.keys(oldFields), ...Object.keys(newFields)])) {
    if (differ(oldFields[key], newFields[key]))
      changes[`custom_fields.${key}`] = { from: oldFields[key] ?? null, to: newFields[key] ?? null }
  }
  return changes
}

t.test('every update lists exactly the fields it changed, stored with its event as the view would compute it', async () => {
  const value = fc.oneof(fc.string({ maxLength: 6 }), fc.integer({ min: -5, max: 5 }), fc.boolean(), fc.constant(null))
  const patch = fc.record(
    {
      name: fc.string({ minLength: 1, maxLength: 8 }),
      amount: fc.constantFrom('1.00', '2.50', null),
      stage: fc.constantFrom('lead', 'qualified', 'won'),
      custom_fields: fc.dictionary(fc.constantFrom('tier', 'seats', 'note'), value, { maxKeys: 3 }),
    },
    { requiredKeys: [] },
  )
  await fc.assert(
    fc.asyncProperty(fc.array(patch, { minLength: 1, maxLength: 4 }), async (patches) => {
      const id = (await ann.post('/api/deals', { name: 'Property' })).body.data.id
      const expected: Record<string, unknown>[] = []
      let state = (await ann.get(`/api/deals/${id}`)).body.data
      for (const body of patches) {
        const answer = await ann.patch(`/api/deals/${id}`, body)
        if (answer.status !== 200) throw new Error(`PATCH answered ${answer.status}: ${answer.text}`)
        const changes = expectedChanges(state, answer.body.data)
        if (Object.keys(changes).length > 0) expected.unshift(changes)
        state = answer.body.data
      }
      const entries = (await history('ann@acme.test', `deals/${id}`, '?limit=200')).body.data
      const updates = entries.filter((entry: any) => entry.action === 'updated').map((entry: any) => entry.changes)
      const stored = await withOwner(url, async (client) => {
        const { rows } = await client.query(
          `select count(*) filter (where e.changes is null)::int as missing,
                  count(*) filter (where e.changes is distinct from (select c.changes from crm.event_changes(e.event, e.data) c))::int as differing
             from crm.events e where e.record_id = $1 and e.event = 'deal.updated'`,
          [id],
        )
        return rows[0]
      })
      return isDeepStrictEqual(updates, expected) && stored.missing === 0 && stored.differing === 0
    }),
    { numRuns: 15, seed: 52 },
  )
})
