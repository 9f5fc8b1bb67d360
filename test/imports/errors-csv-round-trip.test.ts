// A corrected errors.csv imports like the original rows (docs/api.md section 6, "Round trip"): a file
// with bad rows is imported, its errors.csv taken, the bad cells fixed and nothing else touched (its
// `row` and `error` columns kept, as a user uploads it), and that file imported with the mapping of
// the first import. The records then equal those of a clean import of the corrected file into another
// workspace: phones behind the formula guard, formula-looking names, custom fields.
import { parse } from 'csv-parse/sync'
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { importCsv } from './helpers.ts'

const HEADER = ['first_name', 'last_name', 'email', 'phone', 'custom_fields', 'custom_fields.region']
/** The file's rows; a bad cell is [what the file has, what the user corrects it to]. */
const ROWS: (string | [string, string])[][] = [
  ['Plain', 'Person', 'plain@example.com', '555 0100', '{"tier": "gold"}', 'emea'],
  ['=SUM(1)', '-minus', ['not an email', 'sum@example.com'], '+1 555 0900', '{"tier": "gold", "score": 3}', 'amer'],
  ['@at', "'=already quoted", 'at@example.com', '+44 20 7946 0000', ['not json', '{"note": "=1+1, \\"quoted\\""}'], ''],
  ['+plus', '\'+"quoted"', ['@nope', 'plus@example.com'], '-12', '{}', '=region'],
  ['Good', 'Too', 'good@example.com', '+1 (555) 010-0200', '', 'apac'],
]

/** The user's mapping, given to every import (errors.csv's row and error columns it does not name are ignored). */
const MAPPING = Object.fromEntries(HEADER.map((column) => [column, column]))

/** RFC 4180, every cell quoted: what a script or an editor that rewrites the file writes. */
const csvLine = (cells: string[]) => cells.map((cell) => `"${cell.replaceAll('"', '""')}"`).join(',')
const file = (rows: string[][], header = HEADER) => [header, ...rows].map(csvLine).join('\r\n')
const as = (which: 0 | 1) => ROWS.map((row) => row.map((cell) => (typeof cell === 'string' ? cell : cell[which])))

t.test('a corrected errors.csv imports like the original rows', async (t) => {
  const server = await startTestServer(t, { worker: true })
  const dirty = await createTenant(server.databaseUrl, { members: { 'admin@dirty.test': 'admin' } })
  const clean = await createTenant(server.databaseUrl, { members: { 'admin@clean.test': 'admin' } })
  const [dirtyToken, cleanToken] = [dirty.members['admin@dirty.test'].token, clean.members['admin@clean.test'].token]
  const db = await ownerClient(t, server.databaseUrl)

  const first = await importCsv(server, dirtyToken, 'contacts', file(as(0)), { mapping: MAPPING })
  const badRows = ROWS.flatMap((row, index) => (row.some((cell) => typeof cell !== 'string') ? [index + 1] : []))
  t.same(
    first.job.counts,
    { total: 5, created: 2, updated: 0, skipped: 0, failed: 3, companies_created: 0 },
    JSON.stringify(first.job.errors),
  )

  const errors = await server.request('GET', `/api/contacts/import/${first.upload.id}/errors.csv`, { token: dirtyToken })
  t.equal(errors.status, 200, errors.text)
  const [header, ...lines] = parse(errors.text, { relax_column_count: false }) as string[][]
  t.same(header, [...HEADER, 'row', 'error'])
  t.same(
    lines.map((line) => Number(line[HEADER.length])),
    badRows,
    'one line per bad row, with its number',
  )
  // The user's correction: the bad cells only, every other cell (formula guard included) as downloaded.
  const corrected = lines.map((line) => {
    const row = ROWS[Number(line[HEADER.length]) - 1]
    return line.map((cell, column) =>
      column < HEADER.length && typeof row[column] !== 'string' ? (row[column] as [string, string])[1] : cell,
    )
  })
  const again = await importCsv(server, dirtyToken, 'contacts', file(corrected, header), { mapping: MAPPING })
  t.match(again.upload.suggested_mapping, { row: null, error: null }, 'the row and error columns are not imported')
  t.same(
    again.job.counts,
    { total: 3, created: 3, updated: 0, skipped: 0, failed: 0, companies_created: 0 },
    JSON.stringify(again.job.errors),
  )

  const reference = await importCsv(server, cleanToken, 'contacts', file(as(1)), { mapping: MAPPING })
  t.same(
    reference.job.counts,
    { total: 5, created: 5, updated: 0, skipped: 0, failed: 0, companies_created: 0 },
    JSON.stringify(reference.job.errors),
  )

  const records = async (workspace: string) =>
    (
      await db.query(`select first_name, last_name, email, phone, custom_fields from crm.contacts where workspace_id = $1 order by email`, [
        workspace,
      ])
    ).rows
  const imported = await records(dirty.id)
  t.same(imported, await records(clean.id), 'the same records as a clean import of the corrected file')
  t.match(
    imported.find((contact) => contact.email === 'sum@example.com'),
    { first_name: '=SUM(1)', last_name: '-minus', phone: '+1 555 0900', custom_fields: { tier: 'gold', score: 3, region: 'amer' } },
    'the guarded cells came back as the user wrote them',
  )
})
