// The CSV header that froze an API process (a cell of `a` + 60,000 digits + `x`, which the old
// trailing-digit pattern took quadratic time over), a header of 20,000 columns, and a cell of
// nearly a row's length: the first two are 422 with their codes, the third comes back cut to 200
// characters in the preview (a 5 MB cell is past a row's length: 422, bounded-csv-upload.test.ts).
// The time the worst cells cost is measured in bench/request-data.ts, not here.
import t from 'tap'
import { MAX_COLUMNS, MAX_RECORD_LENGTH, MAX_RECORD_VALUES, SAMPLE_CELL_LENGTH } from '../../src/imports/csv-file.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { upload } from '../imports/helpers.ts'

const server = await startTestServer(t)
const tenant = await createTenant(server.databaseUrl, { members: { 'ada@caps.test': 'admin' } })
const token = tenant.members['ada@caps.test'].token

t.test('a header cell of a + 60,000 digits + x is 422 header_cell_too_long', async (t) => {
  const response = await upload(server, token, 'contacts', `a${'7'.repeat(60_000)}x,Email\n1,ann@example.com\n`)
  t.equal(response.status, 422, response.text.slice(0, 300))
  t.equal(response.body.errors[0].pointer, '/file')
  t.equal(response.body.errors[0].code, 'header_cell_too_long')
})

t.test('a header of 20,000 columns is 422 too_many_columns', async (t) => {
  const header = Array.from({ length: 20_000 }, (_, index) => `c${index}`).join(',')
  const response = await upload(server, token, 'contacts', `${header}\n1\n`)
  t.equal(response.status, 422, response.text.slice(0, 300))
  t.equal(response.body.errors[0].code, 'too_many_columns')
})

t.test('a cell of nearly the length of a row comes back cut in sample_rows, and a wide row cut to the column cap', async (t) => {
  const wide = Array.from({ length: MAX_RECORD_VALUES }, () => 'v').join(',')
  const long = 'n'.repeat(MAX_RECORD_LENGTH - 100)
  const response = await upload(server, token, 'contacts', `Email,Notes\nann@example.com,${long}\n${wide}\n`)
  t.equal(response.status, 201, response.text.slice(0, 300))
  t.same(response.body.data.sample_rows[0], ['ann@example.com', 'n'.repeat(SAMPLE_CELL_LENGTH)])
  t.equal(response.body.data.sample_rows[1].length, MAX_COLUMNS)
  t.ok(response.text.length < 200_000, `the answer is ${response.text.length} characters`)
})
