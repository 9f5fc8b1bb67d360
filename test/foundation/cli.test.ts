// The CLI as an operator meets it: a bad configuration stops start-up with one line per variable.
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import t from 'tap'

const CRM = fileURLToPath(new URL('../../bin/crm.js', import.meta.url))

function crm(args: string[], env: Record<string, string> = {}) {
  return spawnSync(process.execPath, [CRM, ...args], { env: { ...process.env, ...env }, encoding: 'utf8', timeout: 60_000 })
}

t.test('help lists the commands', async (t) => {
  const result = crm(['help'])
  t.equal(result.status, 0)
  t.match(result.stdout, /crm migrate/)
  t.match(result.stdout, /crm serve/)
  t.match(result.stdout, /crm worker/)
})

t.test('a bad configuration value stops start-up with one line naming the variable', async (t) => {
  const result = crm(['serve'], { PORT: 'abc', DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' })
  t.not(result.status, 0)
  const lines = result.stderr.trim().split('\n')
  t.equal(lines.length, 1, result.stderr)
  t.match(lines[0], /^crm: configuration: PORT: /)
})

t.test('unknown commands and options fail with one line', async (t) => {
  const unknown = crm(['frobnicate'])
  t.equal(unknown.status, 2)
  t.match(unknown.stderr, /unknown command "frobnicate"/)
  const badOption = crm(['serve', '--bogus'])
  t.equal(badOption.status, 2)
  t.equal(badOption.stderr.trim().split('\n').length, 1)
  const json = crm(['frobnicate', '--json'])
  t.match(JSON.parse(json.stdout), { code: 'unknown_command', detail: 'unknown command "frobnicate"; run crm help', exit_code: 2 })
})
