// Import landing: repeats are marked in linear time whatever the statistics of crm.import_rows say
// (crm.mark_import_repeats, sql/definitions/50_imports_and_exports.sql), and ids are version 7 UUIDs in time order
// (crm.uuid_v7, sql/definitions/01_ids.*.sql). And the worker's COPY lines of staged cells (built in
// one pass) carry every value exactly.
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { from as copyFrom } from 'pg-copy-streams'
import t from 'tap'
import { cellsField } from '../../src/imports/process-import.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'

t.test('repeats of a large file are marked quickly even when the statistics say import_rows is empty', async (t) => {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, url)
  const {
    rows: [created],
  } = await db.query(
    `insert into crm.imports (workspace_id, user_id, record_type, file_name, file_bytes, file_size, delimiter, columns, row_count, sample_rows, suggested_mapping, status, mapping, mode, match_on, dry_run)
     values ($1, $2, 'contacts', 'f.csv', '\\x00', 1, ',', '{Email}', 20000, '[]', '{}', 'queued', '{"Email": "email"}', 'create', 'email', false) returning id`,
    [tenant.id, admin.id],
  )
  // What a database looks like after imports completed: autovacuum last saw the table empty.
  await db.query('analyze crm.import_rows')
  // 20,000 rows; every 100th repeats the row 50 before it (in another case, with spaces).
  await db.query(
    `insert into crm.import_rows (workspace_id, import_id, row, user_id, cells)
     select $1, $2, g, $3, array[case when g % 100 = 0 then ' A' || (g - 50) || '@EXAMPLE.com ' else 'a' || g || '@example.com' end]
       from generate_series(1, 20000) g`,
    [tenant.id, created.id, admin.id],
  )
  const started = performance.now()
  const {
    rows: [{ marked }],
  } = await db.query('select crm.mark_import_repeats($1, $2, $3, $4) as marked', [tenant.id, created.id, 'email', 1])
  const seconds = (performance.now() - started) / 1000
  t.equal(marked, 200)
  t.ok(seconds < 10, `marked in ${seconds.toFixed(2)} s (a nested loop over the file took minutes)`)
  const {
    rows: [check],
  } = await db.query(
    `select count(*)::int as marks, bool_and(repeat_of = row - 50 and row % 100 = 0) as right_rows
       from crm.import_rows where workspace_id = $1 and import_id = $2 and repeat_of is not null`,
    [tenant.id, created.id],
  )
  t.same(check, { marks: 200, right_rows: true })
})

t.test('ids are version 7 UUIDs in time order', async (t) => {
  const url = await createTestDatabase(t)
  const db = await ownerClient(t, url)
  const { rows } = await db.query(`select crm.uuid_v7()::text as id from generate_series(1, 1000)`)
  const ids = rows.map((row) => row.id as string)
  t.ok(
    ids.every((id) => /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(id)),
    'version 7, RFC 9562 variant',
  )
  t.equal(new Set(ids).size, ids.length, 'all different')
  const {
    rows: [{ now_ms: nowMs }],
  } = await db.query(`select (extract(epoch from clock_timestamp()) * 1000)::bigint::text as now_ms`)
  const millis = Number.parseInt(ids[0].replaceAll('-', '').slice(0, 12), 16)
  t.ok(Math.abs(Number(nowMs) - millis) < 60_000, 'the first 48 bits are the time in milliseconds')
  const prefixes = ids.map((id) => id.slice(0, 13))
  t.same(prefixes, [...prefixes].sort(), 'in time order')
})

t.test('staged cells survive COPY exactly, whatever they hold', async (t) => {
  const url = await createTestDatabase(t)
  const db = await ownerClient(t, url)
  const records = [
    [
      'plain',
      '',
      ' spaced ',
      'a,b',
      'say "hi"',
      'back\\slash',
      '\\"',
      '""',
      'NULL',
      '{}',
      '{"a","b"}',
      'multi\nline\r\nend',
      'Zürich ✓',
      "O'Neil, Jr.",
    ],
    [],
    [''],
    ['"'],
  ]
  await db.query('create temp table cells (row integer, cells text[])')
  const lines = records.map((values, index) => `${index},${cellsField(values)}\n`).join('')
  await pipeline(Readable.from([lines]), db.query(copyFrom('copy cells (row, cells) from stdin with (format csv)')))
  const { rows } = await db.query('select cells from cells order by row')
  t.same(
    rows.map((row) => row.cells),
    records,
  )
})
