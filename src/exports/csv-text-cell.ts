// A text cell of a CSV file we write (exports, an import's errors.csv). A spreadsheet runs a cell
// that begins with =, +, -, @, a tab or a carriage return as a formula, so such a text is written
// with a leading ' (docs/api.md section 6); numbers, dates and times are written as stored.
import { sql } from '../db/pool.ts'

type Fragment = ReturnType<typeof sql.fragment>

// A text that already begins with ' (any number) before one of those gets one ' more, so an import
// (which takes one ' off, crm.import_cell) reads every text back exactly.
const FORMULA_START = /^'*[=+\-@\t\r]/

/** A text cell in SQL: crm.csv_text_cell, the formula guard and RFC 4180 quoting in one inlinable function. */
export function csvTextCellSql(value: Fragment): Fragment {
  return sql.fragment`crm.csv_text_cell(${value})`
}

/** The same cell written in TypeScript (header rows). */
export function csvTextCell(value: string): string {
  const text = FORMULA_START.test(value) ? `'${value}` : value
  return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text
}
