// create / upsert / dry run, bad rows, errors.csv, and the grants the database enforces.
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { importCsv, upload } from './helpers.ts'

const FILE = [
  'First Name,Last Name,Email,Company,Notes',
  'Ada,Lovelace,ada@example.com,"Analytical Engines, Ltd",first',
  'Grace,Hopper,GRACE@example.com,Navy,second',
  'Linus,,linus@example.com,analytical engines, ltd,third',
].join('\r\n')

t.test('create, then re-import: duplicates in create mode, updates in upsert mode, dry run writes nothing', async (t) => {
  const server = await startTestServer(t, { worker: true })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin', 'bob@a.test': 'member' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, server.databaseUrl)
  const count = async (table: string) =>
    (await db.query(`select count(*)::int as n from crm.${table} where workspace_id = $1`, [tenant.id])).rows[0].n
  const mapping = {
    'First Name': 'first_name',
    'Last Name': 'last_name',
    Email: 'email',
    Company: 'company_name',
    Notes: 'custom_fields.notes',
  }

  // Row 3 has one value too many (an unquoted comma): reported, the others land.
  const first = await importCsv(server, admin.token, 'contacts', FILE, { mapping })
  t.equal(first.job.status, 'completed')
  t.same(first.job.counts, { total: 3, created: 2, updated: 0, skipped: 0, failed: 1, companies_created: 2 })
  t.same(first.job.errors, [{ row: 3, column: null, field: null, message: 'has 6 values but the header has 5 columns' }])
  const {
    rows: [grace],
  } = await db.query(`select email, custom_fields from crm.contacts where workspace_id = $1 and first_name = 'Grace'`, [tenant.id])
  t.same(grace, { email: 'grace@example.com', custom_fields: { notes: 'second' } }, 'emails are stored lower-case; custom fields land')

  const fixed =
    'First Name,Last Name,Email,Company,Notes\nAda,Lovelace,ada@example.com,"analytical engines, ltd",changed\nGrace,Hopper,grace@example.com,Navy,second\nAda,Again,ada@example.com,,x\n'
  const eventsBefore = await count('events')

  const dry = await importCsv(server, admin.token, 'contacts', fixed, { mapping, mode: 'upsert', dry_run: true })
  t.same(
    dry.job.counts,
    { total: 3, created: 0, updated: 1, skipped: 1, failed: 1, companies_created: 0 },
    'a dry run counts what a real run would do',
  )
  t.equal(dry.job.dry_run, true)
  t.equal(await count('events'), eventsBefore, 'a dry run writes no event')
  t.equal(
    (
      await db.query(`select custom_fields ->> 'notes' as notes from crm.contacts where workspace_id = $1 and email = 'ada@example.com'`, [
        tenant.id,
      ])
    ).rows[0].notes,
    'first',
    'and no record',
  )

  const creating = await importCsv(server, admin.token, 'contacts', fixed, { mapping })
  t.same(creating.job.counts, { total: 3, created: 0, updated: 0, skipped: 0, failed: 3, companies_created: 0 })
  t.same(
    creating.job.errors.map((error: any) => [error.row, error.field, error.column]),
    [
      [1, 'email', 'Email'],
      [2, 'email', 'Email'],
      [3, 'email', 'Email'],
    ],
  )
  t.match(creating.job.errors[0].message, /duplicate/)
  t.match(creating.job.errors[2].message, /repeats row 1/)

  const upserting = await importCsv(server, admin.token, 'contacts', fixed, { mapping, mode: 'upsert', match_on: 'email' })
  t.same(upserting.job.counts, { total: 3, created: 0, updated: 1, skipped: 1, failed: 1, companies_created: 0 })
  t.equal(await count('contacts'), 2)
  const { rows: events } = await db.query(
    `select data -> 'previous_attributes' as previous, actor ->> 'via' as via from crm.events where workspace_id = $1 and event = 'contact.updated'`,
    [tenant.id],
  )
  t.same(events, [{ previous: { custom_fields: { notes: 'first' } }, via: 'import' }], 'one update event, with what changed')

  const errorsCsv = await server.request('GET', `/api/contacts/import/${upserting.upload.id}/errors.csv`, { token: admin.token })
  t.equal(errorsCsv.status, 200)
  t.equal(errorsCsv.headers.get('content-type'), 'text/csv; charset=utf-8')
  t.equal(
    errorsCsv.text,
    'First Name,Last Name,Email,Company,Notes,row,error\r\nAda,Again,ada@example.com,,x,3,duplicate: email repeats row 1 of this file\r\n',
  )

  const again = await server.request('POST', `/api/contacts/import/${upserting.upload.id}`, { token: admin.token, body: { mapping } })
  t.equal(again.status, 409, 'a file runs once for real')
})

t.test('invalid values are reported with their data row number; valid rows land', async (t) => {
  const server = await startTestServer(t, { worker: true })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, server.databaseUrl)
  const deals = [
    'Name;Amount;Stage;Close Date;Company',
    'Big deal;12500.00;Won;2026-11-22;Acme',
    'Bad amount;12,5;lead;2026-01-01;Acme',
    '"Multi',
    'line";10;negotiation;2026-02-30;',
    ';5;lead;;',
    'Bad stage;1;nowhere;;',
    'Fine;;;;',
  ].join('\n')
  const { upload: uploaded, job } = await importCsv(server, admin.token, 'deals', deals)
  t.same(uploaded.suggested_mapping, {
    Name: 'name',
    Amount: 'amount',
    Stage: 'stage',
    'Close Date': 'close_date',
    Company: 'company_name',
  })
  t.same(job.counts, { total: 6, created: 2, updated: 0, skipped: 0, failed: 4, companies_created: 1 })
  t.same(
    job.errors.map((error: any) => [error.row, error.column, error.field]),
    [
      [2, 'Amount', 'amount'],
      [3, 'Close Date', 'close_date'],
      [4, 'Name', 'name'],
      [5, 'Stage', 'stage'],
    ],
  )
  t.match(job.errors[3].message, /lead, qualified, proposal, negotiation, won, lost/)
  const { rows } = await db.query(
    `select name, amount::text, stage, currency, close_date::text from crm.deals where workspace_id = $1 order by name`,
    [tenant.id],
  )
  t.same(rows, [
    { name: 'Big deal', amount: '12500.00', stage: 'won', currency: 'USD', close_date: '2026-11-22' },
    { name: 'Fine', amount: null, stage: 'lead', currency: 'USD', close_date: null },
  ])
})

t.test('the import grant is enforced by the database', async (t) => {
  const server = await startTestServer(t, { worker: true })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin', 'bob@a.test': 'member' } })
  const bob = tenant.members['bob@a.test']
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, server.databaseUrl)

  const refused = await upload(server, bob.token, 'contacts', 'Email\nx@example.com\n')
  t.equal(refused.status, 403, 'a member without contacts:import cannot upload')

  // A custom role with import but no update: create works, upsert is refused (403 at start).
  await db.query(`insert into crm.roles (workspace_id, name) values ($1, 'importer')`, [tenant.id])
  await db.query(
    `insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
     select $1, r.id, 'contacts', a, 'own' from crm.roles r, unnest(array['view', 'import']) a where r.workspace_id = $1 and r.name = 'importer'`,
    [tenant.id],
  )
  await db.query(
    `update crm.memberships set role_id = (select id from crm.roles where workspace_id = $1 and name = 'importer') where workspace_id = $1 and user_id = $2`,
    [tenant.id, bob.id],
  )
  const created = await importCsv(server, bob.token, 'contacts', 'Email,Owner\nmine@example.com,\n')
  t.equal(created.job.counts.created, 1, 'import without create: the import grant decides')
  const uploaded = await upload(server, bob.token, 'contacts', 'Email\nmine@example.com\n')
  const upsert = await server.request('POST', `/api/contacts/import/${uploaded.body.data.id}`, {
    token: bob.token,
    body: { mode: 'upsert' },
  })
  t.equal(upsert.status, 403)

  // Owners outside the import scope (own) are refused row by row.
  const other = await importCsv(server, bob.token, 'contacts', `Email,owner_id\nforeign@example.com,${admin.id}\n`, {
    mapping: { Email: 'email', owner_id: 'owner_id' },
  })
  t.same(
    other.job.errors.map((error: any) => error.message),
    ['your role may not import records for this owner'],
  )

  // An email taken by a contact bob cannot see (RLS hides it from the match): that row is a
  // duplicate, the batch's other rows still land (the plain INSERT is retried with ON CONFLICT).
  await db.query(`insert into crm.contacts (workspace_id, owner_id, email) values ($1, $2, 'hidden@example.com')`, [tenant.id, admin.id])
  const hidden = await importCsv(server, bob.token, 'contacts', 'Email\nfirst@example.com\nhidden@example.com\nlast@example.com\n')
  t.same(hidden.job.counts, { total: 3, created: 2, updated: 0, skipped: 0, failed: 1, companies_created: 0 })
  t.same(hidden.job.errors, [
    { row: 2, column: 'Email', field: 'email', message: 'duplicate: this email is already taken by a contact you cannot see' },
  ])
  const { rows: landed } = await db.query(
    `select c.email, (select count(*)::int from crm.events e where e.workspace_id = c.workspace_id and e.record_id = c.id and e.actor ->> 'via' = 'import') as events
       from crm.contacts c where c.workspace_id = $1 and c.email in ('first@example.com', 'last@example.com') order by c.email`,
    [tenant.id],
  )
  t.same(
    landed,
    [
      { email: 'first@example.com', events: 1 },
      { email: 'last@example.com', events: 1 },
    ],
    'the others land once, each with one event',
  )

  // In SQL: outside an import, crm_api cannot use the import policies, whatever crm.via says.
  await db.query('begin')
  await db.query(`select crm.act_as('bob@a.test', $1)`, [tenant.slug])
  await db.query(`select set_config('crm.via', 'import', true), set_config('crm.import_id', $1, true)`, [created.upload.id])
  await t.rejects(db.query(`insert into crm.contacts (email) values ('forged@example.com')`), /row-level security/)
  await db.query('rollback')
})

t.test('raw text/csv upload with a BOM and semicolons; prune_imports drops old files', async (t) => {
  const server = await startTestServer(t, { worker: true })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, server.databaseUrl)
  const raw = Buffer.concat([
    Buffer.from([0xef, 0xbb, 0xbf]),
    Buffer.from('Name;Domain;Number of employees\r\n"Acme; Inc";ACME.example.com.;12\r\nBeta;beta.example.com;-3\r\n'),
  ])
  const uploaded = await server.request('POST', '/api/companies/import/upload', {
    token: admin.token,
    raw,
    headers: { 'content-type': 'text/csv; charset=utf-8' },
  })
  t.equal(uploaded.status, 201)
  t.match(uploaded.body.data, { status: 'uploaded', file_name: null, row_count: 2, columns: ['Name', 'Domain', 'Number of employees'] })
  t.same(uploaded.body.data.sample_rows[0], ['Acme; Inc', 'ACME.example.com.', '12'])
  t.same(uploaded.body.data.suggested_mapping, { Name: 'name', Domain: 'domain', 'Number of employees': 'employee_count' })
  t.equal(uploaded.headers.get('location'), `/api/companies/import/${uploaded.body.data.id}`)

  const bad = await server.request('POST', '/api/companies/import/upload', {
    token: admin.token,
    raw: Buffer.from([0xff, 0xfe, 0x41]),
    headers: { 'content-type': 'text/csv' },
  })
  t.equal(bad.status, 422)
  t.equal(bad.body.errors[0].code, 'invalid_encoding')
  const json = await server.request('POST', '/api/companies/import/upload', { token: admin.token, body: { a: 1 } })
  t.equal(json.status, 415)
  const badMapping = await server.request('POST', `/api/companies/import/${uploaded.body.data.id}`, {
    token: admin.token,
    body: { mapping: { Nope: 'name' } },
  })
  t.equal(badMapping.status, 422)
  t.equal(badMapping.body.errors[0].pointer, '/mapping/Nope')
  const badMatch = await server.request('POST', `/api/companies/import/${uploaded.body.data.id}`, {
    token: admin.token,
    body: { mode: 'upsert', match_on: 'email' },
  })
  t.equal(badMatch.status, 422)
  t.equal((await server.request('GET', '/api/companies/import/01932f3c-0000-7000-8000-000000000000', { token: admin.token })).status, 404)

  const started = await server.request('POST', `/api/companies/import/${uploaded.body.data.id}`, { token: admin.token, body: {} })
  t.equal(started.status, 202)
  t.match(started.body.data, { id: uploaded.body.data.id, status: 'queued', mode: 'create', dry_run: false, counts: { total: 2 } })
  const { waitForImport } = await import('./helpers.ts')
  const job = await waitForImport(server, admin.token, 'companies', uploaded.body.data.id)
  t.same(job.counts, { total: 2, created: 1, updated: 0, skipped: 0, failed: 1, companies_created: 0 })
  t.same(job.errors, [{ row: 2, column: 'Number of employees', field: 'employee_count', message: 'employee_count is out of range' }])
  const {
    rows: [acme],
  } = await db.query(`select name, domain, employee_count from crm.companies where workspace_id = $1`, [tenant.id])
  t.same(acme, { name: 'Acme; Inc', domain: 'acme.example.com', employee_count: 12 })

  await db.query(`update crm.imports set created_at = now() - interval '8 days' where workspace_id = $1`, [tenant.id])
  const { rows: steps } = await db.query(`select step, removed from crm.housekeeping(30) where step = 'crm.prune_imports'`)
  t.ok(steps[0].removed >= 1, 'housekeeping runs prune_imports')
  const {
    rows: [after],
  } = await db.query(
    `select file_bytes is null as pruned, (select count(*)::int from crm.import_rows where workspace_id = $1) as staged from crm.imports where workspace_id = $1`,
    [tenant.id],
  )
  t.same(after, { pruned: true, staged: 0 })
  t.equal(
    (await server.request('GET', `/api/companies/import/${uploaded.body.data.id}`, { token: admin.token })).status,
    200,
    'the job report stays until the log retention',
  )
})
