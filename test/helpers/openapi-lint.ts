// `make check`: the document GET /api/openapi.json serves, built from this checkout's routes (no
// database), linted by Redocly CLI with redocly.yaml's rules; any error or warning fails.
import { spawnSync } from 'node:child_process'
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { buildOpenApiDocument } from '../../src/http/openapi.ts'
import { allRoutes } from '../../src/http/routes/index.ts'

const root = new URL('../../', import.meta.url).pathname
const folder = mkdtempSync(join(tmpdir(), 'openapi-lint-'))
try {
  // The ignore file names the document by its path relative to the configuration: all three together.
  for (const name of ['redocly.yaml', '.redocly.lint-ignore.yaml']) copyFileSync(join(root, name), join(folder, name))
  const file = join(folder, 'openapi.json')
  writeFileSync(file, JSON.stringify(buildOpenApiDocument(allRoutes()), null, 1))
  const lint = spawnSync(join(root, 'node_modules/.bin/redocly'), ['lint', 'openapi.json', '--max-problems', '50', '--format', 'stylish'], {
    cwd: folder,
    stdio: ['ignore', 'pipe', 'inherit'],
    encoding: 'utf8',
    env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' },
  })
  process.stdout.write(lint.stdout)
  const clean = lint.status === 0 && !/\bwarning\b/i.test(lint.stdout)
  if (!clean) {
    console.error('openapi-lint: redocly lint reported problems (errors and warnings both fail)')
    process.exitCode = 1
  }
} finally {
  rmSync(folder, { recursive: true, force: true })
}
