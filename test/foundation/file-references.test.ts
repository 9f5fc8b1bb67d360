// The files the project's configuration names in its comments and commands exist. Markdown links
// are checked by `make links` (remark-validate-links); these files are not Markdown, so no such
// checker reads them.
import { existsSync, readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import t from 'tap'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))
const CONFIGURATION = ['biome.jsonc', '.squawk.toml', 'tsconfig.json', 'package.json', 'Makefile', '.ci/run', '.remarkrc.mjs']
// A path into one of the project's folders, down to a file name with an extension; globs are not paths.
const FILE_PATH = /(?<![\w/.*-])(?:docs|src|test|sql|bench|workers|bin|clients)\/[\w./-]*\.[a-z]+(?![\w*/])/g

// biome.jsonc sends its reader to this file, which the documentation rewrite (issue 29) writes or
// re-points; the todo goes with it.
const AWAITED = new Set(['biome.jsonc: docs/decisions-lint.md'])

t.test('every file the configuration names exists', async (t) => {
  const missing: string[] = []
  for (const file of CONFIGURATION) {
    for (const [path] of readFileSync(`${ROOT}${file}`, 'utf8').matchAll(FILE_PATH)) {
      if (!existsSync(`${ROOT}${path.replace(/\.$/, '')}`)) missing.push(`${file}: ${path.replace(/\.$/, '')}`)
    }
  }
  t.same(
    missing.filter((entry) => !AWAITED.has(entry)),
    [],
  )
  for (const entry of missing.filter((entry) => AWAITED.has(entry))) t.fail(entry, { todo: 'named before it was written' })
})
