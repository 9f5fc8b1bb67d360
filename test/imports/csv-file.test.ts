import { Readable } from 'node:stream'
import t from 'tap'
import {
  CsvFileError,
  type CsvRecord,
  detectDelimiter,
  inspectCsv,
  inspectCsvAsync,
  MAX_COLUMNS,
  MAX_HEADER_CELL_LENGTH,
  MAX_RECORD_LENGTH,
  MAX_RECORD_VALUES,
  readCsvRecords,
  SAMPLE_CELL_LENGTH,
} from '../../src/imports/csv-file.ts'

const csv = (text: string) => Buffer.from(text, 'utf8')

async function collect(records: AsyncIterable<CsvRecord>): Promise<CsvRecord[]> {
  const all: CsvRecord[] = []
  for await (const record of records) all.push(record)
  return all
}

function inspectionError(bytes: Buffer): CsvFileError {
  try {
    inspectCsv(bytes)
  } catch (error) {
    if (error instanceof CsvFileError) return error
    throw error
  }
  throw new Error('inspectCsv accepted the file')
}

async function readingError(input: Buffer | AsyncIterable<Uint8Array>): Promise<{ error: CsvFileError; yielded: CsvRecord[] }> {
  const yielded: CsvRecord[] = []
  try {
    for await (const record of readCsvRecords(input, ',')) yielded.push(record)
  } catch (error) {
    if (error instanceof CsvFileError) return { error, yielded }
    throw error
  }
  throw new Error('readCsvRecords read the whole file')
}

t.test('a leading UTF-8 BOM is dropped from the first column name', async (t) => {
  const inspection = inspectCsv(csv('\uFEFFEmail,Name\nann@example.com,Ann\n'))
  t.same(inspection.columns, ['Email', 'Name'])
  t.same(await collect(readCsvRecords(csv('\uFEFFEmail\nann@example.com\n'), ',')), [{ row: 1, values: ['ann@example.com'] }])
})

t.test('semicolon and tab delimiters are detected from the header', async (t) => {
  const semicolon = inspectCsv(csv('Name;Amount;Stage\r\nBig deal;1000,50;won\r\n'))
  t.equal(semicolon.delimiter, ';')
  t.same(semicolon.sampleRows, [['Big deal', '1000,50', 'won']], 'a comma in a ;-separated value is data')

  const tab = inspectCsv(csv('First Name\tLast Name\tCity\nAnn\tLee\tOslo, Norway\n'))
  t.equal(tab.delimiter, '\t')
  t.same(tab.columns, ['First Name', 'Last Name', 'City'])
  t.same(tab.sampleRows, [['Ann', 'Lee', 'Oslo, Norway']])

  t.same(await collect(readCsvRecords(csv('a;b\n1;2\n'), ';')), [{ row: 1, values: ['1', '2'] }])
})

t.test('delimiter detection', async (t) => {
  t.equal(detectDelimiter(csv('"Name; with semicolons; inside",Email\n')), ',', 'delimiters inside quotes do not count')
  t.equal(detectDelimiter(csv('a;b,c\tno\n')), ',', 'a tie goes to the comma')
  t.equal(detectDelimiter(csv('a;b\tc;d\te\n')), ';', 'a tie between ; and tab goes to ;')
  t.equal(detectDelimiter(csv('Email\nx;y;z\n')), ',', 'only the header line is looked at')
  t.equal(detectDelimiter(csv('\r\n  \na\tb\n')), '\t', 'blank lines before the header are skipped')
  t.equal(detectDelimiter(csv('"multi\nline";b;c\n')), ';', 'a quoted line break does not end the header')
  t.equal(detectDelimiter(csv('')), ',')
})

t.test('a quoted line break does not start a new record', async (t) => {
  const inspection = inspectCsv(csv('Name,Notes\r\nAnn,"first line\r\nsecond line, with comma"\r\nBob,"say ""hi"""\r\n'))
  t.equal(inspection.rowCount, 2)
  t.same(inspection.sampleRows, [
    ['Ann', 'first line\r\nsecond line, with comma'],
    ['Bob', 'say "hi"'],
  ])
})

t.test('CRLF, LF and CR line endings, even mixed, end records', async (t) => {
  const crlf = inspectCsv(csv('a,b\r\n1,2\r\n3,4\r\n'))
  t.equal(crlf.rowCount, 2)
  t.same(
    crlf.sampleRows,
    [
      ['1', '2'],
      ['3', '4'],
    ],
    'no stray \\r is left in the last value',
  )
  const mixed = inspectCsv(csv('a,b\r\n1,2\n3,4\r5,6'))
  t.equal(mixed.rowCount, 3)
  t.same(mixed.sampleRows[2], ['5', '6'], 'a last line without a line break is a record')
})

t.test('header only and blank records', async (t) => {
  const headerOnly = inspectCsv(csv('First Name,Last Name\r\n'))
  t.equal(headerOnly.rowCount, 0)
  t.same(headerOnly.columns, ['First Name', 'Last Name'])
  t.same(headerOnly.sampleRows, [])
  t.equal(inspectCsv(csv('a,b')).rowCount, 0, 'a header without a line break')

  const withBlanks = csv('\r\na,b\r\n1,2\r\n\r\n , \r\n3,4\r\n\r\n')
  const inspection = inspectCsv(withBlanks)
  t.equal(inspection.rowCount, 2, 'empty lines and all-empty records are not data')
  t.same(
    await collect(readCsvRecords(withBlanks, ',')),
    [
      { row: 1, values: ['1', '2'] },
      { row: 4, values: ['3', '4'] },
    ],
    'blank records still take a row number, so numbers match the file',
  )
})

t.test('only five sample rows are kept', async (t) => {
  const lines = ['n', ...Array.from({ length: 12 }, (_, index) => String(index + 1))]
  const inspection = inspectCsv(csv(lines.join('\n')))
  t.equal(inspection.rowCount, 12)
  t.same(inspection.sampleRows, [['1'], ['2'], ['3'], ['4'], ['5']])
})

t.test('short and long rows are kept as they are', async (t) => {
  const inspection = inspectCsv(csv('a,b,c\n1\n1,2,3,4\n'))
  t.equal(inspection.rowCount, 2)
  t.same(inspection.sampleRows, [['1'], ['1', '2', '3', '4']])
})

t.test('quotes inside unquoted values are kept literally', async (t) => {
  t.same(inspectCsv(csv('Height,Note\n5\'11",say "hi" now\n')).sampleRows, [['5\'11"', 'say "hi" now']])
})

t.test('header names: trimmed, empty ones named by position, duplicates refused', async (t) => {
  t.same(inspectCsv(csv(' Email ,,Name,\n')).columns, ['Email', 'column_2', 'Name', 'column_4'])
  const duplicate = inspectionError(csv('Email,Name,Email,Name,Phone\n1,2,3,4,5\n'))
  t.equal(duplicate.code, 'duplicate_columns')
  t.equal(duplicate.row, 0)
  t.match(duplicate.message, /"Email", "Name"/)
  t.equal((await readingError(csv('x,x\n1,2\n'))).error.code, 'duplicate_columns', 'the stream refuses them too')
})

t.test('invalid UTF-8 is refused with the line it is on', async (t) => {
  const latin1 = Buffer.concat([csv('Name,City\nAnn,Oslo\nJos'), Buffer.from([0xe9]), csv(',Paris\n')])
  const error = inspectionError(latin1)
  t.ok(error instanceof Error)
  t.equal(error.name, 'CsvFileError')
  t.equal(error.code, 'invalid_encoding')
  t.match(error.message, /Line 3 /)
  t.match(error.message, /CSV UTF-8/)

  const truncated = inspectionError(Buffer.concat([csv('Name\nJos'), Buffer.from([0xc3])]))
  t.match(truncated.message, /Line 2 /, 'a sequence cut off at the end of the file')

  const utf16 = inspectionError(Buffer.from('\uFEFFName\nAnn\n', 'utf16le'))
  t.equal(utf16.code, 'invalid_encoding')
  t.match(utf16.message, /Line 1 /)

  t.equal(inspectionError(csv('Name\nA\u0000B\n')).code, 'invalid_encoding', 'NUL cannot be stored')

  const workbook = inspectionError(Buffer.concat([Buffer.from('PK\x03\x04', 'latin1'), Buffer.alloc(20, 0x41)]))
  t.equal(workbook.code, 'invalid_encoding')
  t.match(workbook.message, /\.xlsx/)

  t.equal((await readingError(latin1)).error.code, 'invalid_encoding', 'a buffer is checked before streaming')
})

t.test('a stream is checked for UTF-8 as it is read', async (t) => {
  const valid = [csv('Name,City\nRen'), Buffer.from([0xc3]), Buffer.from([0xa9]), csv(',Paris\n')]
  t.same(
    await collect(readCsvRecords(Readable.from(valid), ',')),
    [{ row: 1, values: ['René', 'Paris'] }],
    'a character split between chunks',
  )

  const invalid = await readingError(Readable.from([csv('Name,City\nAnn,Oslo\n'), Buffer.from([0xff, 0x0a])]))
  t.equal(invalid.error.code, 'invalid_encoding')
  t.match(invalid.error.message, /on or after line 3/)

  const cutOff = await readingError(Readable.from([csv('Name\nRen'), Buffer.from([0xc3])]))
  t.equal(cutOff.error.code, 'invalid_encoding', 'a sequence cut off at the end of the stream')

  const nul = await readingError(Readable.from([csv('Name\nA\u0000B\n')]))
  t.equal(nul.error.code, 'invalid_encoding')
})

t.test('empty files', async (t) => {
  for (const text of ['', '\uFEFF', '\r\n\r\n', ' , \n,,\n']) {
    const error = inspectionError(csv(text))
    t.equal(error.code, 'empty_file', JSON.stringify(text))
    t.equal(error.row, undefined)
  }
  t.same(await collect(readCsvRecords(csv(''), ',')), [], 'nothing to stream')
})

t.test('a quote never closed is malformed, with the row it starts on', async (t) => {
  const error = inspectionError(csv('Name,Notes\nAnn,fine\nBob,"never closed\nCid,ok\n'))
  t.equal(error.code, 'malformed_csv')
  t.equal(error.row, 2)
  t.match(error.message, /^Row 2 is not valid CSV: a quoted value is never closed/)

  const inHeader = inspectionError(csv('"Name,Notes\nAnn,fine\n'))
  t.equal(inHeader.row, 0)
  t.match(inHeader.message, /^The header row is not valid CSV/)

  const stream = await readingError(csv('Name,Notes\n\nAnn,fine\nBob,"never closed\n'))
  t.equal(stream.error.code, 'malformed_csv')
  t.equal(stream.error.row, 3, 'the row number counts the blank record, like the rows yielded')
})

t.test('readCsvRecords numbers records, not lines, around a quoted line break', async (t) => {
  const text = 'Name,Notes\r\nAnn,one\r\nBob,"two\r\nlines"\r\nCid,three\r\n'
  t.same(await collect(readCsvRecords(csv(text), ',')), [
    { row: 1, values: ['Ann', 'one'] },
    { row: 2, values: ['Bob', 'two\r\nlines'] },
    { row: 3, values: ['Cid', 'three'] },
  ])
  const bytes = csv(text)
  const byteByByte = Readable.from(Array.from(bytes, (byte) => Buffer.from([byte])))
  t.same(
    (await collect(readCsvRecords(byteByByte, ','))).map((record) => record.row),
    [1, 2, 3],
    'the same when every byte is its own chunk',
  )
})

t.test('readCsvRecords streams a large file and can be stopped early', async (t) => {
  const rows = 20_000
  const lines = ['id,notes']
  for (let index = 1; index <= rows; index++) lines.push(`${index},"note ${index}\nsecond line, ${index}"`)
  const bytes = csv(lines.join('\r\n'))
  t.ok(bytes.length > 64 * 1024 * 4, 'spans several chunks')
  t.equal(inspectCsv(bytes).rowCount, rows)

  let count = 0
  for await (const record of readCsvRecords(bytes, ',')) {
    count++
    if (record.row !== Number(record.values[0]) || record.values[1] !== `note ${record.row}\nsecond line, ${record.row}`) {
      t.fail(`row ${record.row} is ${JSON.stringify(record.values)}`)
      break
    }
  }
  t.equal(count, rows)

  const firstThree: number[] = []
  for await (const record of readCsvRecords(bytes, ',')) {
    firstThree.push(record.row)
    if (firstThree.length === 3) break
  }
  t.same(firstThree, [1, 2, 3])
})

t.test('errors other than CSV errors pass through unchanged', async (t) => {
  async function* failing(): AsyncGenerator<Uint8Array> {
    yield csv('a\n1\n')
    throw new Error('socket closed')
  }
  await t.rejects(collect(readCsvRecords(failing(), ',')), { message: 'socket closed' })
})

t.test('inspectCsvAsync gives the same answers and errors as inspectCsv', async (t) => {
  const inputs = [
    csv('\uFEFFName;Notes\r\nAnn;"two\r\nlines"\r\n\r\nBob;x\r\n'),
    csv(['n', ...Array.from({ length: 9 }, (_, index) => String(index))].join('\n')),
    csv('Name\r\n'),
    csv(''),
    csv('a,a\n'),
    csv('a,b\n1,"open\n'),
    Buffer.from([0x61, 0x0a, 0xff]),
  ]
  for (const bytes of inputs) {
    const label = JSON.stringify(bytes.toString('latin1'))
    let expected: unknown
    try {
      expected = inspectCsv(bytes)
    } catch (error) {
      expected = { code: (error as CsvFileError).code, message: (error as Error).message, row: (error as CsvFileError).row }
    }
    let actual: unknown
    try {
      actual = await inspectCsvAsync(bytes)
    } catch (error) {
      actual = { code: (error as CsvFileError).code, message: (error as Error).message, row: (error as CsvFileError).row }
    }
    t.same(actual, expected, label)
  }
})

t.test('a header cell longer than its cap and a header wider than its cap are refused', async (t) => {
  const longest = 'n'.repeat(MAX_HEADER_CELL_LENGTH)
  t.same(inspectCsv(csv(`${longest},b\n1,2\n`)).columns, [longest, 'b'], 'a cell at the cap is a column name')
  const tooLong = inspectionError(csv(`a${'7'.repeat(60_000)}x,b\n1,2\n`))
  t.equal(tooLong.code, 'header_cell_too_long')
  t.equal(tooLong.row, 0)
  t.match(tooLong.message, /Column 1 of the header is 60002 characters long/)
  t.equal(inspectionError(csv(`a,${'b'.repeat(MAX_HEADER_CELL_LENGTH + 1)}\n`)).code, 'header_cell_too_long')

  const names = (count: number) => Array.from({ length: count }, (_, index) => `c${index}`).join(',')
  t.equal(inspectCsv(csv(`${names(MAX_COLUMNS)}\n`)).columns.length, MAX_COLUMNS, 'a header at the cap')
  const tooWide = inspectionError(csv(`${names(20_000)}\n`))
  t.equal(tooWide.code, 'too_many_columns')
  t.match(tooWide.message, /^The header row has more than 510 values/, 'the parse stopped at the cap on any record')
  t.match(inspectionError(csv(`${names(MAX_COLUMNS + 1)}\n`)).message, /501 columns; at most 500/)
  await t.rejects(inspectCsvAsync(csv(`${names(MAX_COLUMNS + 1)}\n`)), { code: 'too_many_columns' })
})

t.test('the preview cuts cells and rows to their caps, never inside a surrogate pair', async (t) => {
  const emoji = `${'y'.repeat(SAMPLE_CELL_LENGTH - 1)}😀z`
  const big = 'x'.repeat(MAX_RECORD_LENGTH - 1000)
  const wide = Array.from({ length: MAX_RECORD_VALUES }, () => 'v').join(',')
  for (const inspect of [inspectCsv, inspectCsvAsync]) {
    const inspection = await inspect(csv(`a,b\n${big},${emoji}\n${wide}\n`))
    t.same(inspection.sampleRows[0], ['x'.repeat(SAMPLE_CELL_LENGTH), 'y'.repeat(SAMPLE_CELL_LENGTH - 1)])
    t.ok(inspection.sampleRows[0][1].isWellFormed())
    t.equal(inspection.sampleRows[1].length, MAX_COLUMNS, 'a row wider than the cap shows the cap')
  }
  const rows = await collect(readCsvRecords(csv(`a,b\n${big},c\n`), ','))
  t.equal(rows[0].values[0].length, big.length, 'the import itself reads whole cells')
})
