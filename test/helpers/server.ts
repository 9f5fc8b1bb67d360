// Starts the real service on port 0 against a cloned test database; tests call it over HTTP.
import { randomBytes } from 'node:crypto'
import { appendFileSync } from 'node:fs'
import { join } from 'node:path'
import { type Config, loadConfig } from '../../src/config.ts'
import { createLogger } from '../../src/log.ts'
import { type RunningService, startService } from '../../src/service.ts'
import { createTestDatabase } from './database.ts'
import { rememberSecret, rememberSecretsIn } from './secrets.ts'

type Teardown = { teardown: (fn: () => unknown) => void }

export type TestResponse = { status: number; headers: Headers; body: any; text: string }

export type TestServer = RunningService & {
  config: Config
  logLines: string[]
  /** Every SQL text the API's pool ran, when started with countQueries. */
  queries: string[]
  request: (
    method: string,
    path: string,
    options?: { body?: unknown; token?: string; headers?: Record<string, string>; raw?: string | Buffer },
  ) => Promise<TestResponse>
}

export const TEST_APP_SECRET = 'test-app-secret-that-is-long-enough-0123456789'
rememberSecret(TEST_APP_SECRET)

export async function startTestServer(
  t: Teardown,
  options: { env?: Record<string, string>; worker?: boolean; databaseUrl?: string; countQueries?: boolean; migrate?: boolean } = {},
): Promise<TestServer> {
  const url = options.databaseUrl ?? (await createTestDatabase(t))
  // Tests sign in far more often than a person would: the per-address limit has its own test.
  const config = loadConfig({
    PORT: '0',
    APP_SECRET: TEST_APP_SECRET,
    LOG_LEVEL: 'info',
    DATABASE_URL: url,
    UNAUTHENTICATED_RATE_LIMIT_PER_MINUTE: '1000000',
    ...options.env,
  })
  const logLines: string[] = []
  // test/run.ts scans every server's log after the run for secrets (tokens, passwords, webhook secrets).
  const logFile = process.env.CRM_TEST_LOG_DIR
    ? join(process.env.CRM_TEST_LOG_DIR, `${process.pid}-${randomBytes(4).toString('hex')}.log`)
    : null
  const logger = createLogger(config.logLevel, (line) => {
    logLines.push(line)
    if (logFile) appendFileSync(logFile, line + '\n')
  })
  const queries: string[] = []
  const service = await startService({
    config,
    logger,
    worker: options.worker ?? false,
    migrate: options.migrate ?? false,
    database: { url, description: 'test', stop: async () => {} },
    onQuery: options.countQueries ? (text) => queries.push(text) : undefined,
  })
  t.teardown(() => service.stop())
  const request: TestServer['request'] = async (method, path, requestOptions = {}) => {
    const headers: Record<string, string> = { ...requestOptions.headers }
    if (requestOptions.token) headers.authorization = `Bearer ${requestOptions.token}`
    let body: string | Buffer | undefined = requestOptions.raw
    if (requestOptions.body !== undefined) {
      body = JSON.stringify(requestOptions.body)
      headers['content-type'] ??= 'application/json'
    }
    const response = await fetch(service.url + path, { method, headers, body: body as BodyInit | undefined })
    const text = await response.text()
    let parsed: unknown = null
    try {
      parsed = text ? JSON.parse(text) : null
    } catch {
      parsed = null
    }
    // Every secret a test sends or is handed is looked for in the audit log when the file ends; a
    // value refused by validation (a password equal to the email, say) never got further.
    rememberSecretsIn(parsed)
    if (response.status !== 422) rememberSecretsIn(requestOptions.body)
    return { status: response.status, headers: response.headers, body: parsed, text }
  }
  return { ...service, config, logLines, request, queries }
}
