// Runs the real `crm` command against a test database, as an operator would.
import { spawn, spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { rememberSecretsIn } from './secrets.ts'
import { TEST_APP_SECRET } from './server.ts'

const CRM = fileURLToPath(new URL('../../bin/crm.js', import.meta.url))
const TIMEOUT_MS = 60_000

export type CliResult = { status: number | null; stdout: string; stderr: string; json: any }

function crmEnv(databaseUrl: string, env: Record<string, string>): NodeJS.ProcessEnv {
  return { ...process.env, DATABASE_URL: databaseUrl, APP_SECRET: TEST_APP_SECRET, LOG_LEVEL: 'error', ...env }
}

function cliResult(status: number | null, stdout: string, stderr: string): CliResult {
  let json: unknown = null
  try {
    json = JSON.parse(stdout)
  } catch {
    json = null
  }
  rememberSecretsIn(json)
  return { status, stdout, stderr, json }
}

export function crm(databaseUrl: string, args: string[], env: Record<string, string> = {}): CliResult {
  const result = spawnSync(process.execPath, [CRM, ...args], { env: crmEnv(databaseUrl, env), encoding: 'utf8', timeout: TIMEOUT_MS })
  return cliResult(result.status, result.stdout, result.stderr)
}

/** `crm` as a child the test does not block on, so that independent invocations can overlap. */
export function crmAsync(databaseUrl: string, args: string[], env: Record<string, string> = {}): Promise<CliResult> {
  const child = spawn(process.execPath, [CRM, ...args], { env: crmEnv(databaseUrl, env), timeout: TIMEOUT_MS })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk))
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk))
  return new Promise((resolve, reject) => {
    child.once('error', reject)
    child.once('close', (status) => resolve(cliResult(status, stdout, stderr)))
  })
}

/**
 * Independent `crm` invocations, at most `concurrency` at once (each process mostly loads modules and
 * waits for the database, so a few overlap well on a small machine), results in the order given.
 * Only for invocations whose outcome does not depend on each other's: failures, or reads.
 */
export async function crmEach(
  databaseUrl: string,
  invocations: { args: string[]; env?: Record<string, string> }[],
  concurrency = 4,
): Promise<CliResult[]> {
  const results: CliResult[] = new Array(invocations.length)
  let next = 0
  const lane = async (): Promise<void> => {
    while (next < invocations.length) {
      const index = next++
      results[index] = await crmAsync(databaseUrl, invocations[index].args, invocations[index].env)
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, invocations.length) }, lane))
  return results
}
