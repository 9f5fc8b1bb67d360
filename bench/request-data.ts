// The worst inputs we can build for the code that reads request data, timed at a size and at twice
// that size: time linear in the input doubles (ratio about 2), quadratic time quadruples. The
// baseline is the pattern header normalisation used before, /\d+$/, on the same digit runs.
// No database: these are functions of the request's text alone.
import { jsonNestsDeeperThan, MAX_JSON_DEPTH } from '../src/http/body.ts'
import { inspectCsv, MAX_COLUMNS, MAX_HEADER_CELL_LENGTH } from '../src/imports/csv-file.ts'
import { uploadKindOf } from '../src/imports/multipart.ts'
import { normaliseHeader } from '../src/imports/suggest-mapping.ts'

/** The median of `runs` timings of fn, in milliseconds. */
function median(fn: () => unknown, runs = 7): number {
  fn()
  const times: number[] = []
  for (let run = 0; run < runs; run++) {
    const started = performance.now()
    fn()
    times.push(performance.now() - started)
  }
  return times.sort((a, b) => a - b)[Math.floor(runs / 2)]
}

type Case = { what: string; size: (n: number) => string; n: number; run: (input: string) => unknown; unit: string }

const digitRun = (n: number) => `a${'7'.repeat(n)}x`
const cases: Case[] = [
  {
    what: 'baseline: /\\d+$/ on a + digits + x (the pattern header normalisation used before)',
    size: digitRun,
    n: 10_000,
    run: (input) => input.replace(/\d+$/, ''),
    unit: 'digits',
  },
  { what: 'normaliseHeader on a + digits + x', size: digitRun, n: 10_000, run: normaliseHeader, unit: 'digits' },
  {
    what: `normaliseHeader on the worst cell the header allows (${MAX_HEADER_CELL_LENGTH} characters)`,
    size: (n) => digitRun(n - 2),
    n: MAX_HEADER_CELL_LENGTH / 2,
    run: normaliseHeader,
    unit: 'characters',
  },
  {
    what: 'inspectCsv of a header at the caps (columns × characters of + digits + x)',
    size: (n) => Array.from({ length: MAX_COLUMNS }, (_, index) => `${index}${digitRun(n - 2 - String(index).length)}`).join(','),
    n: MAX_HEADER_CELL_LENGTH / 2,
    run: (input) => inspectCsv(Buffer.from(`${input}\n1\n`)),
    unit: 'characters per cell',
  },
  {
    what: 'inspectCsv of a header cell past the cap (refused: header_cell_too_long)',
    size: digitRun,
    n: 500_000,
    run: (input) => {
      try {
        inspectCsv(Buffer.from(`${input}\n1\n`))
      } catch {}
    },
    unit: 'digits',
  },
  {
    what: `the nesting count of a JSON body ({"a": repeated; refused past ${MAX_JSON_DEPTH})`,
    size: (n) => '[1,"[[[\\"",'.repeat(n / 10) + '{"a":'.repeat(n / 10),
    n: 50_000,
    run: (input) => jsonNestsDeeperThan(input, Number.MAX_SAFE_INTEGER),
    unit: 'repetitions',
  },
  {
    what: 'the Content-Type of an upload (spaces and semicolons before a boundary that never comes)',
    size: (n) => `multipart/form-data${'; boundary '.repeat(n / 11)}`,
    n: 8_000,
    run: (input) => {
      try {
        uploadKindOf({ 'content-type': input })
      } catch {}
    },
    unit: 'characters',
  },
  {
    what: 'the bearer header (a token followed by spaces and one more word)',
    size: (n) => `Bearer crm_${'x'.repeat(n / 2)}${' '.repeat(n / 2)}y`,
    n: 8_000,
    run: (input) => /^Bearer\s+(\S+)\s*$/i.exec(input),
    unit: 'characters',
  },
]

const rows = cases.map(({ what, size, n, run, unit }) => {
  const once = median(() => run(size(n)))
  const twice = median(() => run(size(2 * n)))
  return `| ${what} | ${n.toLocaleString('en')} ${unit} | ${once.toFixed(3)} | ${twice.toFixed(3)} | ${(twice / once).toFixed(1)} |`
})

console.log(`## Request data: worst inputs (bench/request-data.ts)

Each input timed at n and 2n (median of 7, in the API's own functions, no HTTP): a ratio near 2 is
linear time, near 4 quadratic. The rule (docs/architecture.md, "Request data"): no regular expression
whose time grows faster than its input runs on request data.

| input | n | ms at n | ms at 2n | ratio |
|---|---:|---:|---:|---:|
${rows.join('\n')}`)
