// Each test file gets its own database, cloned from the migrated template that test/run.ts made.
import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import pg from 'pg'
import { assertNoSecretsInAudit } from './secrets.ts'

type Teardown = { teardown: (fn: () => unknown) => void }

export function testServerUrl(): string {
  const url = process.env.CRM_TEST_SERVER_URL
  if (!url) throw new Error('CRM_TEST_SERVER_URL is not set: run the tests with `make test` (test/run.ts provisions PostgreSQL)')
  return url
}

/**
 * The PostgreSQL build (the directory above bin/) that TEST_POSTGRES_BIN names, for every cluster the
 * tests start; undefined for the embedded one.
 */
export function testPostgresBuild(): string | undefined {
  const bin = process.env.TEST_POSTGRES_BIN
  if (!bin) return undefined
  const build = dirname(resolve(bin))
  for (const program of ['postgres', 'initdb', 'pg_ctl']) {
    if (!existsSync(join(build, 'bin', program))) throw new Error(`TEST_POSTGRES_BIN=${bin} has no ${program}`)
  }
  return build
}

export function databaseUrl(name: string): string {
  const parsed = new URL(testServerUrl())
  parsed.pathname = `/${name}`
  return parsed.toString()
}

export async function adminQuery(text: string, values: unknown[] = []): Promise<pg.QueryResult> {
  const client = new pg.Client({ connectionString: testServerUrl() })
  await client.connect()
  try {
    return await client.query(text, values)
  } finally {
    await client.end()
  }
}

/**
 * Clones the template into a fresh database and drops it when the test ends, after scanning its
 * audit log and event actors for secrets (test/helpers/secrets.ts): the file fails naming each
 * entry that holds one.
 */
export async function createTestDatabase(t: Teardown): Promise<string> {
  const name = `crm_test_${randomBytes(5).toString('hex')}`
  await adminQuery(`create database ${name} template ${process.env.CRM_TEST_TEMPLATE ?? 'crm_test_template'}`)
  const url = databaseUrl(name)
  t.teardown(async () => {
    try {
      await assertNoSecretsInAudit(url)
    } finally {
      await adminQuery(`drop database if exists ${name} with (force)`)
    }
  })
  return url
}

/** A new empty database (no template: for the migrator itself), dropped when the test ends. */
export async function createEmptyDatabase(t: Teardown): Promise<string> {
  const name = `crm_empty_${randomBytes(5).toString('hex')}`
  await adminQuery(`create database ${name}`)
  t.teardown(() => adminQuery(`drop database if exists ${name} with (force)`))
  return databaseUrl(name)
}

/** A plain pg client on the test database, as the owner role (what a DBA would use). */
export async function ownerClient(t: Teardown, url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(() => client.end())
  return client
}
