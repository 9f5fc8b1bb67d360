// The repository owns its documents: docs/api.md is the contract that code and documents cite, and
// nothing tracked points at a document outside the repository; every section a citation names
// exists; the README stays under its size; the results table of docs/performance.md is the one
// bench/RESULTS.md gives. Markdown links and their anchors are checked by `make links`.
import { execFileSync } from 'node:child_process'
import { readFileSync, statSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { summaryTable, withSummary } from '../../bench/_summary.ts'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))

/**
 * The numbered files of a38c368, kept byte for byte as history: the upgrade test
 * (test/foundation/upgrade-from-before-the-fold.test.ts) migrates a database with them as they were.
 */
const HISTORY = 'test/fixtures/schema-a38c368/'

// The contract's name outside the repository (upper case: ours is docs/api.md), the shared folder
// beside the checkout, and its design document.
const OUTSIDE = [/API\.md/, /\.\.\/shared\b/, /\bDESIGN\.md/]

/** The outside documents a text points at, as the matched words. */
function outsideCitations(text: string): string[] {
  return OUTSIDE.flatMap((pattern) => text.match(new RegExp(pattern, 'g')) ?? [])
}

function trackedTextFiles(): { path: string; text: string }[] {
  const paths = execFileSync('git', ['ls-files', '-z'], { cwd: ROOT, encoding: 'utf8' }).split('\0').filter(Boolean)
  return paths
    .filter((path) => !path.startsWith('node_modules/'))
    .map((path) => ({ path, bytes: readFileSync(`${ROOT}${path}`) }))
    .filter(({ bytes }) => !bytes.subarray(0, 8000).includes(0))
    .map(({ path, bytes }) => ({ path, text: bytes.toString('utf8') }))
}

t.test('the matcher finds the outside names and leaves docs/api.md alone', async (t) => {
  // Put together here, so that this file does not cite them itself.
  const [contract, shared, design] = [['API', 'md'].join('.'), ['..', 'shared'].join('/'), ['DESIGN', 'md'].join('.')]
  t.same(outsideCitations('see docs/api.md section 4a and [api.md](api.md#2-errors)'), [])
  t.same(outsideCitations(`(${contract} section 4a)`), [contract])
  t.same(outsideCitations(`The contract is \`spec/${contract}\` of the shared specifications`), [contract])
  t.same(outsideCitations(`new URL('../../${shared}/fixtures/csv', import.meta.url)`), [shared])
  t.same(outsideCitations(`the shared design (${design})`), [design])
})

t.test('no tracked file points at a document outside the repository', async (t) => {
  const files = trackedTextFiles()
  t.ok(
    files.some(({ path }) => path === 'docs/api.md'),
    'the files are the tracked ones',
  )
  const offending = files
    .filter(({ path }) => !path.startsWith(HISTORY))
    .flatMap(({ path, text }) => outsideCitations(text).map((words) => `${path}: ${words}`))
  t.same(offending, [], 'cite docs/api.md (a relative link in Markdown) instead')
})

t.test('every section of docs/api.md that a file cites exists', async (t) => {
  const api = readFileSync(`${ROOT}docs/api.md`, 'utf8')
  const sections = new Set([...api.matchAll(/^## (\d+[a-z]?)\. /gm)].map((match) => match[1]))
  t.ok(sections.has('4a'), 'the headings are read')
  const missing: string[] = []
  for (const { path, text } of trackedTextFiles()) {
    for (const match of text.matchAll(/docs\/api\.md sections? (\d+[a-z]?(?:(?:, | and )\d+[a-z]?)*)/g)) {
      for (const section of match[1]?.split(/, | and /) ?? []) if (!sections.has(section)) missing.push(`${path}: section ${section}`)
    }
  }
  t.same(missing, [])
})

t.test('the README stays under 20,000 bytes', async (t) => {
  const size = statSync(`${ROOT}README.md`).size
  t.ok(size <= 20_000, `README.md is ${size} bytes: move detail to docs/ and link it`)
})

t.test("the results table of docs/performance.md is bench/RESULTS.md's", async (t) => {
  const performance = readFileSync(`${ROOT}docs/performance.md`, 'utf8')
  const results = readFileSync(`${ROOT}bench/RESULTS.md`, 'utf8')
  t.equal(withSummary(performance, summaryTable(results)), performance, 'run node bench/_summary.ts to write it again')
})
