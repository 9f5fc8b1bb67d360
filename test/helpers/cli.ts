// Runs the real `crm` command against a test database, as an operator would.
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { rememberSecretsIn } from './secrets.ts'
import { TEST_APP_SECRET } from './server.ts'

const CRM = fileURLToPath(new URL('../../bin/crm.js', import.meta.url))

export type CliResult = { status: number | null; stdout: string; stderr: string; json: any }

export function crm(databaseUrl: string, args: string[], env: Record<string, string> = {}): CliResult {
  const result = spawnSync(process.execPath, [CRM, ...args], {
    env: { ...process.env, DATABASE_URL: databaseUrl, APP_SECRET: TEST_APP_SECRET, LOG_LEVEL: 'error', ...env },
    encoding: 'utf8',
    timeout: 60_000,
  })
  let json: unknown = null
  try {
    json = JSON.parse(result.stdout)
  } catch {
    json = null
  }
  rememberSecretsIn(json)
  return { status: result.status, stdout: result.stdout, stderr: result.stderr, json }
}
