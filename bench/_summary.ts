// The results table at the top of docs/performance.md, made from bench/RESULTS.md so that the two
// cannot disagree: `make bench` writes it after RESULTS.md, `node bench/_summary.ts` writes it again
// from the RESULTS.md in the tree, and test/foundation/documents.test.ts fails while they differ.
// The name starts with `_` so that bench/run.ts does not take it for a benchmark.
import { readFileSync, writeFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const RESULTS = fileURLToPath(new URL('RESULTS.md', import.meta.url))
const PERFORMANCE = fileURLToPath(new URL('../docs/performance.md', import.meta.url))

export const SUMMARY_START = '<!-- The table below is written by bench/_summary.ts from bench/RESULTS.md: do not edit it. -->'
export const SUMMARY_END = '<!-- End of the table written by bench/_summary.ts. -->'

/** The body of the section of RESULTS.md whose heading starts with `title`, or null. */
function section(results: string, title: string): string | null {
  const found = results.split(/^## /m).find((part) => part.startsWith(title))
  return found ?? null
}

function requiredSection(results: string, title: string): string {
  const found = section(results, title)
  if (found === null) throw new Error(`bench/RESULTS.md has no section "${title}"`)
  return found
}

/** The cells of the table row of `body` whose first cell starts with `first`. */
function row(body: string, first: string): string[] {
  for (const line of body.split('\n')) {
    if (!line.startsWith('|')) continue
    const cells = line
      .slice(1, -1)
      .split('|')
      .map((cell) => cell.trim())
    if (cells[0]?.startsWith(first)) return cells
  }
  throw new Error(`bench/RESULTS.md has no row "${first}" in section "${body.split('\n')[0]}"`)
}

/** The first number in a cell (`"10,806 deliveries/s"` → 10806). */
function numberIn(cell: string | undefined): number {
  const match = /\d[\d,]*(?:\.\d+)?/.exec(cell ?? '')
  if (!match) throw new Error(`bench/RESULTS.md: no number in "${cell}"`)
  return Number(match[0].replaceAll(',', ''))
}

const count = (value: number) => Math.round(value).toLocaleString('en-US')
const percent = (part: number, whole: number, digits = 0) => `${((100 * part) / whole).toFixed(digits)} %`
const mark = (met: boolean) => (met ? '✓' : 'not met')

/**
 * target: issue 45's share of the baseline, in %, on every PostgreSQL version measured. The
 * summary checks it against each ratio itself: a RESULTS.md written before the targets rose says
 * whether its run met the target of its day.
 */
const RECORD_SCENARIOS = [
  { name: 'GET one deal', row: 'GET one deal', target: 85 },
  { name: 'list 50 deals', row: 'list 50 deals', target: 95 },
  { name: 'create a deal', row: 'create a deal', target: 85 },
]

function recordRows(results: string): string[] {
  const versions = ['18', '15']
    .map((version) => ({ version, body: section(results, `Records API on PostgreSQL ${version}`) }))
    .filter((found): found is { version: string; body: string } => found.body !== null)
  if (versions.length === 0) throw new Error('bench/RESULTS.md has no section "Records API on PostgreSQL ..."')
  const which = versions.map(({ version }) => version).join(' / ')
  const lines = RECORD_SCENARIOS.map((scenario) => {
    const cells = versions.map(({ body }) => row(body, scenario.row))
    // The ratio cell reads "79% ✅ ≥ 70%": the ratio first.
    const { target } = scenario
    const met = cells.every((cell) => numberIn(cell[7]) >= target)
    return `| ${scenario.name}, PostgreSQL ${which} | ${cells.map((cell) => count(numberIn(cell[1]))).join(' / ')} req/s | ${cells
      .map((cell) => count(numberIn(cell[4])))
      .join(' / ')} req/s | ${cells.map((cell) => `${numberIn(cell[7])} %`).join(' / ')} | ≥ ${target} % ${mark(met)} |`
  })
  const p50s = versions.map(({ body }) => /p50 ([\d.]+) ms/.exec(body)?.[1] ?? '?')
  const listMet = p50s.every((p50) => Number(p50) < 10)
  lines.push(`| the list query alone, PostgreSQL ${which} | p50 ${p50s.join(' / ')} ms | — | — | p50 < 10 ms ${mark(listMet)} |`)
  // A record's history page (admin / member), in results written since the route exists.
  const history = versions.map(({ body }) => /History page[^\n]*?p50 ([\d.]+) \/ ([\d.]+) ms/.exec(body))
  if (history.every((match) => match !== null)) {
    const historyMet = history.every((match) => Math.max(Number(match![1]), Number(match![2])) < 10)
    // Its baseline (the same page of events by plain SQL), in results written since bench/records.ts measures it.
    const bare = versions.map(({ body }) => /History page[^\n]*?baseline[^\n]*?p50 ([\d.]+) ms/.exec(body)?.[1])
    const baseline = bare.every((p50) => p50 !== undefined) ? `plain SQL page p50 ${bare.join(' / ')} ms` : '—'
    lines.push(
      `| a history page of a deal with 1,000 changes, admin / member, PostgreSQL ${which} | p50 ${history
        .map((match) => `${match![1]} / ${match![2]}`)
        .join(', ')} ms | ${baseline} | — | p50 < 10 ms ${mark(historyMet)} |`,
    )
  }
  return lines
}

function webhookRow(results: string): string {
  const body = requiredSection(results, 'Webhooks')
  const delivered = numberIn(row(body, 'deliveries delivered')[1])
  const steady = numberIn(row(body, 'deliveries received')[1])
  const loop = Math.max(numberIn(row(body, 'bare signed POST loop')[1]), numberIn(row(body, 'the same loop after the service')[1]))
  const ratio = delivered / loop
  return `| webhook deliveries | ${count(delivered)}/s from worker start, ${count(steady)}/s steady | signed POST loop ${count(loop)} req/s | ${percent(delivered, loop)} | ≥ 1,000/s ${mark(delivered >= 1000)}, ≥ 50 %: ${mark(ratio >= 0.5)} |`
}

function importRow(results: string): string {
  const body = requiredSection(results, 'CSV import')
  const copy = numberIn(row(body, 'baseline')[2])
  const job = numberIn(row(body, 'process_import')[2])
  return `| CSV import | ${count(job)} rows/s | raw \`COPY\` ${count(copy)} rows/s | ${percent(job, copy, 1)} | ≥ 20,000 rows/s: ${mark(job >= 20_000)} |`
}

function exportRow(results: string): string {
  const body = requiredSection(results, 'Streaming export')
  const cursor = numberIn(row(body, 'baseline')[2])
  const formats = ['CSV', 'NDJSON'].map((format) => {
    const cells = row(body, format)
    return { format, rate: numberIn(cells[2]), rss: numberIn(cells[5]) }
  })
  const rates = formats.map(({ format, rate }) => `${format} ${mark(rate >= 100_000)}`).join(', ')
  const aboveCursor = formats.map(({ format, rate }) => `${format} ${mark(rate >= cursor)}`).join(', ')
  const rssMet = formats.every(({ rss }) => rss < 200)
  return `| streaming export | ${formats.map(({ format, rate }) => `${format} ${count(rate)}`).join(', ')} rows/s; peak RSS ${formats
    .map(({ rss }) => count(rss))
    .join(' / ')} MiB | bare cursor ${count(cursor)} rows/s | ${formats
    .map(({ rate }) => percent(rate, cursor))
    .join(' / ')} | ≥ the bare cursor: ${aboveCursor}; ≥ 100,000 rows/s: ${rates}; RSS < 200 MiB: ${mark(rssMet)} |`
}

/** The batch routes against single creates, once RESULTS.md has their section (bench/batch.ts). */
function batchRows(results: string): string[] {
  const body = section(results, 'Batch routes')
  if (body === null) return []
  const single = numberIn(row(body, 'single creates')[1])
  const create = numberIn(row(body, 'batch create')[1])
  const upsert = numberIn(row(body, 'batch upsert')[1])
  // What this host does at all: the same batches as one bare statement each (bench/batch.ts prints it since 2026-11-28).
  const bare = body.includes('| bare SQL upsert of 100, same indexes')
    ? numberIn(row(body, 'bare SQL upsert of 100, same indexes')[1])
    : null
  const bareNote = bare === null ? '' : `; the bare SQL upsert ${count(bare)} records/s`
  return [
    `| batch create of 100 | ${count(create)} records/s | single creates ${count(single)} records/s | ${(create / single).toFixed(1)}× | ≥ 10×: ${mark(create >= 10 * single)} |`,
    `| batch upsert of 100 | ${count(upsert)} records/s | single creates ${count(single)} records/s | ${(upsert / single).toFixed(1)}× | ≥ 20,000 records/s: ${mark(upsert >= 20_000)}${bareNote} |`,
  ]
}

function feedRow(results: string): string {
  const body = section(results, 'Events feed long polling')
  if (body === null)
    return '| events feed long polling | not in bench/RESULTS.md yet: run `make bench` | — | — | ≤ 2 connections, p99 ≤ 100 ms |'
  const held = numberIn(row(body, 'connections of the API process while')[1])
  const latency = row(body, 'event to client with the pool')[1]
  const p99 = numberIn(latency?.split('/')[1])
  const bare = numberIn(row(body, 'baseline')[1])
  const clients = /^([\d,]+) clients/.exec(body.split('\n').find((line) => /^[\d,]+ clients/.test(line)) ?? '')?.[1] ?? '?'
  return `| events feed long polling, ${clients} clients | ${held} connections waiting; event to client p50 / p99 / max ${latency} | bare LISTEN p50 ${bare} ms | — | ≤ 2 connections ${mark(held <= 2)}, p99 ≤ 100 ms ${mark(p99 <= 100)} |`
}

/** The audit log's write cost and page, once RESULTS.md has their section (bench/audit.ts). */
function auditRows(results: string): string[] {
  const body = section(results, 'Access audit log')
  if (body === null) return []
  const rates = row(body, 'audited write over HTTP: requests/s')
  const inSql = row(body, 'the same rename in SQL')
  const page = row(body, 'audit-log page')
  const bare = row(body, 'baseline')
  const entries = /; ([\d,]+) entries in the workspace/.exec(body)?.[1] ?? '?'
  return [
    `| audited write (a role renamed, one entry), one client | ${count(numberIn(rates[1]))} req/s; in SQL ${count(numberIn(inSql[1]))} µs a change | without the trigger ${count(numberIn(rates[2]))} req/s; in SQL ${count(numberIn(inSql[2]))} µs | ${percent(numberIn(rates[1]), numberIn(rates[2]))} | report the cost |`,
    `| audit-log page of 50, ${entries} entries | p50 ${numberIn(page[1])} ms | plain SQL p50 ${numberIn(bare[1])} ms | — | — |`,
  ]
}

/** The summary of RESULTS.md: one row per area, the service against its baseline and its target. */
export function summaryTable(results: string): string {
  return [
    '| area | service | baseline in the same run | ratio | target |',
    '|---|---:|---:|---:|---|',
    ...recordRows(results),
    ...batchRows(results),
    webhookRow(results),
    importRow(results),
    exportRow(results),
    feedRow(results),
    ...auditRows(results),
  ].join('\n')
}

/** `performance` with the text between the markers replaced by `table`. */
export function withSummary(performance: string, table: string): string {
  const start = performance.indexOf(SUMMARY_START)
  const end = performance.indexOf(SUMMARY_END)
  if (start < 0 || end < start) throw new Error(`docs/performance.md lacks the markers "${SUMMARY_START}" and "${SUMMARY_END}"`)
  return `${performance.slice(0, start + SUMMARY_START.length)}\n\n${table}\n\n${performance.slice(end)}`
}

/** Writes the table of the current bench/RESULTS.md into docs/performance.md. */
export function writeSummary(): void {
  writeFileSync(PERFORMANCE, withSummary(readFileSync(PERFORMANCE, 'utf8'), summaryTable(readFileSync(RESULTS, 'utf8'))))
}

if (import.meta.main) writeSummary()
