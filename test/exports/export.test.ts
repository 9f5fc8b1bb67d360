// Export: streamed CSV/NDJSON, only rows the caller may view and export, and a round trip through
// import that changes nothing.
import t from 'tap'
import { pgQueryText } from '../../src/db/pool.ts'
import { exportQuery } from '../../src/exports/export-query.ts'
import { CONTACT } from '../../src/records/fields.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { importCsv } from '../imports/helpers.ts'

const PEOPLE = [
  'First Name,Last Name,Email,Company,City',
  'Zoë,"Ødegård, Jr.",zoe@example.com,"Crème, Brûlée & Co",Zürich',
  'José,Nuñez,jose@example.com,北京公司,"Line one\nline two"',
  'Plain,Person,plain@example.com,,Oslo',
].join('\n')

t.test('export streams what the caller may export, and re-importing it changes nothing', async (t) => {
  const server = await startTestServer(t, { worker: true })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin', 'bob@a.test': 'member' } })
  const admin = tenant.members['admin@a.test']
  const bob = tenant.members['bob@a.test']
  const db = await ownerClient(t, server.databaseUrl)
  const first = await importCsv(server, admin.token, 'contacts', PEOPLE)
  t.equal(first.job.counts.created, 3)

  const csv = await server.request('POST', '/api/contacts/export', { token: admin.token, body: {} })
  t.equal(csv.status, 200)
  t.equal(csv.headers.get('content-type'), 'text/csv; charset=utf-8')
  t.equal(csv.headers.get('content-disposition'), `attachment; filename="contacts-${new Date().toISOString().slice(0, 10)}.csv"`)
  const lines = csv.text.split('\r\n')
  t.equal(lines[0], CONTACT.fields.map((field) => field.name).join(','), 'a header row of every field')
  t.match(csv.text, /"Ødegård, Jr\."/, 'commas are quoted, non-ASCII text kept')
  t.match(csv.text, /"Line one\nline two"/, 'line breaks are quoted')

  // The exported file, uploaded again, suggests id (UUIDs) and updates nothing.
  const roundTrip = await importCsv(server, admin.token, 'contacts', csv.text, { mode: 'upsert', match_on: 'id' })
  t.equal(roundTrip.upload.suggested_mapping.id, 'id')
  t.same(
    roundTrip.job.counts,
    { total: 3, created: 0, updated: 0, skipped: 3, failed: 0, companies_created: 0 },
    JSON.stringify(roundTrip.job.errors),
  )
  const {
    rows: [events],
  } = await db.query(`select count(*)::int as n from crm.events where workspace_id = $1 and event = 'contact.updated'`, [tenant.id])
  t.equal(events.n, 0, 'no record changed')

  const ndjson = await server.request('POST', '/api/contacts/export', {
    token: admin.token,
    body: {
      format: 'ndjson',
      fields: ['email', 'city'],
      filter: { email: { in: ['zoe@example.com', 'jose@example.com'] } },
      sort: '-email',
    },
  })
  t.equal(ndjson.status, 200)
  t.equal(ndjson.headers.get('content-type'), 'application/x-ndjson')
  t.same(
    ndjson.text
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line)),
    [
      { email: 'zoe@example.com', city: 'Zürich' },
      { email: 'jose@example.com', city: 'Line one\nline two' },
    ],
  )
  const full = await server.request('POST', '/api/contacts/export', {
    token: admin.token,
    body: { format: 'ndjson', filter: { city: 'Oslo' } },
  })
  t.same(
    Object.keys(JSON.parse(full.text)),
    CONTACT.fields.map((field) => field.name),
    'the whole record, as the API shows it',
  )

  const unknown = await server.request('POST', '/api/contacts/export', { token: admin.token, body: { fields: ['nope'] } })
  t.equal(unknown.status, 422)
  t.equal(unknown.body.errors[0].pointer, '/fields/0')
  const badFilter = await server.request('POST', '/api/contacts/export', {
    token: admin.token,
    body: { filter: { created_at: { gte: 'yesterday' } } },
  })
  t.equal(badFilter.status, 422)
  t.equal(badFilter.headers.get('content-type'), 'application/problem+json')
  const extra = await server.request('POST', '/api/contacts/export', { token: admin.token, body: { format: 'xml' } })
  t.equal(extra.status, 422)

  // A member (view all, no export grant): 403, and in SQL the export query sees nothing.
  const refused = await server.request('POST', '/api/contacts/export', { token: bob.token, body: {} })
  t.equal(refused.status, 403)
  const { query } = exportQuery(CONTACT, {})
  await db.query('begin')
  await db.query(`select crm.act_as('bob@a.test', $1)`, [tenant.slug])
  const {
    rows: [visible],
  } = await db.query('select count(*)::int as n from crm.contacts')
  const { rows: exported } = await db.query(pgQueryText(query.sql), query.values as unknown[])
  await db.query('rollback')
  t.equal(visible.n, 3, 'bob can view the contacts')
  t.equal(exported.length, 0, 'but the export query gives him none')

  // A role with export of its own records only.
  await db.query(`insert into crm.roles (workspace_id, name) values ($1, 'exporter')`, [tenant.id])
  await db.query(
    `insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
     select $1, r.id, 'contacts', a, s from crm.roles r, (values ('view', 'all'), ('export', 'own'), ('create', 'own')) g(a, s) where r.workspace_id = $1 and r.name = 'exporter'`,
    [tenant.id],
  )
  await db.query(
    `update crm.memberships set role_id = (select id from crm.roles where workspace_id = $1 and name = 'exporter') where workspace_id = $1 and user_id = $2`,
    [tenant.id, bob.id],
  )
  t.equal((await server.request('POST', '/api/contacts', { token: bob.token, body: { email: 'bobs@example.com' } })).status, 201)
  const own = await server.request('POST', '/api/contacts/export', { token: bob.token, body: { fields: ['email'] } })
  t.equal(own.text, 'email\r\nbobs@example.com\r\n', 'export:own gives only his own records')
})

// The stream runs for as long as the client reads. With the request statement timeout shortened to
// 300 ms, a reader that pauses between chunks keeps it running for seconds: the export must still
// arrive whole (it runs under EXPORT_TIMEOUT_MS), and past that limit it is cut.
t.test('an export outlasts the request statement timeout, within its own limit', async (t) => {
  const deals = 40_000
  const slowExport = async (env: Record<string, string>) => {
    const server = await startTestServer(t, { env: { STATEMENT_TIMEOUT_MS: '300', ...env } })
    const tenant = await createTenant(server.databaseUrl, { members: { 'admin@slow.test': 'admin' } })
    const admin = tenant.members['admin@slow.test']
    const db = await ownerClient(t, server.databaseUrl)
    // Loaded without the outbox triggers: this test is about reading.
    await db.query('set session_replication_role = replica')
    await db.query(
      `insert into crm.deals (workspace_id, owner_id, created_by, updated_by, name, amount, currency, stage)
       select $1, $2, $2, $2, 'Deal ' || g || repeat(' padding', 24), g, 'EUR', 'lead' from generate_series(1, ${deals}) g`,
      [tenant.id, admin.id],
    )
    const response = await fetch(`${server.url}/api/deals/export`, {
      method: 'POST',
      headers: { authorization: `Bearer ${admin.token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ format: 'ndjson', fields: ['id', 'name'] }),
    })
    t.equal(response.status, 200)
    let lines = 0
    const started = Date.now()
    try {
      for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
        for (const byte of chunk) if (byte === 0x0a) lines++
        // Slow enough that the kernel's socket buffers fill and the cursor waits on the reader.
        await new Promise((resolve) => setTimeout(resolve, 30))
      }
    } catch {
      // The connection was cut: counted by the lines that arrived.
    }
    return { lines, seconds: (Date.now() - started) / 1000 }
  }

  const whole = await slowExport({})
  t.equal(whole.lines, deals, `every row arrived (the slow read took ${whole.seconds.toFixed(1)} s)`)
  const cut = await slowExport({ EXPORT_TIMEOUT_MS: '1000' })
  t.ok(cut.lines < deals, `past EXPORT_TIMEOUT_MS the stream is cut (${cut.lines} of ${deals} rows arrived)`)
})
