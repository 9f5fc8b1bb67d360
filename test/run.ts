// `make test`: provision one PostgreSQL for the whole run, migrate a template database once, then
// run tap; every test file clones the template (CREATE DATABASE ... TEMPLATE), which takes
// milliseconds and isolates files from each other. Ends with the failed assertions, by file, and
// the plain "N passed, N failed" line.
// TEST_POSTGRES_BIN=<a PostgreSQL bin directory> (Debian's /usr/lib/postgresql/15/bin, say) runs the
// throwaway cluster, and the clusters tests start themselves, from those binaries instead of the
// embedded ones: CI runs the suite on the oldest supported version that way too.
// TEST_JOBS=<n> runs n test files at once instead of twice the cores (an explicit --jobs wins).
// TEST_COVERAGE=0 runs them without coverage (and its thresholds), faster: see coverageChoice.
import { spawn } from 'node:child_process'
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { availableParallelism, tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import { migrate } from '../src/db/migrate.ts'
import { type ProvisionedDatabase, redactUrl, startEmbeddedPostgres } from '../src/db/provision.ts'
import { testPostgresBuild } from './helpers/database.ts'
import { TEST_PASSWORD } from './helpers/fixtures.ts'
import { SECRET_FORMATS } from './helpers/secrets.ts'
import { TapFailures } from './helpers/tap-failures.ts'

const TEMPLATE = 'crm_test_template'

/**
 * How many test files run at once: TEST_JOBS, or twice the cores. tap's own default leaves a core
 * free, which on a machine of 2 cores is one file at a time; and many test files spend most of their
 * wall time waiting (for their server's answers, a child process, a cluster or a browser to start, a
 * worker to pick up a job), not computing: measured in docs/performance.md ("Test suite").
 */
function testJobs(args: string[]): string[] {
  if (args.some((arg) => /^(-j|--jobs)/.test(arg))) return []
  return [`--jobs=${Number(process.env.TEST_JOBS) || 2 * availableParallelism()}`]
}

/**
 * TEST_COVERAGE=0 runs the files without coverage, and with Node's compile cache: V8's block coverage
 * slows every function it counts, and the cache would make that coverage less precise (Node's
 * documentation), so the two go together. CI measures coverage, and enforces its thresholds, in the
 * suite on PostgreSQL 18 and runs the one on 15 this way: about a fifth less CPU a file
 * (docs/performance.md, "Test suite").
 */
function coverageChoice(args: string[]): { args: string[]; env: Record<string, string>; cacheDir: string | null } {
  if (process.env.TEST_COVERAGE !== '0' || args.includes('--disable-coverage')) return { args: [], env: {}, cacheDir: null }
  const cacheDir = mkdtempSync(join(tmpdir(), 'crm-test-compile-cache-'))
  return { args: ['--disable-coverage'], env: { NODE_COMPILE_CACHE: cacheDir }, cacheDir }
}

async function provision(): Promise<ProvisionedDatabase & { label: string; throwaway: boolean }> {
  if (process.env.DATABASE_URL) {
    return {
      url: process.env.DATABASE_URL,
      description: '',
      stop: async () => {},
      label: `DATABASE_URL (${redactUrl(process.env.DATABASE_URL)})`,
      throwaway: false,
    }
  }
  if (process.env.TEST_DATABASE === 'testcontainers') {
    try {
      const { PostgreSqlContainer } = await import('@testcontainers/postgresql')
      const container = await new PostgreSqlContainer('postgres:18').start()
      return {
        url: container.getConnectionUri(),
        description: '',
        stop: async () => void (await container.stop()),
        label: 'a PostgreSQL container (testcontainers)',
        throwaway: true,
      }
    } catch (error) {
      console.log(
        `TEST_DATABASE=testcontainers: no container runtime answered (${(error as Error).message.split('\n')[0]}); using the embedded PostgreSQL instead`,
      )
    }
  }
  const baseDir = mkdtempSync(join(tmpdir(), 'crm-test-'))
  const nativeDir = testPostgresBuild()
  const database = await startEmbeddedPostgres({ baseDir, database: 'postgres', persistent: false, durability: 'none', nativeDir })
  return {
    ...database,
    label: nativeDir ? `a throwaway cluster of ${nativeDir}` : 'the embedded PostgreSQL (throwaway cluster)',
    throwaway: true,
    stop: async () => {
      await database.stop()
      rmSync(baseDir, { recursive: true, force: true })
    },
  }
}

/** Tokens, webhook secrets, challenge tokens and the test passwords must never reach a log line. */
function scanLogsForSecrets(dir: string): { scanned: string; found: string[] } {
  const patterns: [string, RegExp][] = [
    ...SECRET_FORMATS.map(([what, format]): [string, RegExp] => [what, new RegExp(format)]),
    // OAuth codes, states and refresh tokens travel in query strings: no query value that names a
    // secret may reach a log line, whatever its format.
    ['secret-bearing query value', /[?&](token|code|state|refresh_token|access_token|client_secret)=[^&\s"]/],
    ['test password', new RegExp(TEST_PASSWORD)],
  ]
  const found: string[] = []
  let lines = 0
  const files = readdirSync(dir)
  for (const file of files) {
    for (const line of readFileSync(join(dir, file), 'utf8').split('\n')) {
      if (!line) continue
      lines++
      for (const [what, pattern] of patterns) if (pattern.test(line)) found.push(`${what} in ${file}: ${line.slice(0, 200)}`)
    }
  }
  return { scanned: `secret scan: ${lines} log lines from ${files.length} test servers, ${found.length} secrets found`, found }
}

function withDatabase(url: string, database: string): string {
  const parsed = new URL(url)
  parsed.pathname = `/${database}`
  return parsed.toString()
}

async function main(): Promise<number> {
  const started = Date.now()
  const server = await provision()
  try {
    const admin = new pg.Client({ connectionString: server.url })
    await admin.connect()
    const { rows } = await admin.query<{ server_version: string }>('show server_version')
    console.log(`tests use ${server.label}, PostgreSQL ${rows[0].server_version}`)
    if (server.notice) console.log(server.notice)
    if (server.throwaway) {
      // Tests that run concurrent batches over the same rows deadlock on purpose; PostgreSQL looks for
      // the cycle only after deadlock_timeout (1 s by default), each wait of a retried transaction
      // included. The same deadlocks, found in 0.1 s: test/hostile/batch-bodies.test.ts's concurrent
      // batches took 9 s instead of 90 s (docs/performance.md, "Test suite").
      await admin.query(`alter system set deadlock_timeout = '100ms'`)
      await admin.query('select pg_reload_conf()')
    }
    await admin.query(`drop database if exists ${TEMPLATE} with (force)`)
    await admin.query(`create database ${TEMPLATE}`)
    await admin.end()
    await migrate(withDatabase(server.url, TEMPLATE))

    const logDir = mkdtempSync(join(tmpdir(), 'crm-test-logs-'))
    const args = process.argv.slice(2)
    const coverage = coverageChoice(args)
    const tap = spawn('npx', ['tap', ...testJobs(args), ...coverage.args, ...args], {
      stdio: ['ignore', 'pipe', 'inherit'],
      env: {
        ...process.env,
        ...coverage.env,
        CRM_TEST_SERVER_URL: server.url,
        CRM_TEST_TEMPLATE: TEMPLATE,
        CRM_TEST_LOG_DIR: logDir,
        DATABASE_URL: '',
      },
    })
    let summary = ''
    const failures = new TapFailures()
    tap.stdout.on('data', (chunk: Buffer) => {
      process.stdout.write(chunk)
      summary = (summary + chunk.toString()).slice(-4000)
      failures.add(chunk.toString())
    })
    const code: number = await new Promise((resolve) => tap.on('close', (exitCode) => resolve(exitCode ?? 1)))
    const counts = /# \{ total: (\d+)(?:, pass: (\d+))?(?:, fail: (\d+))?/.exec(summary)
    const passed = counts ? Number(counts[2] ?? 0) : 0
    const failed = counts ? Number(counts[3] ?? 0) : code === 0 ? 0 : 1
    console.log(`\nassertions: ${passed + failed} in ${Math.round((Date.now() - started) / 1000)} s`)
    const leaks = scanLogsForSecrets(logDir)
    rmSync(logDir, { recursive: true, force: true })
    if (coverage.cacheDir) rmSync(coverage.cacheDir, { recursive: true, force: true })
    console.log(leaks.scanned)
    const failedAssertions = failures.end()
    if (failedAssertions.length > 0)
      console.log(`failed assertions (at most 50):\n${failedAssertions.map((line) => `  ${line}`).join('\n')}`)
    for (const leak of leaks.found) console.log(`SECRET IN LOGS: ${leak}`)
    console.log(`${passed} passed, ${failed + leaks.found.length} failed`)
    return code === 0 && failed === 0 && leaks.found.length === 0 ? 0 : 1
  } finally {
    await server.stop()
  }
}

process.exitCode = await main()
