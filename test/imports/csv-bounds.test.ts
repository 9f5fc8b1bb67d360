// The bounds on a CSV record (MAX_RECORD_VALUES values, MAX_RECORD_LENGTH characters) change
// nothing for a file within them and refuse exactly the first record past them, compared with
// plain csv-parse over generated files: every shape of quoting the lenient reader accepts, records
// at and around both bounds, quotes left open. The reader is the job's (readCsvRecords, in chunks);
// the upload's inspection uses the same options and is held to the same answers in csv-file.test.ts.
import assert from 'node:assert/strict'
import { type Options, parse as parsePlain } from 'csv-parse/sync'
import fc from 'fast-check'
import t from 'tap'
import { CsvFileError, type CsvRecord, MAX_RECORD_LENGTH, MAX_RECORD_VALUES, readCsvRecords } from '../../src/imports/csv-file.ts'

// The reader's options without its bounds: the reference.
const PLAIN_OPTIONS: Options = {
  delimiter: ',',
  bom: true,
  relax_column_count: true,
  relax_quotes: true,
  record_delimiter: ['\r\n', '\n', '\r'],
  encoding: 'utf8',
}

type Expected =
  | { kind: 'records'; records: CsvRecord[] }
  | { kind: 'over'; row: number; values: boolean; length: boolean }
  | { kind: 'malformed'; row: number }

const isBlank = (values: string[]) => values.every((value) => value.trim() === '')

/** What plain csv-parse makes of the file, numbered as the reader numbers records. */
function expectedOf(text: string): Expected {
  const raw: string[][] = []
  let failed = false
  try {
    parsePlain(text, {
      ...PLAIN_OPTIONS,
      on_record: (values: string[]) => {
        raw.push(values)
        return null
      },
    })
  } catch {
    failed = true
  }
  let headerSeen = false
  let lastRow = 0
  const records: CsvRecord[] = []
  for (const values of raw) {
    const row = headerSeen ? lastRow + 1 : 0
    const length = values.reduce((sum, value) => sum + value.length, 0)
    if (values.length > MAX_RECORD_VALUES || length > MAX_RECORD_LENGTH)
      return { kind: 'over', row, values: values.length > MAX_RECORD_VALUES, length: length > MAX_RECORD_LENGTH }
    if (!headerSeen) {
      headerSeen = !isBlank(values)
      continue
    }
    lastRow++
    if (!isBlank(values)) records.push({ row: lastRow, values })
  }
  return failed ? { kind: 'malformed', row: headerSeen ? lastRow + 1 : 0 } : { kind: 'records', records }
}

async function boundedOf(bytes: Buffer): Promise<{ records: CsvRecord[] } | { error: CsvFileError }> {
  const records: CsvRecord[] = []
  try {
    for await (const record of readCsvRecords(bytes, ',')) records.push(record)
  } catch (error) {
    if (error instanceof CsvFileError) return { error }
    throw error
  }
  return { records }
}

const quoted = (value: string) => `"${value.replaceAll('"', '""')}"`
const short = fc.string({ unit: fc.constantFrom('a', 'é', ' ', ',', '"', '\n', '\r', '😀'), maxLength: 6 })
const field = fc.tuple(short, fc.boolean()).map(([value, quote]) => (quote || /[",\r\n]/.test(value) ? quoted(value) : value))
const ordinaryRecord = fc.array(field, { minLength: 1, maxLength: 8 }).map((fields) => fields.join(','))
// Widths at the cap and past it, empty or quoted empty values as in the finding.
const wideRecord = fc
  .tuple(fc.integer({ min: MAX_RECORD_VALUES - 2, max: MAX_RECORD_VALUES + 90 }), fc.constantFrom('', '""', 'a'))
  .map(([width, value]) => Array(width).fill(value).join(','))
// Lengths at the bound and just past it, in one value or split over three, quoted or not.
const longRecord = fc.tuple(fc.integer({ min: -2, max: 2 }), fc.integer({ min: 1, max: 3 }), fc.boolean()).map(([over, parts, quote]) => {
  const total = MAX_RECORD_LENGTH + over
  const sizes = Array.from({ length: parts }, (_, index) => Math.floor(total / parts) + (index < total % parts ? 1 : 0))
  return sizes.map((size) => (quote ? quoted('x'.repeat(size)) : 'x'.repeat(size))).join(',')
})
// Bytes a spreadsheet would never write: quotes in odd places, a quote left open.
const garbage = fc.string({ unit: fc.constantFrom('a', ',', '"', '\n', '\r', ' '), maxLength: 12 })
const recordDelimiter = fc.constantFrom('\n', '\r\n', '\r')

const file = fc
  .tuple(
    fc.integer({ min: 1, max: 5 }),
    fc.array(
      fc.tuple(
        fc.oneof({ weight: 8, arbitrary: ordinaryRecord }, { weight: 2, arbitrary: garbage }, wideRecord, longRecord),
        recordDelimiter,
      ),
      { maxLength: 6 },
    ),
    fc.boolean(),
  )
  .map(([width, records, blankFirst]) => {
    const header = Array.from({ length: width }, (_, index) => `c${index + 1}`).join(',')
    return (blankFirst ? ',,\n' : '') + `${header}\n` + records.map(([record, end]) => record + end).join('')
  })

t.test('the bounded reader gives plain csv-parse records, and refuses only a record over a bound', async (t) => {
  let refused = 0
  let accepted = 0
  await fc.assert(
    fc.asyncProperty(file, async (text) => {
      const bytes = Buffer.from(text, 'utf8')
      const expected = expectedOf(text)
      const bounded = await boundedOf(bytes)
      if ('records' in bounded) {
        accepted++
        assert.deepEqual(expected, { kind: 'records', records: bounded.records })
        return
      }
      refused++
      const { code, row, message } = bounded.error
      if (expected.kind === 'over') {
        assert.equal(row, expected.row, 'the first record over a bound is the one named')
        assert.ok(code === 'too_many_columns' ? expected.values : code === 'record_too_long' && expected.length, `${code}: ${message}`)
      } else {
        assert.equal(expected.kind, 'malformed', `refused with ${code}: ${message}`)
        assert.equal(row, expected.row)
        // A quote left open makes the rest of the file one value, which may pass the length first.
        assert.ok(['malformed_csv', 'record_too_long'].includes(code), code)
      }
    }),
    { numRuns: 60 },
  )
  t.ok(refused > 0 && accepted > 0, `both outcomes were generated (${accepted} accepted, ${refused} refused)`)
})
