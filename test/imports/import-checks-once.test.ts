// An import evaluates the target table's CHECK constraints once per row (src/imports/land-batch.ts):
// a batch lands without the import's own pass over them (crm.import_check_constraints), and only a
// batch a constraint refuses is rolled back, passed over to report each broken row, and landed
// again; the rest of that run then checks first. Whatever the file, the outcome is exactly what
// checking every row first gives: each broken row reported with its field, every other row landed
// with its event, and no company created for a broken row's company_name.
import fc from 'fast-check'
import t from 'tap'
import { processImport } from '../../src/imports/process-import.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { upload, waitForImport } from './helpers.ts'

const BATCH_SIZE = 4

type Row = { longName: boolean; badEmail: boolean; badPhone: boolean; company: string }

// Each value broken one time in twelve: most batches clean, some with one or more broken rows.
const rarelyBroken = fc.integer({ min: 0, max: 11 }).map((draw) => draw === 0)
const rowArbitrary = fc.record({
  longName: rarelyBroken,
  badEmail: rarelyBroken,
  badPhone: rarelyBroken,
  company: fc.constantFrom('Acme', 'Beta', 'Gamma', 'Delta'),
})

/** Every third row names a company of its own, so a broken row's company_name may name one nobody else does. */
const companyOf = (row: Row, number: number) => `${row.company}${number % 3 === 0 ? ` ${number}` : ''}`

function csvOf(rows: Row[]): string {
  const lines = ['First Name,Last Name,Email,Phone,Company']
  rows.forEach((row, index) => {
    const number = index + 1
    lines.push(
      [
        row.longName ? 'x'.repeat(101) : `First${number}`,
        `Last${number}`,
        row.badEmail ? `not an email ${number}` : `person${number}@example.com`,
        row.badPhone ? 'call me maybe' : '+1 555 0100',
        companyOf(row, number),
      ].join(','),
    )
  })
  return lines.join('\n') + '\n'
}

/** The [row, field] problems checking every row first reports, in report order. */
function expectedProblems(rows: Row[]): [number, string][] {
  const problems: [number, string][] = []
  rows.forEach((row, index) => {
    // crm.import_check_constraints reports a row's broken constraints by constraint name.
    const broken: [string, boolean][] = [
      ['email', row.badEmail],
      ['first_name', row.longName],
      ['phone', row.badPhone],
    ]
    for (const [field, isBroken] of broken) if (isBroken) problems.push([index + 1, field])
  })
  return problems
}

const isBroken = (row: Row) => row.longName || row.badEmail || row.badPhone

t.test('every broken row is reported and nothing of it lands, however bad rows fall across batches', async (t) => {
  const server = await startTestServer(t, { worker: false })
  const db = await ownerClient(t, server.databaseUrl)
  let tenantNumber = 0
  await fc.assert(
    fc.asyncProperty(fc.array(rowArbitrary, { minLength: 1, maxLength: 14 }), async (rows) => {
      // A workspace and a member of its own per run (a user's token reaches their first workspace).
      const email = `admin${++tenantNumber}@a.test`
      const tenant = await createTenant(server.databaseUrl, { members: { [email]: 'admin' } })
      const admin = tenant.members[email]
      const uploaded = await upload(server, admin.token, 'contacts', csvOf(rows))
      const id = uploaded.body.data.id
      const started = await server.request('POST', `/api/contacts/import/${id}`, { token: admin.token, body: {} })
      if (started.status !== 202) throw new Error(`start answered ${started.status}: ${started.text}`)

      // The job on a client that counts the import's own passes over the constraints.
      let passes = 0
      const counting = Object.assign(Object.create(db), {
        query: (text: unknown, values?: unknown[]) => {
          if (typeof text === 'string' && text.includes('crm.import_check_constraints')) passes++
          return (db.query as (text: unknown, values?: unknown[]) => Promise<unknown>)(text, values)
        },
      })
      t.equal(await processImport(counting, { workspace_id: tenant.id, import_id: id }, { batchSize: BATCH_SIZE }), true)
      const job = await waitForImport(server, admin.token, 'contacts', id)

      const clean = rows.filter((row) => !isBroken(row))
      const cleanCompanies = new Set(rows.flatMap((row, index) => (isBroken(row) ? [] : [companyOf(row, index + 1)])))
      t.same(
        job.errors.map((error: { row: number; field: string }) => [error.row, error.field]),
        expectedProblems(rows),
        'each broken row reported with its fields',
      )
      t.same(job.counts, {
        total: rows.length,
        created: clean.length,
        updated: 0,
        skipped: 0,
        failed: rows.length - clean.length,
        companies_created: cleanCompanies.size,
      })
      const {
        rows: [landed],
      } = await db.query(
        `select (select coalesce(array_agg(c.last_name order by c.last_name), '{}') from crm.contacts c where c.workspace_id = $1) as contacts,
                (select coalesce(array_agg(c.name order by c.name), '{}') from crm.companies c where c.workspace_id = $1) as companies,
                (select count(*)::int from crm.events e where e.workspace_id = $1 and e.event = 'contact.created') as contact_events,
                (select count(*)::int from crm.events e where e.workspace_id = $1 and e.event = 'company.created') as company_events`,
        [tenant.id],
      )
      t.same(landed, {
        contacts: rows.flatMap((row, index) => (isBroken(row) ? [] : [`Last${index + 1}`])).sort(),
        companies: [...cleanCompanies].sort(),
        contact_events: clean.length,
        company_events: cleanCompanies.size,
      })

      // A clean batch is checked by the constraints alone; the first refused batch runs the pass,
      // and so does every batch after it.
      const firstBroken = rows.findIndex(isBroken)
      const batches = Math.ceil(rows.length / BATCH_SIZE)
      const expectedPasses = firstBroken === -1 ? 0 : batches - Math.floor(firstBroken / BATCH_SIZE)
      t.equal(passes, expectedPasses, 'passes over the constraints')
    }),
    { numRuns: 15 },
  )
})
