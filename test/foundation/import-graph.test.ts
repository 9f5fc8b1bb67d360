// The import-graph check of `make check` (test/helpers/import-graph.ts): it finds an import that runs
// back up a layer and an import circle in a tree made for the test, places every file of src/, and the
// repository stays within its bounds.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { BOUNDS, backUpImports, circles, readImportGraph, unplaced } from '../helpers/import-graph.ts'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))

function tree(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), 'import-graph-'))
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, path)), { recursive: true })
    writeFileSync(join(root, path), text)
  }
  return root
}

t.test('a domain file importing src/http runs back up a layer; a circle is found whatever its length', async (t) => {
  const root = tree({
    'src/records/operations.ts': "import { answer } from '../http/route.ts'\nimport type { Row } from '../db/pool.ts'\n",
    'src/http/route.ts': "export { pool } from '../db/pool.ts'\nexport const answer = 1\n",
    'src/db/pool.ts': 'export type Row = {}\n',
    'src/auth/a.ts': "import './b.ts'\n",
    'src/auth/b.ts': "const c = await import('./c.ts')\n",
    'src/auth/c.ts': "import { a } from './a.ts'\n",
    'src/stray.ts': '',
  })
  t.teardown(() => rmSync(root, { recursive: true, force: true }))
  const graph = readImportGraph(root)
  t.same(backUpImports(graph), ['src/records/operations.ts -> src/http/route.ts'])
  t.same(circles(graph), [['src/auth/a.ts', 'src/auth/b.ts', 'src/auth/c.ts']])
  t.same(unplaced(graph), ['src/stray.ts'])
})

t.test('the repository: every file placed, back-up imports and circles within their bounds', async (t) => {
  const graph = readImportGraph(ROOT)
  t.same(unplaced(graph), [])
  t.ok(backUpImports(graph).length <= BOUNDS.backUpImports, backUpImports(graph).join('\n'))
  t.ok(circles(graph).length <= BOUNDS.circles, JSON.stringify(circles(graph)))
})
