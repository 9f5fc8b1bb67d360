// The import job end to end: upload over HTTP, the worker lands the rows, the job reports.
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { fixture, importCsv } from './helpers.ts'

t.test('the four sample files import as they are, with the suggested mapping', async (t) => {
  const server = await startTestServer(t, { worker: true })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin', 'bob@a.test': 'member' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, server.databaseUrl)
  t.teardown(async () => {
    const { rows } = await db
      .query(`select task_identifier, attempts, last_error from graphile_worker.jobs where last_error is not null`)
      .catch(() => ({ rows: [] as unknown[] }))
    if (rows.length) console.error('# failing jobs', JSON.stringify(rows, null, 1).slice(0, 3000))
  })

  const customers = await importCsv(server, admin.token, 'contacts', fixture('customers-100.csv'))
  t.equal(customers.upload.row_count, 100)
  t.equal(customers.job.status, 'completed', JSON.stringify(customers.job.errors.slice(0, 3)))
  t.same(customers.job.counts, {
    total: 100,
    created: 100,
    updated: 0,
    skipped: 0,
    failed: 0,
    companies_created: customers.job.counts.companies_created,
  })
  t.ok(customers.job.counts.companies_created > 90, 'companies are created from the Company column')

  const {
    rows: [linked],
  } = await db.query(
    `select c.first_name, c.email, co.name as company from crm.contacts c join crm.companies co on co.workspace_id = c.workspace_id and co.id = c.company_id
      where c.workspace_id = $1 and c.email = 'zunigavanessa@smith.info'`,
    [tenant.id],
  )
  t.same(linked, { first_name: 'Sheryl', email: 'zunigavanessa@smith.info', company: 'Rasmussen Group' })
  const {
    rows: [quoted],
  } = await db.query(`select count(*)::int as n from crm.companies where workspace_id = $1 and name = 'Dominguez, Mcmillan and Donovan'`, [
    tenant.id,
  ])
  t.equal(quoted.n, 1, 'a quoted comma stays inside the company name')

  const {
    rows: [events],
  } = await db.query(
    `select count(*)::int as n, count(*) filter (where actor ->> 'via' = 'import' and actor ->> 'id' = $2)::int as via_import
       from crm.events where workspace_id = $1 and event = 'contact.created'`,
    [tenant.id, admin.id],
  )
  t.same(events, { n: 100, via_import: 100 }, 'every landed row emitted its event with actor.via = import')

  for (const [file, type] of [
    ['people-100.csv', 'contacts'],
    ['leads-100.csv', 'contacts'],
    ['organizations-100.csv', 'companies'],
  ]) {
    const result = await importCsv(server, admin.token, type, fixture(file))
    t.equal(result.job.status, 'completed', file)
    t.equal(result.job.counts.created + result.job.counts.failed, 100, `${file}: ${JSON.stringify(result.job.errors.slice(0, 3))}`)
    t.equal(result.job.counts.failed, 0, `${file} lands every row`)
  }
  const {
    rows: [org],
  } = await db.query(`select count(*)::int as n from crm.companies where workspace_id = $1 and name = 'Mckinney, Riley and Day'`, [
    tenant.id,
  ])
  t.ok(org.n >= 1, 'organization names with commas are kept')
})
