// An export imports back unchanged (docs/api.md section 6, "Round trip"): the import takes the
// export's formula guard off again, so phones like +1 555 0900 and formula-looking names survive.

import { parse } from 'csv-parse/sync'
import fc from 'fast-check'
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { importCsv } from '../imports/helpers.ts'

t.test('an export with guarded cells, imported with upsert on id, changes nothing', async (t) => {
  const server = await startTestServer(t, { worker: true })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, server.databaseUrl)
  const people = [
    {
      first_name: '=SUM(1)',
      last_name: '-minus',
      email: 'sum@example.com',
      phone: '+1 555 0900',
      custom_fields: { tier: 'gold', score: 3 },
    },
    {
      first_name: '@at',
      last_name: "'=already quoted",
      email: 'at@example.com',
      phone: '+44 20 7946 0000',
      custom_fields: { note: '=1+1, "quoted"' },
    },
    { first_name: 'Plain', last_name: 'Person', email: 'plain@example.com', phone: '555 0100' },
  ]
  for (const person of people) {
    const created = await server.request('POST', '/api/contacts', { token: admin.token, body: person })
    t.equal(created.status, 201, created.text)
  }
  const before = await db.query(
    `select id, first_name, last_name, phone, custom_fields, updated_at from crm.contacts where workspace_id = $1 order by id`,
    [tenant.id],
  )

  const csv = await server.request('POST', '/api/contacts/export', { token: admin.token, body: {} })
  t.equal(csv.status, 200)
  t.match(csv.text, /'\+1 555 0900/, 'the export guards the phone')
  t.match(csv.text, /'=SUM\(1\)/, 'and the formula-looking name')

  const roundTrip = await importCsv(server, admin.token, 'contacts', csv.text, { mode: 'upsert', match_on: 'id' })
  t.equal(roundTrip.upload.suggested_mapping.custom_fields, 'custom_fields', 'the custom_fields column is suggested')
  t.same(
    roundTrip.job.counts,
    { total: 3, created: 0, updated: 0, skipped: 3, failed: 0, companies_created: 0 },
    JSON.stringify(roundTrip.job.errors),
  )
  const after = await db.query(
    `select id, first_name, last_name, phone, custom_fields, updated_at from crm.contacts where workspace_id = $1 order by id`,
    [tenant.id],
  )
  t.same(after.rows, before.rows, 'every value equal, nothing touched')
  const {
    rows: [events],
  } = await db.query(`select count(*)::int as n from crm.events where workspace_id = $1 and event = 'contact.updated'`, [tenant.id])
  t.equal(events.n, 0, 'no event')

  // The custom_fields column of a file adds its keys to the record's; a cell that is not a JSON
  // object is that row's error.
  const file = [
    'email,custom_fields,custom_fields.region',
    'sum@example.com,"{""tier"": ""platinum"", ""since"": 2020}",emea',
    'new@example.com,"{""tier"": ""bronze""}",',
    'bad@example.com,not json,',
    'list@example.com,[1],',
  ].join('\n')
  const merged = await importCsv(server, admin.token, 'contacts', file, {
    mode: 'upsert',
    match_on: 'email',
    mapping: { email: 'email', custom_fields: 'custom_fields', 'custom_fields.region': 'custom_fields.region' },
  })
  t.same(merged.job.counts, { total: 4, created: 1, updated: 1, skipped: 0, failed: 2, companies_created: 0 })
  t.same(
    merged.job.errors.map((error: { row: number; field: string; message: string }) => [error.row, error.field, error.message]),
    [
      [3, 'custom_fields', 'custom_fields must be a JSON object, such as {"tier": "gold"}'],
      [4, 'custom_fields', 'custom_fields must be a JSON object, such as {"tier": "gold"}'],
    ],
  )
  const custom = await db.query(
    `select email, custom_fields from crm.contacts where workspace_id = $1 and email in ('sum@example.com', 'new@example.com') order by email`,
    [tenant.id],
  )
  t.same(custom.rows, [
    { email: 'new@example.com', custom_fields: { tier: 'bronze', region: null } },
    { email: 'sum@example.com', custom_fields: { tier: 'platinum', score: 3, since: 2020, region: 'emea' } },
  ])

  // In SQL: any text (as the import reads it: no leading or trailing spaces, not empty), written by
  // the export's cell function and parsed as CSV, comes back exactly through crm.import_cell.
  const text = fc
    .string({ unit: fc.constantFrom("'", "''", '=', '+', '-', '@', '\t', '\r', '\n', '"', ',', 'a', 'Z', '1', ' ', 'é') })
    .map((value) => value.replace(/^ +| +$/g, ''))
    .filter((value) => value !== '')
  await fc.assert(
    fc.asyncProperty(fc.array(text, { minLength: 1, maxLength: 50 }), async (values) => {
      const written = await db.query('select crm.csv_text_cell(v) as cell from unnest($1::text[]) with ordinality u(v, n) order by n', [
        values,
      ])
      const cells = written.rows.map((row) => (parse(row.cell, { relax_quotes: true })[0] ?? [''])[0] as string)
      const read = await db.query('select crm.import_cell(c) as value from unnest($1::text[]) with ordinality u(c, n) order by n', [cells])
      t.same(
        read.rows.map((row) => row.value),
        values,
      )
    }),
    { numRuns: 200 },
  )
})
