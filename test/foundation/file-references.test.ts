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

t.test('every file the configuration names exists', async (t) => {
  const missing: string[] = []
  for (const file of CONFIGURATION) {
    for (const [path] of readFileSync(`${ROOT}${file}`, 'utf8').matchAll(FILE_PATH)) {
      if (!existsSync(`${ROOT}${path.replace(/\.$/, '')}`)) missing.push(`${file}: ${path.replace(/\.$/, '')}`)
    }
  }
  t.same(missing, [])
})
