// The import fast paths (sql/definitions/30_records.sql, sql/definitions/50_imports_and_exports.sql) keep every rule: the outbox's
// jsonb rendering equals the API's json rendering, the custom_fields CHECK refuses what the full
// check refuses, the insert triggers normalise, and repeated keys are found across batches and re-marked when
// a file runs again with another key.
import t from 'tap'
import { processImport } from '../../src/imports/process-import.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'

t.test('events store exactly what the API renders', async (t) => {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, url)
  const {
    rows: [company],
  } = await db.query(
    `insert into crm.companies (workspace_id, owner_id, name, domain, website, industry, phone, city, country, employee_count, annual_revenue, description, custom_fields)
     values ($1, $2, 'Ünïcode "Co"', 'example.com', 'https://example.com/x', 'Tools', '+1 555 0100', 'Zürich', 'CH', 12, 1234.5, e'line\\nbreak', '{"tier": 1, "vip": true, "note": null}')
     returning id`,
    [tenant.id, admin.id],
  )
  await db.query(`insert into crm.companies (workspace_id, owner_id, name) values ($1, $2, 'Bare')`, [tenant.id, admin.id])
  await db.query(
    `insert into crm.contacts (workspace_id, owner_id, first_name, last_name, email, phone, job_title, city, country, company_id, custom_fields)
     values ($1, $2, 'Ada', 'O''Neil', 'ada@example.com', '555', 'Eng', 'Paris', 'FR', $3, '{"x": "y"}'), ($1, $2, null, null, 'bare@example.com', null, null, null, null, null, '{}')`,
    [tenant.id, admin.id, company.id],
  )
  await db.query(
    `insert into crm.deals (workspace_id, owner_id, name, amount, currency, stage, close_date, company_id)
     values ($1, $2, 'Big', 99.9, 'EUR', 'won', '2026-02-28', $3), ($1, $2, 'Small', null, 'USD', 'lead', null, null)`,
    [tenant.id, admin.id, company.id],
  )
  for (const [table, json, jsonb] of [
    ['companies', 'company_json', 'company_jsonb'],
    ['contacts', 'contact_json', 'contact_jsonb'],
    ['deals', 'deal_json', 'deal_jsonb'],
  ]) {
    const { rows } = await db.query(
      `select crm.${json}(r)::jsonb as api, crm.${jsonb}(r) as outbox from crm.${table} r where r.workspace_id = $1`,
      [tenant.id],
    )
    t.equal(rows.length, 2)
    for (const row of rows) t.same(row.outbox, row.api, `${table}: the outbox object is the API object`)
  }
  const { rows: events } = await db.query(
    `select e.data -> 'object' as object, crm.contact_json(c)::jsonb as api
       from crm.events e join crm.contacts c on c.workspace_id = e.workspace_id and c.id = e.record_id
      where e.workspace_id = $1 and e.event = 'contact.created'`,
    [tenant.id],
  )
  t.equal(events.length, 2)
  for (const event of events) t.same(event.object, event.api, 'contact.created carries the contact as the API shows it')

  await db.query(`update crm.deals set stage = 'lost', amount = 5 where workspace_id = $1 and name = 'Big'`, [tenant.id])
  const {
    rows: [updated],
  } = await db.query(
    `select data -> 'previous_attributes' as previous from crm.events where workspace_id = $1 and event = 'deal.updated'`,
    [tenant.id],
  )
  t.same(Object.keys(updated.previous).sort(), ['amount', 'stage', 'stage_changed_at'])
  t.same([updated.previous.amount, updated.previous.stage], ['99.90', 'won'], 'previous_attributes keep their API rendering')
})

t.test('the custom_fields CHECK refuses what it refused before', async (t) => {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, url)
  const insert = (fields: string) =>
    db.query(`insert into crm.contacts (workspace_id, owner_id, first_name, custom_fields) values ($1, $2, 'A', $3::jsonb)`, [
      tenant.id,
      admin.id,
      fields,
    ])
  await insert('{}')
  await insert('{"ok_key": "v", "n": 1, "b": false, "z": null}')
  for (const bad of [
    '[]',
    '"text"',
    '{"Bad": 1}',
    '{"nested": {"a": 1}}',
    '{"list": [1]}',
    JSON.stringify(Object.fromEntries(Array.from({ length: 51 }, (_, i) => [`k${i}`, i]))),
  ]) {
    await t.rejects(insert(bad), { code: '23514' }, `refused: ${bad.slice(0, 30)}`)
  }
  const {
    rows: [same],
  } = await db.query(
    `select bool_and(crm.custom_fields_are_valid(v) is not distinct from crm.custom_fields_entries_are_valid(v)) as same
       from (values ('{}'::jsonb), ('{"a": 1}'), ('[]'), ('{"A": 1}'), (null)) x (v)`,
  )
  t.equal(same.same, true, "the inline answer for {} is the full check's answer")
})

t.test('insert triggers still normalise when they are skipped for rows already in shape', async (t) => {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, url)
  const {
    rows: [contact],
  } = await db.query(`insert into crm.contacts (workspace_id, owner_id, email) values ($1, $2, 'Ada@Example.COM') returning email`, [
    tenant.id,
    admin.id,
  ])
  t.equal(contact.email, 'ada@example.com')
  const {
    rows: [company],
  } = await db.query(
    `insert into crm.companies (workspace_id, owner_id, name, domain) values ($1, $2, 'X', 'Example.ORG.') returning domain`,
    [tenant.id, admin.id],
  )
  t.equal(company.domain, 'example.org')
  const {
    rows: [deal],
  } = await db.query(
    `insert into crm.deals (workspace_id, owner_id, name, stage_changed_at) values ($1, $2, 'D', '2000-01-01') returning stage, stage_changed_at = now() as now`,
    [tenant.id, admin.id],
  )
  t.same(deal, { stage: 'lead', now: true }, 'a deal gets the first stage, and stage_changed_at is the insert time whatever was sent')
  const {
    rows: [later],
  } = await db.query(`update crm.contacts set email = 'ADA2@example.com' where workspace_id = $1 returning email`, [tenant.id])
  t.equal(later.email, 'ada2@example.com', 'updates normalise too')
})

t.test('keys repeated across batches are duplicates; a new run with another key marks again', async (t) => {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, url)
  const file = 'Name,Email\nA,a@example.com\nB,b@example.com\nA2, A@EXAMPLE.COM \nC,c@example.com\nB2,b@example.com\nD,\nE,\n'
  const columns = ['Name', 'Email']
  const {
    rows: [created],
  } = await db.query(
    `insert into crm.imports (workspace_id, user_id, record_type, file_name, file_bytes, file_size, delimiter, columns, row_count, sample_rows, suggested_mapping, status, mapping, mode, match_on, dry_run)
     values ($1, $2, 'contacts', 'f.csv', $3, $4, ',', $5, 7, '[]', '{}', 'queued', $6, 'create', 'email', true) returning id`,
    [tenant.id, admin.id, Buffer.from(file), Buffer.byteLength(file), columns, JSON.stringify({ Name: 'first_name', Email: 'email' })],
  )
  const job = { workspace_id: tenant.id, import_id: created.id }
  t.equal(await processImport(db, job, { batchSize: 2 }), true)
  const errors = async () =>
    (
      await db.query(
        `select row, field, message from crm.import_errors where workspace_id = $1 and import_id = $2 order by row, position`,
        [tenant.id, created.id],
      )
    ).rows
  t.same(
    await errors(),
    [
      { row: 3, field: 'email', message: 'duplicate: email repeats row 1 of this file' },
      { row: 5, field: 'email', message: 'duplicate: email repeats row 2 of this file' },
    ],
    'repeats found in later batches, empty keys never repeat',
  )
  const {
    rows: [marks],
  } = await db.query(
    `select array_agg(row order by row) as rows from crm.import_rows where workspace_id = $1 and import_id = $2 and repeat_of is not null`,
    [tenant.id, created.id],
  )
  t.same(marks.rows, [3, 5])

  // The same staged file again, for real, without the email column: nothing repeats any more.
  await db.query(
    `update crm.imports set status = 'queued', mapping = $3, dry_run = false, last_row_done = 0, created = 0, updated = 0, skipped = 0, failed = 0
      where workspace_id = $1 and id = $2`,
    [tenant.id, created.id, JSON.stringify({ Name: 'first_name' })],
  )
  await db.query('delete from crm.import_errors where workspace_id = $1 and import_id = $2', [tenant.id, created.id])
  t.equal(await processImport(db, job, { batchSize: 3 }), true)
  t.same(await errors(), [])
  const {
    rows: [state],
  } = await db.query(
    `select i.created, i.failed, (select count(*)::int from crm.contacts c where c.workspace_id = i.workspace_id) as contacts
       from crm.imports i where i.workspace_id = $1 and i.id = $2`,
    [tenant.id, created.id],
  )
  t.same(state, { created: 7, failed: 0, contacts: 7 })
})

t.test('records still need an existing workspace, and go with it', async (t) => {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'admin@a.test': 'admin' } })
  const other = await createTenant(url, { members: { 'admin@b.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, url)
  const missing = '00000000-0000-7000-8000-000000000000'
  for (const [table, columns] of [
    ['contacts', `first_name) values ($1, $2, 'x'`],
    ['companies', `name) values ($1, $2, 'x'`],
    ['deals', `name, stage) values ($1, $2, 'x', 'lead'`],
  ]) {
    await t.rejects(
      db.query(`insert into crm.${table} (workspace_id, owner_id, ${columns})`, [missing, admin.id]),
      { code: '23503' },
      `${table}: no row without its workspace (the owner key refuses it)`,
    )
  }
  const {
    rows: [company],
  } = await db.query(`insert into crm.companies (workspace_id, owner_id, name) values ($1, $2, 'C') returning id`, [tenant.id, admin.id])
  await db.query(`insert into crm.contacts (workspace_id, owner_id, first_name, company_id) values ($1, $2, 'A', $3)`, [
    tenant.id,
    admin.id,
    company.id,
  ])
  await db.query(`insert into crm.deals (workspace_id, owner_id, name, company_id) values ($1, $2, 'D', $3)`, [
    tenant.id,
    admin.id,
    company.id,
  ])
  await db.query(`insert into crm.contacts (workspace_id, owner_id, first_name) values ($1, $2, 'B')`, [
    other.id,
    other.members['admin@b.test'].id,
  ])
  await db.query('delete from crm.workspaces where id = $1', [tenant.id])
  const {
    rows: [left],
  } = await db.query(
    `select (select count(*)::int from crm.contacts) as contacts, (select count(*)::int from crm.companies) as companies,
            (select count(*)::int from crm.deals) as deals, (select count(*)::int from crm.events where workspace_id = $1) as events`,
    [tenant.id],
  )
  t.same(
    left,
    { contacts: 1, companies: 0, deals: 0, events: 0 },
    "deleting a workspace deletes its records (and their events), nobody else's",
  )
})
