// Numbered plain-SQL migrations from sql/. Each file runs in its own transaction that first
// records its number and checksum, so a file is applied whole or not at all. A session advisory
// lock serialises concurrent migrators: the second waits, then finds nothing left to do.
import { createHash } from 'node:crypto'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Logger, runMigrations as runWorkerMigrations } from 'graphile-worker'
import pg from 'pg'
import { admitOwnLoginRoles } from './runtime-role.ts'

export const SQL_DIR = fileURLToPath(new URL('../../sql/', import.meta.url))

/** Any constant works; it only has to be the same for every migrator of this schema. */
const MIGRATION_LOCK_KEY = 727_001

export type MigrationFile = { number: number; name: string; sql: string; checksum: string }

export class MigrationError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'MigrationError'
  }
}

export function readMigrationFiles(dir = SQL_DIR): MigrationFile[] {
  return readdirSync(dir)
    .filter((name) => /^\d{6}_[a-z0-9_]+\.sql$/.test(name))
    .sort()
    .map((name) => {
      const sql = readFileSync(join(dir, name), 'utf8')
      return { number: Number(name.slice(0, 6)), name, sql, checksum: createHash('sha256').update(sql).digest('hex') }
    })
}

const LEDGER_DDL = `
  create schema if not exists crm;
  create table if not exists crm.schema_migrations (
    number integer primary key,
    name text not null,
    checksum text not null,
    applied_at timestamptz not null default now()
  );
  comment on table crm.schema_migrations is 'One row per applied sql/ migration file, with its sha256.';
`

/**
 * Files of the pre-release migrations (0.1.0 and earlier) that the baseline 000001..000007 replaced.
 * A database they migrated cannot be migrated further: its objects were made by other files.
 */
const FOLDED_PRE_RELEASE_FILES = new Set([
  '000008_import_speed.sql',
  '000010_single_statement_reads.sql',
  '000011_totp_replay.sql',
  '000012_webhook_speed.sql',
  '000013_read_path.sql',
  '000014_import_landing.sql',
  '000015_webhook_plans_without_statistics.sql',
])

function unknownLedgerEntry(name: string): MigrationError {
  if (FOLDED_PRE_RELEASE_FILES.has(name)) {
    return new MigrationError(
      `this database was migrated by the pre-release migration files (it records ${name}), which were folded into a new baseline; recreate it (\`make clean\` removes the embedded one under .data/)`,
    )
  }
  return new MigrationError(
    `this database records migration ${name}, which is not in sql/: it was migrated by other migration files than these (a newer version?)`,
  )
}

/** Where the request context travels (sql/000025_context_carrier.sql): the parameter, or the keyed proof. */
export type ContextCarrier = 'parameter' | 'keyed_proof'

export type MigrateResult = {
  applied: string[]
  alreadyApplied: number
  contextCarrier: ContextCarrier | null
  /** Whether the database admits its own login roles alone (false: the migrating role does not own it; null: files before sql/000035). */
  ownLoginsOnly: boolean | null
}

export async function migrate(
  databaseUrl: string,
  options: {
    dir?: string
    log?: (line: string) => void
    contextCarrier?: 'auto' | 'keyed_proof'
    /** Login roles of this deployment the operator manages (RUNTIME_DATABASE_URL, WORKER_DATABASE_URL): they keep CONNECT. */
    logins?: string[]
  } = {},
): Promise<MigrateResult> {
  const files = readMigrationFiles(options.dir)
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  const applied: string[] = []
  try {
    await client.query('select pg_advisory_lock($1)', [MIGRATION_LOCK_KEY])
    await client.query(LEDGER_DDL)
    const { rows } = await client.query<{ number: number; name: string; checksum: string }>(
      'select number, name, checksum from crm.schema_migrations order by number',
    )
    const onDisk = new Set(files.map((file) => file.name))
    const vanished = rows.find((row) => !onDisk.has(row.name))
    if (vanished) throw unknownLedgerEntry(vanished.name)
    const done = new Map(rows.map((row) => [row.number, row]))
    for (const file of files) {
      const previous = done.get(file.number)
      if (previous) {
        if (previous.checksum !== file.checksum) {
          throw new MigrationError(
            `migration ${file.name} was changed after it was applied (recorded sha256 ${previous.checksum.slice(0, 12)}…, file ${file.checksum.slice(0, 12)}…); restore it and add a new numbered migration instead`,
          )
        }
        continue
      }
      await client.query('begin')
      try {
        // Recorded first: a concurrent migrator that slipped past the lock fails on the key at once.
        await client.query('insert into crm.schema_migrations (number, name, checksum) values ($1, $2, $3)', [
          file.number,
          file.name,
          file.checksum,
        ])
        await client.query(file.sql)
        await client.query('commit')
      } catch (error) {
        await client.query('rollback')
        throw new MigrationError(`migration ${file.name} failed and was rolled back: ${(error as Error).message}`)
      }
      applied.push(file.name)
      options.log?.(`applied ${file.name}`)
    }
    await runWorkerMigrations({ connectionString: databaseUrl, logger: quietWorkerLogger() })
    // graphile-worker's schema exists only now: the worker's login role gets its queue (every time,
    // so a graphile-worker upgrade's new tables are covered too).
    await client.query('select crm.grant_job_queue_to_worker()')
    // Every run, under the lock: a GRANT SET ON PARAMETER made since the last one takes effect.
    const contextCarrier = await installContextCarrier(client, options.contextCarrier ?? 'auto')
    const ownLoginsOnly = await keepToItsOwn(client, options.logins ?? [], options.log)
    return { applied, alreadyApplied: files.length - applied.length, contextCarrier, ownLoginsOnly }
  } finally {
    await client.query('select pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]).catch(() => {})
    await client.end()
  }
}

async function installContextCarrier(client: pg.Client, mode: 'auto' | 'keyed_proof'): Promise<ContextCarrier | null> {
  const { rows } = await client.query<{ exists: boolean }>(
    "select to_regprocedure('crm.install_context_carrier(text)') is not null as exists",
  )
  if (!rows[0].exists) return null
  const installed = await client.query<{ carrier: ContextCarrier }>('select crm.install_context_carrier($1) as carrier', [mode])
  return installed.rows[0].carrier
}

/**
 * Last, at every run (sql/000035): what the files and the context carrier just made as a superuser
 * goes to crm_owner, and the database admits its own login roles alone. Null before that file.
 */
async function keepToItsOwn(client: pg.Client, logins: string[], log?: (line: string) => void): Promise<boolean | null> {
  const { rows } = await client.query<{ exists: boolean }>("select to_regprocedure('crm.disown_superuser_objects()') is not null as exists")
  if (!rows[0].exists) return null
  await client.query('select crm.disown_superuser_objects()')
  const ownLoginsOnly = await admitOwnLoginRoles(client, logins)
  if (!ownLoginsOnly)
    log?.(
      'PUBLIC keeps CONNECT on this database (the migrating role does not own it): its owner should revoke it and grant CONNECT to the login roles (docs/operations.md)',
    )
  return ownLoginsOnly
}

/** The newest migration number on disk versus in the database: /readyz answers 200 only when equal. */
export async function schemaIsCurrent(query: (text: string) => Promise<{ rows: { number: number | null }[] }>): Promise<boolean> {
  const files = readMigrationFiles()
  const newest = files.length > 0 ? files[files.length - 1].number : 0
  const { rows } = await query('select max(number) as number from crm.schema_migrations')
  return (rows[0]?.number ?? 0) === newest
}

function quietWorkerLogger() {
  return new Logger(() => () => {})
}
