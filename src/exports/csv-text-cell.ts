// A text cell of a CSV file we write (exports, an import's errors.csv). A spreadsheet runs a cell
// that begins with =, +, -, @, a tab or a carriage return as a formula, so such a text is written
// with a leading ' (API.md section 6); numbers, dates and times are written as stored.
import { sql } from '../db/pool.ts'

type Fragment = ReturnType<typeof sql.fragment>

const FORMULA_START = /^[=+\-@\t\r]/

/** A text cell in SQL: the formula guard, then crm.csv_cell's RFC 4180 quoting. */
export function csvTextCellSql(value: Fragment): Fragment {
  return sql.fragment`crm.csv_cell(case when left(${value}, 1) in ('=', '+', '-', '@', chr(9), chr(13)) then '''' || ${value} else ${value} end)`
}

/** The same cell written in TypeScript (header rows). */
export function csvTextCell(value: string): string {
  const text = FORMULA_START.test(value) ? `'${value}` : value
  return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text
}
