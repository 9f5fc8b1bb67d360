// Reading uploaded CSV files: the upload step inspects the whole file once (delimiter, header,
// record count, a preview) and the import job later streams the records again with the delimiter
// found here. Both go through the same parser options and the same record numbering, so a row
// number in an import error points at the same record the preview counted.
//
// Choices the API contract leaves open:
// - Only UTF-8 is accepted (a leading BOM is dropped). Files containing NUL bytes are refused too:
//   they are UTF-16 or binary in practice, and PostgreSQL text cannot store NUL anyway.
// - The header is the first non-blank record. Header names are trimmed; an empty one is named
//   `column_<n>` (n = 1-based position). Two columns with the same name are refused with
//   `duplicate_columns`, since a mapping is keyed by column name and invented names would not
//   match what the user sees in the file. A header cell longer than MAX_HEADER_CELL_LENGTH or a
//   header of more than MAX_COLUMNS columns is refused (`header_cell_too_long`, `too_many_columns`):
//   no spreadsheet needs more, and every later step (mapping, errors.csv) works per column name.
// - Every record is bounded while it is parsed, not after: at most MAX_RECORD_VALUES values
//   (`too_many_columns`) and MAX_RECORD_LENGTH characters of values (`record_too_long`), naming the
//   row. A line of 40 MiB of commas otherwise became an array of 40 million empty strings before
//   any check saw it (2.3 GB in the API process). See parserOptions for how.
// - The preview (`sampleRows`) holds at most MAX_COLUMNS values per row, each cut to
//   SAMPLE_CELL_LENGTH characters: it shows what a column holds, not whole cells (a 5 MB cell would
//   otherwise come back whole in the answer).
// - A blank record (every value empty or whitespace, e.g. an empty line or `,,,`) is not data: it
//   is not counted in `rowCount`, not sampled and not yielded, but it still advances the row
//   number, so `row` is always the record's position after the header (spreadsheet row - 1).
// - Rows with fewer or more values than the header (up to MAX_RECORD_VALUES) are kept as they are
//   (no padding); the import job reports them per row instead of failing the whole upload.
// - Quotes are read leniently, as spreadsheets do: a quote inside an unquoted value (`5'11"`) or
//   text after a closing quote (`"a"b`) is kept literally. Only a quote never closed is malformed.
// - Line breaks may be CRLF, LF or CR, even mixed within one file.
import { isUtf8 } from 'node:buffer'
import { Readable } from 'node:stream'
import { setImmediate } from 'node:timers/promises'
import { CsvError, type Options, parse as parseStream } from 'csv-parse'
import { parse as parseSync } from 'csv-parse/sync'

export type Delimiter = ',' | ';' | '\t'

export type CsvInspection = {
  delimiter: Delimiter
  columns: string[]
  rowCount: number
  sampleRows: string[][]
}

export type CsvRecord = {
  /** 1-based position of the record after the header; blank records take a number too. */
  row: number
  values: string[]
}

export type CsvFileErrorCode =
  | 'invalid_encoding'
  | 'empty_file'
  | 'malformed_csv'
  | 'duplicate_columns'
  | 'header_cell_too_long'
  | 'too_many_columns'
  | 'record_too_long'

export class CsvFileError extends Error {
  readonly code: CsvFileErrorCode
  /** The data row (as in CsvRecord.row) the problem is in; 0 for the header, absent when unknown. */
  readonly row?: number
  constructor(code: CsvFileErrorCode, message: string, row?: number) {
    super(message)
    this.name = 'CsvFileError'
    this.code = code
    this.row = row
  }
}

export const SAMPLE_ROW_COUNT = 5
export const MAX_HEADER_CELL_LENGTH = 1000
export const MAX_COLUMNS = 500
export const SAMPLE_CELL_LENGTH = 200
/**
 * The most values any record (header, data or blank) may have: the header's cap plus a few, so a
 * full-width file whose rows end in stray delimiters still uploads and the job reports those rows.
 */
export const MAX_RECORD_VALUES = MAX_COLUMNS + 10
/** The most characters a record's values may hold together (delimiters and quotes not counted). */
export const MAX_RECORD_LENGTH = 1024 * 1024
const DELIMITER_PREFERENCE: readonly Delimiter[] = [',', ';', '\t']
// Small enough that stream backpressure works on record batches, not on the whole upload.
const CHUNK_BYTES = 64 * 1024
const UTF8_BOM = Buffer.from([0xef, 0xbb, 0xbf])
const ZIP_SIGNATURE = Buffer.from('PK\x03\x04', 'latin1')
const SAVE_AS_UTF8 = 'Save it as "CSV UTF-8" and upload it again.'

export function inspectCsv(bytes: Buffer): CsvInspection {
  assertUtf8(bytes)
  const text = withoutBom(bytes)
  const delimiter = detectDelimiter(text)
  const numbering = new RecordNumbering()
  let rowCount = 0
  const sampleRows: string[][] = []
  try {
    parseSync(text, {
      ...parserOptions(delimiter),
      // Returning null drops each record after looking at it, so a 50 MiB file is never held as arrays.
      on_record: (values: string[]) => {
        if (numbering.next(values) !== null) {
          rowCount++
          if (sampleRows.length < SAMPLE_ROW_COUNT) sampleRows.push(sampleOf(values))
        }
        return null
      },
    })
  } catch (error) {
    throw numbering.explain(error)
  }
  if (numbering.columns === null) throw emptyFile()
  return { delimiter, columns: numbering.columns, rowCount, sampleRows }
}

/** A record as the preview shows it: at most MAX_COLUMNS values, each cut to SAMPLE_CELL_LENGTH. */
function sampleOf(values: string[]): string[] {
  return values.slice(0, MAX_COLUMNS).map((value) => cutWithoutSplittingPairs(value, SAMPLE_CELL_LENGTH))
}

// A cut between the two halves of a surrogate pair would leave a lone surrogate, which jsonb refuses.
function cutWithoutSplittingPairs(text: string, length: number): string {
  if (text.length <= length) return text
  const last = text.charCodeAt(length - 1)
  return text.slice(0, last >= 0xd800 && last <= 0xdbff ? length - 1 : length)
}

function emptyFile(): CsvFileError {
  return new CsvFileError('empty_file', 'The file is empty: it needs a header row naming the columns.')
}

/**
 * inspectCsv without holding the event loop for the whole parse (about 1.5 s for 50 MiB): other
 * requests are served between chunks. Same result and errors.
 */
export async function inspectCsvAsync(bytes: Buffer): Promise<CsvInspection> {
  assertUtf8(bytes)
  const delimiter = detectDelimiter(withoutBom(bytes))
  const numbering = new RecordNumbering()
  let rowCount = 0
  const sampleRows: string[][] = []
  for await (const { values } of streamRecords(bytes, delimiter, numbering)) {
    rowCount++
    if (sampleRows.length < SAMPLE_ROW_COUNT) sampleRows.push(sampleOf(values))
  }
  if (numbering.columns === null) throw emptyFile()
  return { delimiter, columns: numbering.columns, rowCount, sampleRows }
}

/**
 * Yields the data records of a file (header and blank records skipped) while reading it, so memory
 * stays bounded by one chunk's records whatever the file size. Use the delimiter inspectCsv found.
 * A parse error may arrive before records that precede it in the same chunk were yielded; files
 * are inspected at upload, so the import job only meets errors for files changed since.
 */
export async function* readCsvRecords(input: Buffer | AsyncIterable<Uint8Array>, delimiter: Delimiter): AsyncGenerator<CsvRecord> {
  if (Buffer.isBuffer(input)) assertUtf8(input)
  yield* streamRecords(input, delimiter, new RecordNumbering())
}

async function* streamRecords(
  input: Buffer | AsyncIterable<Uint8Array>,
  delimiter: Delimiter,
  numbering: RecordNumbering,
): AsyncGenerator<CsvRecord> {
  // Numbered as parsed, not as consumed: a parse error discards the records still buffered, and
  // its row number must not depend on how far the consumer got.
  const options: Options<CsvRecord, string[]> = {
    ...parserOptions(delimiter),
    on_record: (values) => {
      const row = numbering.next(values)
      return row === null ? null : { row, values }
    },
  }
  // The typings tie on_record's result to the record type only when `columns` is used.
  const parser = parseStream(options as unknown as Options)
  const source = Readable.from(decodeUtf8(Buffer.isBuffer(input) ? chunksOf(input) : input))
  // pipe does not forward errors; destroying the parser hands them to the consumer's loop.
  source.on('error', (error) => parser.destroy(error))
  source.pipe(parser)
  try {
    yield* parser as AsyncIterable<CsvRecord>
  } catch (error) {
    throw numbering.explain(error)
  } finally {
    // An early stop by the consumer must not leave the source reading the rest of the upload.
    source.destroy()
  }
}

export function detectDelimiter(text: Buffer): Delimiter {
  const counts = new Map<Delimiter, number>(DELIMITER_PREFERENCE.map((delimiter) => [delimiter, 0]))
  const start = firstNonBlankLine(text)
  let quoted = false
  for (let index = start; index < text.length; index++) {
    const byte = text[index]
    if (byte === 0x22) quoted = !quoted
    else if (!quoted && (byte === 0x0a || byte === 0x0d)) break
    else if (!quoted) {
      const delimiter = String.fromCharCode(byte) as Delimiter
      const count = counts.get(delimiter)
      if (count !== undefined) counts.set(delimiter, count + 1)
    }
  }
  let best: Delimiter = ','
  for (const delimiter of DELIMITER_PREFERENCE) if (counts.get(delimiter)! > counts.get(best)!) best = delimiter
  return best
}

/**
 * The parser's options, which bound every record as it is read (csv-parse builds a record whole
 * before on_record sees it). ignore_last_delimiters stops splitting once a record has
 * MAX_RECORD_VALUES + 1 values: the rest of its line goes into that last value, so a record never
 * holds more values than that, and RecordNumbering refuses one that reached it. max_record_size
 * counts the characters of a record's values as they arrive, that last value's included, and stops
 * the parse past MAX_RECORD_LENGTH. Together they bound a record's memory whatever its line holds
 * (empty values, which max_record_size alone does not count, are bounded by the first). Records
 * within both bounds parse exactly as without them: the delimiters are ignored only from the value
 * past the cap on.
 */
function parserOptions(delimiter: Delimiter): Omit<Options, 'on_record'> {
  return {
    delimiter,
    bom: true,
    relax_column_count: true,
    relax_quotes: true,
    record_delimiter: ['\r\n', '\n', '\r'],
    encoding: 'utf8',
    ignore_last_delimiters: MAX_RECORD_VALUES + 1,
    // csv-parse checks the size before appending a character, so it lets one past its figure.
    max_record_size: MAX_RECORD_LENGTH - 1,
  }
}

function firstNonBlankLine(text: Buffer): number {
  let lineStart = 0
  for (let index = 0; index < text.length; index++) {
    const byte = text[index]
    if (byte === 0x0a || byte === 0x0d) lineStart = index + 1
    else if (byte !== 0x20 && byte !== 0x09) return lineStart
  }
  return text.length
}

function withoutBom(bytes: Buffer): Buffer {
  return bytes.subarray(0, 3).equals(UTF8_BOM) ? bytes.subarray(3) : bytes
}

function assertUtf8(bytes: Buffer): void {
  if (bytes.subarray(0, 4).equals(ZIP_SIGNATURE)) {
    throw new CsvFileError('invalid_encoding', `The file looks like a spreadsheet workbook (.xlsx), not CSV. ${SAVE_AS_UTF8}`)
  }
  if (isUtf8(bytes) && !bytes.includes(0)) return
  throw new CsvFileError('invalid_encoding', `Line ${firstBadLine(bytes)} of the file is not UTF-8 text. ${SAVE_AS_UTF8}`)
}

// 0x0A never occurs inside a multi-byte UTF-8 sequence, so each line can be checked on its own.
function firstBadLine(bytes: Buffer): number {
  let line = 1
  let start = 0
  for (;;) {
    const newline = bytes.indexOf(0x0a, start)
    const content = bytes.subarray(start, newline === -1 ? bytes.length : newline)
    if (newline === -1 || !isUtf8(content) || content.includes(0)) return line
    line++
    start = newline + 1
  }
}

function* chunksOf(bytes: Buffer): Generator<Buffer> {
  for (let offset = 0; offset < bytes.length; offset += CHUNK_BYTES) yield bytes.subarray(offset, offset + CHUNK_BYTES)
}

// A stream cannot be checked up front, so it is decoded strictly as it goes; a character split
// between two chunks is fine with a streaming decoder. Chunks already in memory would otherwise be
// parsed in one run of promise callbacks that starves timers and I/O, hence the setImmediate.
async function* decodeUtf8(chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder('utf-8', { fatal: true })
  let completeLines = 0
  const decode = (chunk?: Uint8Array): string => {
    let text: string
    try {
      text = chunk ? decoder.decode(chunk, { stream: true }) : decoder.decode()
    } catch {
      throw new CsvFileError('invalid_encoding', `The file is not UTF-8 text (on or after line ${completeLines + 1}). ${SAVE_AS_UTF8}`)
    }
    if (text.includes('\0'))
      throw new CsvFileError(
        'invalid_encoding',
        `The file contains NUL characters (on or after line ${completeLines + 1}). ${SAVE_AS_UTF8}`,
      )
    for (let index = text.indexOf('\n'); index !== -1; index = text.indexOf('\n', index + 1)) completeLines++
    return text
  }
  for await (const chunk of chunks) {
    yield decode(chunk)
    await setImmediate()
  }
  yield decode()
}

/** Tells the header from data and numbers the records; shared so inspection and import agree. */
class RecordNumbering {
  columns: string[] | null = null
  private lastRow = 0

  /** The data row number of a record worth importing, or null for the header and blank records. */
  next(values: string[]): number | null {
    if (values.length > MAX_RECORD_VALUES) throw tooManyValues(this.currentRow())
    const blank = values.every((value) => value.trim() === '')
    if (this.columns === null) {
      if (!blank) this.columns = headerNames(values)
      return null
    }
    this.lastRow++
    return blank ? null : this.lastRow
  }

  explain(error: unknown): unknown {
    if (!(error instanceof CsvError)) return error
    const row = this.currentRow()
    if (error.code === 'CSV_MAX_RECORD_SIZE') {
      // The value past the cap holds the rest of the line, so its growing past the length is a width problem.
      if ((error as CsvError & { index?: number }).index === MAX_RECORD_VALUES) return tooManyValues(row)
      return new CsvFileError(
        'record_too_long',
        `${whereIs(row)} is longer than ${MAX_RECORD_LENGTH} characters; a row holds at most that much text. Is a quote left open before it?`,
        row,
      )
    }
    return new CsvFileError('malformed_csv', `${whereIs(row)} is not valid CSV: ${describeCsvError(error)}.`, row)
  }

  /** The row of the record being parsed: 0 up to and including the header. */
  private currentRow(): number {
    return this.columns === null ? 0 : this.lastRow + 1
  }
}

function whereIs(row: number): string {
  return row === 0 ? 'The header row' : `Row ${row}`
}

function tooManyValues(row: number): CsvFileError {
  return new CsvFileError(
    'too_many_columns',
    `${whereIs(row)} has more than ${MAX_RECORD_VALUES} values; a row has at most ${MAX_RECORD_VALUES} (and a header ${MAX_COLUMNS}). Is the delimiter right?`,
    row,
  )
}

// An unclosed quote is the only parse error the options above leave; others keep the parser's words.
function describeCsvError(error: CsvError): string {
  return error.code === 'CSV_QUOTE_NOT_CLOSED' ? 'a quoted value is never closed (a closing " is missing)' : error.message
}

function headerNames(values: string[]): string[] {
  if (values.length > MAX_COLUMNS) {
    throw new CsvFileError(
      'too_many_columns',
      `The header has ${values.length} columns; at most ${MAX_COLUMNS} are accepted. Remove the columns you do not import and upload again.`,
      0,
    )
  }
  const long = values.findIndex((value) => value.length > MAX_HEADER_CELL_LENGTH)
  if (long !== -1) {
    throw new CsvFileError(
      'header_cell_too_long',
      `Column ${long + 1} of the header is ${values[long].length} characters long; a column name has at most ${MAX_HEADER_CELL_LENGTH}. Is the first row of the file its header?`,
      0,
    )
  }
  const names = values.map((value, index) => value.trim() || `column_${index + 1}`)
  const seen = new Set<string>()
  const duplicates = new Set<string>()
  for (const name of names) (seen.has(name) ? duplicates : seen).add(name)
  if (duplicates.size > 0) {
    const list = [...duplicates].map((name) => `"${name}"`).join(', ')
    throw new CsvFileError(
      'duplicate_columns',
      `Column names must be unique; the header repeats ${list}. Rename the repeated columns and upload again.`,
      0,
    )
  }
  return names
}
