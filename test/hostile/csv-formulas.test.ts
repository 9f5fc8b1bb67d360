// CSV cells a spreadsheet would run as formulas (docs/api.md section 6): a text cell that begins with
// =, +, -, @, a tab or a carriage return gets a leading ', in exports and in an import's
// errors.csv; numbers, dates and NDJSON are written as stored.
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { importCsv } from '../imports/helpers.ts'

const FORMULAS = ['=HYPERLINK("http://evil.example","x")', '+1+1', '-2+3', '@SUM(A1)', '\tTAB', '\rCR']
/** Each formula as its guarded CSV cell: the leading ', then RFC 4180 quoting where needed. */
const GUARDED = ['"\'=HYPERLINK(""http://evil.example"",""x"")"', "'+1+1", "'-2+3", "'@SUM(A1)", "'\tTAB", '"\'\rCR"']

const server = await startTestServer(t, { worker: true })
const tenant = await createTenant(server.databaseUrl, { members: { 'admin@formula.test': 'admin' } })
const token = tenant.members['admin@formula.test'].token

t.test('exports guard formula text cells and keep numbers, dates and NDJSON as stored', async (t) => {
  for (const [index, name] of FORMULAS.entries()) {
    const created = await server.request('POST', '/api/deals', {
      token,
      body: { name, amount: '5.00', close_date: '2026-12-31', custom_fields: { note: name } },
    })
    t.equal(created.status, 201, created.text)
    if (index === 0) {
      // No API value makes a number negative; the throwaway database drops the rule to show a
      // numeric -5 is not taken for a formula.
      const db = await ownerClient(t, server.databaseUrl)
      await db.query('alter table crm.deals drop constraint deals_amount_check')
      await db.query('update crm.deals set amount = -5 where id = $1', [created.body.data.id])
    }
  }
  const csv = await server.request('POST', '/api/deals/export', {
    token,
    body: { fields: ['name', 'amount', 'close_date'], sort: 'created_at' },
  })
  t.equal(csv.status, 200)
  const rows = csv.text.split('\r\n').slice(1, -1)
  t.same(
    rows,
    GUARDED.map((cell, index) => `${cell},${index === 0 ? '-5.00' : '5.00'},2026-12-31`),
    'text cells guarded, numbers and dates as stored',
  )

  const ndjson = await server.request('POST', '/api/deals/export', {
    token,
    body: { format: 'ndjson', fields: ['name', 'custom_fields'], sort: 'created_at' },
  })
  const records = ndjson.text
    .trim()
    .split('\n')
    .map((line) => JSON.parse(line))
  t.same(
    records.map((record) => record.name),
    FORMULAS,
    'NDJSON as stored',
  )
  t.same(
    records.map((record) => record.custom_fields.note),
    FORMULAS,
  )
})

t.test("an import's errors.csv guards the file's cells and its header", async (t) => {
  const quoted = (cell: string) => `"${cell.replace(/"/g, '""')}"`
  const file = ['=Header,Email', ...FORMULAS.map((cell) => `${quoted(cell)},not-an-email`)].join('\r\n')
  const { upload, job } = await importCsv(server, token, 'contacts', file, { mapping: { '=Header': 'first_name', Email: 'email' } })
  t.equal(job.counts.failed, FORMULAS.length, JSON.stringify(job.errors))
  const errors = await server.request('GET', `/api/contacts/import/${upload.id}/errors.csv`, { token })
  t.equal(errors.status, 200)
  const lines = errors.text.split('\r\n')
  t.equal(lines[0], "'=Header,Email,row,error", 'the header is guarded too')
  for (const [index, cell] of GUARDED.entries()) {
    t.ok(
      lines.some((line) => line.startsWith(`${cell},not-an-email,${index + 1},`)),
      `row ${index + 1} starts with ${JSON.stringify(cell)}`,
    )
  }
})
