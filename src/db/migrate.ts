// The schema from sql/, in two kinds of file (sql/CONVENTIONS.md):
// - sql/migrations/NNNNNN_name.sql, numbered and immutable: tables, columns, indexes and data. Each
//   runs once, in its own transaction that first records its number and checksum in
//   crm.schema_migrations, so a file is applied whole or not at all;
// - sql/definitions/NN_name.sql, repeatable: the functions, views, policies, triggers, grants and
//   comments, each defined once. When one changes (its checksum in crm.schema_definitions), or a
//   migration ran, all are cleared and made again in file order, in one transaction.
// A session advisory lock serialises concurrent migrators: the second waits, then finds nothing left to do.
import { createHash } from 'node:crypto'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Logger, runMigrations as runWorkerMigrations } from 'graphile-worker'
import pg from 'pg'
import type { ContextCarrier } from './request-context.ts'
import { admitOwnLoginRoles } from './runtime-role.ts'

export const SQL_DIR = fileURLToPath(new URL('../../sql/', import.meta.url))

/** Any constant works; it only has to be the same for every migrator of this schema. */
const MIGRATION_LOCK_KEY = 727_001

export type MigrationFile = { number: number; name: string; sql: string; checksum: string }

/** A file of sql/definitions/: `NN_name.sql`, or `NN_name.variant.sql` when the database chooses one of several. */
export type DefinitionFile = {
  name: string
  variant: string | null
  file: string
  sql: string
  checksum: string
  /** On a new database, applied right after this numbered migration (`-- needs migration N`); else after the last. */
  needsMigration: number | null
}

export class MigrationError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'MigrationError'
  }
}

function sha256(text: string): string {
  return createHash('sha256').update(text).digest('hex')
}

export function readMigrationFiles(dir = join(SQL_DIR, 'migrations')): MigrationFile[] {
  return readdirSync(dir)
    .filter((name) => /^\d{6}_[a-z0-9_]+\.sql$/.test(name))
    .sort()
    .map((name) => {
      const sql = readFileSync(join(dir, name), 'utf8')
      return { number: Number(name.slice(0, 6)), name, sql, checksum: sha256(sql) }
    })
}

export function readDefinitionFiles(dir = join(SQL_DIR, 'definitions')): DefinitionFile[] {
  return readdirSync(dir)
    .map((file) => ({ file, parts: /^(\d{2}_[a-z0-9_]+)(?:\.([a-z0-9_]+))?\.sql$/.exec(file) }))
    .filter((entry): entry is { file: string; parts: RegExpExecArray } => entry.parts !== null)
    .sort((a, b) => a.file.localeCompare(b.file))
    .map(({ file, parts }) => {
      const sql = readFileSync(join(dir, file), 'utf8')
      const needs = /^-- needs migration (\d+)$/m.exec(sql)
      return {
        name: parts[1],
        variant: parts[2] ?? null,
        file,
        sql,
        checksum: sha256(sql),
        needsMigration: needs ? Number(needs[1]) : null,
      }
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
  comment on table crm.schema_migrations is 'One row per applied numbered migration (sql/migrations/), with its sha256.';
  create table if not exists crm.schema_definitions (
    name text primary key,
    variant text,
    checksum text not null,
    applied_at timestamptz not null default now()
  );
  comment on table crm.schema_definitions is
    'One row per definition file of sql/definitions/ in force: the variant this database uses (ids by server version, the request context''s carrier) and its sha256.';
`

export type { ContextCarrier } from './request-context.ts'

/** What decides the variant of a definition file that has several. */
type DatabaseFacts = { serverVersion: number; contextCarrier: ContextCarrier }

const VARIANT_CHOOSERS: Record<string, (facts: DatabaseFacts) => string> = {
  '01_ids': (facts) => (facts.serverVersion >= 180000 ? 'from_18' : 'before_18'),
  '02_request_context': (facts) => facts.contextCarrier,
}

/** One file per definition name: the only one, or the variant its chooser picks for this database. */
export function chooseDefinitions(files: DefinitionFile[], facts: DatabaseFacts): DefinitionFile[] {
  const chosen: DefinitionFile[] = []
  for (const name of [...new Set(files.map((file) => file.name))]) {
    const candidates = files.filter((file) => file.name === name)
    const choose = VARIANT_CHOOSERS[name]
    if (!choose) {
      if (candidates.length > 1 || candidates[0].variant !== null) {
        throw new MigrationError(`sql/definitions/${candidates[0].file} has variants but nothing in src/db/migrate.ts chooses one`)
      }
      chosen.push(candidates[0])
      continue
    }
    const variant = choose(facts)
    const file = candidates.find((candidate) => candidate.variant === variant)
    if (!file) throw new MigrationError(`sql/definitions/ has no ${name}.${variant}.sql`)
    chosen.push(file)
  }
  return chosen
}

export type MigrateResult = {
  applied: string[]
  alreadyApplied: number
  /** The definition files applied in this run (none when nothing changed). */
  definitions: string[]
  contextCarrier: ContextCarrier
  /** Whether the database admits its own login roles alone (false: the migrating role does not own it). */
  ownLoginsOnly: boolean
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
  const sqlDir = options.dir ?? SQL_DIR
  const files = readMigrationFiles(join(sqlDir, 'migrations'))
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  const applied: string[] = []
  try {
    await client.query('select pg_advisory_lock($1)', [MIGRATION_LOCK_KEY])
    await client.query(LEDGER_DDL)
    await convertLedgerOfTheFold(client, files, options.log)
    const facts = await databaseFacts(client, options.contextCarrier ?? 'auto')
    const definitions = chooseDefinitions(readDefinitionFiles(join(sqlDir, 'definitions')), facts)
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
      await inTransaction(client, `migration ${file.name}`, async () => {
        // Recorded first: a concurrent migrator that slipped past the lock fails on the key at once.
        await client.query('insert into crm.schema_migrations (number, name, checksum) values ($1, $2, $3)', [
          file.number,
          file.name,
          file.checksum,
        ])
        await client.query(file.sql)
        // What the next migrations' tables call (their ids, checks, defaults) comes right after the
        // migration it needs, on a new database; everything is applied again below.
        for (const definition of definitions.filter((candidate) => candidate.needsMigration === file.number)) {
          await applyDefinition(client, definition)
        }
      })
      applied.push(file.name)
      options.log?.(`applied ${file.name}`)
    }
    const definitionsApplied = await applyDefinitions(client, definitions, applied.length > 0)
    for (const file of definitionsApplied) options.log?.(`applied definitions ${file}`)
    await runWorkerMigrations({ connectionString: databaseUrl, logger: quietWorkerLogger() })
    // graphile-worker's schema exists only now: the worker's login role gets its queue (every time,
    // so a graphile-worker upgrade's new tables are covered too).
    await client.query('select crm.grant_job_queue_to_worker()')
    const ownLoginsOnly = await keepToItsOwn(client, options.logins ?? [], options.log)
    return {
      applied,
      alreadyApplied: files.length - applied.length,
      definitions: definitionsApplied,
      contextCarrier: facts.contextCarrier,
      ownLoginsOnly,
    }
  } finally {
    await client.query('select pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]).catch(() => {})
    await client.end()
  }
}

async function inTransaction(client: pg.Client, what: string, work: () => Promise<void>): Promise<void> {
  await client.query('begin')
  try {
    await work()
    await client.query('commit')
  } catch (error) {
    await client.query('rollback')
    throw new MigrationError(`${what} failed and was rolled back: ${(error as Error).message}`)
  }
}

/**
 * The carrier: the parameter when the migrating role may set backtrace_functions (GRANT SET ON
 * PARAMETER, made by sql/migrations/000001 as a superuser) and the operator did not ask for the keyed proof.
 */
async function databaseFacts(client: pg.Client, mode: 'auto' | 'keyed_proof'): Promise<DatabaseFacts> {
  const { rows } = await client.query<{ version: number; may_set: boolean }>(
    `select current_setting('server_version_num')::int as version,
            pg_catalog.has_parameter_privilege('backtrace_functions', 'SET') as may_set`,
  )
  return { serverVersion: rows[0].version, contextCarrier: mode !== 'keyed_proof' && rows[0].may_set ? 'parameter' : 'keyed_proof' }
}

async function applyDefinition(client: pg.Client, definition: DefinitionFile): Promise<void> {
  try {
    // Bodies are checked when called, not when made: a function may name one defined further on.
    await client.query('set local check_function_bodies = off')
    await client.query(definition.sql)
  } catch (error) {
    throw new Error(`sql/definitions/${definition.file}: ${(error as Error).message}`)
  }
}

/**
 * When a definition file, the variant in force or the tables changed: every definition made again,
 * in one transaction, in file order. First what the files define is cleared (triggers, policies,
 * views, the functions no table calls, every grant on crm's tables, sequences and functions), so
 * what stands afterwards is exactly what the files say: a function deleted from its file is gone.
 */
async function applyDefinitions(client: pg.Client, definitions: DefinitionFile[], tablesChanged: boolean): Promise<string[]> {
  const { rows } = await client.query<{ name: string; variant: string | null; checksum: string }>(
    'select name, variant, checksum from crm.schema_definitions',
  )
  const recorded = new Map(rows.map((row) => [row.name, row]))
  const current =
    !tablesChanged &&
    rows.length === definitions.length &&
    definitions.every((file) => recorded.get(file.name)?.checksum === file.checksum && recorded.get(file.name)?.variant === file.variant)
  if (current) return []
  await inTransaction(client, 'the definitions of sql/definitions/', async () => {
    for (const statement of await clearingStatements(client)) await client.query(statement)
    for (const definition of definitions) await applyDefinition(client, definition)
    // No function of crm is PUBLIC's: PostgreSQL grants EXECUTE to PUBLIC on every new one.
    await client.query('revoke execute on all functions in schema crm from public')
    await client.query('delete from crm.schema_definitions')
    for (const definition of definitions) {
      await client.query('insert into crm.schema_definitions (name, variant, checksum) values ($1, $2, $3)', [
        definition.name,
        definition.variant,
        definition.checksum,
      ])
    }
  })
  return definitions.map((definition) => definition.file)
}

/** What clears the definitions from crm before they are made again (see applyDefinitions). */
async function clearingStatements(client: pg.Client): Promise<string[]> {
  const { rows } = await client.query<{ statement: string | null }>(
    `with recursive called_by_tables(oid) as (
       select d.refobjid from pg_depend d
        where d.refclassid = 'pg_proc'::regclass
          and d.classid in ('pg_attrdef'::regclass, 'pg_constraint'::regclass, 'pg_class'::regclass, 'pg_type'::regclass)
       union
       select d.refobjid from pg_depend d join called_by_tables c on d.classid = 'pg_proc'::regclass and d.objid = c.oid
        where d.refclassid = 'pg_proc'::regclass
     ), crm_relations as (
       select c.oid, c.relkind from pg_class c
        where c.relnamespace = 'crm'::regnamespace
          and not exists (select from pg_depend d where d.classid = 'pg_class'::regclass and d.objid = c.oid and d.deptype = 'e')
     ), grantees as (
       select distinct x.grantee from pg_class c, aclexplode(c.relacl) x
        where c.relnamespace = 'crm'::regnamespace and x.grantee <> c.relowner
       union
       select distinct x.grantee from pg_proc p, aclexplode(p.proacl) x
        where p.pronamespace = 'crm'::regnamespace and x.grantee <> p.proowner
     ), grantee_list as (
       select string_agg(case when grantee = 0 then 'public' else quote_ident(pg_get_userbyid(grantee)) end, ', ') as list from grantees
     )
     select format('drop trigger %I on %s', t.tgname, t.tgrelid::regclass) as statement
       from pg_trigger t join crm_relations r on r.oid = t.tgrelid where not t.tgisinternal
     union all
     select format('drop policy %I on %s', p.polname, p.polrelid::regclass)
       from pg_policy p join crm_relations r on r.oid = p.polrelid
     union all
     select 'drop view ' || string_agg(r.oid::regclass::text, ', ') from crm_relations r where r.relkind = 'v' having count(*) > 0
     union all
     select 'drop routine ' || string_agg(p.oid::regprocedure::text, ', ')
       from pg_proc p
      where p.pronamespace = 'crm'::regnamespace and p.oid not in (select oid from called_by_tables)
        and not exists (select from pg_depend d where d.classid = 'pg_proc'::regclass and d.objid = p.oid and d.deptype = 'e')
     having count(*) > 0
     union all
     select format('revoke all on all tables in schema crm from %s', list) from grantee_list where list is not null
     union all
     select format('revoke all on all sequences in schema crm from %s', list) from grantee_list where list is not null
     union all
     select format('revoke all on all functions in schema crm from %s', list) from grantee_list where list is not null`,
  )
  return rows.flatMap((row) => (row.statement === null ? [] : [row.statement]))
}

/**
 * A database migrated by the numbered files before the fold into sql/migrations/ and sql/definitions/
 * (000001_foundation.sql to 000036_association_events_and_recent_sign_in.sql): its ledger is rewritten
 * to the files that now make the same tables, and its definitions are made again from sql/definitions/.
 */
async function convertLedgerOfTheFold(client: pg.Client, files: MigrationFile[], log?: (line: string) => void): Promise<void> {
  const { rows } = await client.query<{ name: string }>('select name from crm.schema_migrations order by number')
  const names = new Set(rows.map((row) => row.name))
  const current = new Set(files.map((file) => file.name))
  if (!rows.some((row) => BEFORE_THE_FOLD.includes(row.name) && !current.has(row.name))) return
  const missing = BEFORE_THE_FOLD.slice(0, FOLD_BASE).filter((name) => !names.has(name))
  const unknown = [...names].filter((name) => !BEFORE_THE_FOLD.includes(name))
  if (missing.length > 0 || unknown.length > 0) {
    throw new MigrationError(
      `this database was migrated by numbered files from before the fold into sql/migrations/ and sql/definitions/, but not by every file up to ${BEFORE_THE_FOLD[FOLD_BASE - 1]} (missing ${missing.join(', ') || 'none'}; unknown ${unknown.join(', ') || 'none'}); migrate it with an earlier version first`,
    )
  }
  // The files of the fold that stand for what those files made: the baseline, and each later file
  // whose table change an old file had already made.
  const standIn = files.filter(
    (file) => file.number <= FOLD_BASELINE_LAST || FOLD_LATER_CHANGES.some(([old, now]) => now === file.name && names.has(old)),
  )
  await inTransaction(client, 'rewriting the ledger of the fold', async () => {
    await client.query('delete from crm.schema_migrations')
    for (const file of standIn) {
      await client.query('insert into crm.schema_migrations (number, name, checksum) values ($1, $2, $3)', [
        file.number,
        file.name,
        file.checksum,
      ])
    }
  })
  log?.(`rewrote the ledger of ${rows.length} files from before the fold as ${standIn.map((file) => file.name).join(', ')}`)
}

/** The numbered files before the fold, in order; a database they migrated up to FOLD_BASE files or more converts. */
const BEFORE_THE_FOLD = [
  '000001_foundation.sql',
  '000002_tenancy.sql',
  '000003_records.sql',
  '000004_members.sql',
  '000005_webhooks.sql',
  '000006_imports.sql',
  '000007_ui.sql',
  '000008_attempt_limits.sql',
  '000009_least_privilege.sql',
  '000010_token_scopes.sql',
  '000011_scoped_access.sql',
  '000012_oauth.sql',
  '000013_runtime_confinement.sql',
  '000014_webhook_operations.sql',
  '000015_csv_text_cell.sql',
  '000016_cached_identity.sql',
  '000017_rate_limit_settling.sql',
  '000018_one_level_context_checks.sql',
  '000019_fan_out_jobs_keyed_by_event.sql',
  '000020_confinement_check_inlined.sql',
  '000021_credentials_never_widen.sql',
  '000022_oauth_client_workspace_for_members.sql',
  '000023_withdrawn_imports_and_webhook_operation_limits.sql',
  '000024_uuid_v7_sub_millisecond.sql',
  '000025_context_carrier.sql',
  '000026_attempt_retry_within_window.sql',
  '000027_token_in_context.sql',
  '000028_unused_functions_dropped.sql',
  '000029_context_kept_with_the_token.sql',
  '000030_identity_resumed_in_steps.sql',
  '000031_counts_with_their_transaction.sql',
  '000032_context_writer_inlined.sql',
  '000033_scoped_credentials_only_narrow.sql',
  '000034_read_only_requests_keep_no_bookkeeping.sql',
  '000035_own_logins_only_and_no_superuser_owner.sql',
  '000036_association_events_and_recent_sign_in.sql',
]
/** The tables of 000001 to 000032 (the first release candidate) are those of sql/migrations/000001 to 000007. */
const FOLD_BASE = 32
const FOLD_BASELINE_LAST = 7
/** Table changes made after FOLD_BASE by an old file, and the numbered file that makes them now. */
const FOLD_LATER_CHANGES: [string, string][] = [['000036_association_events_and_recent_sign_in.sql', '000008_tokens_authenticated_at.sql']]

/**
 * Files of the pre-release migrations (0.1.0 and earlier) that an earlier baseline replaced.
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
    `this database records migration ${name}, which is not in sql/migrations/: it was migrated by other migration files than these (a newer version?)`,
  )
}

/**
 * Last, at every run (crm.disown_superuser_objects, crm.admit_to_database): what the migration just
 * made as a superuser goes to crm_owner, and the database admits its own login roles alone.
 */
async function keepToItsOwn(client: pg.Client, logins: string[], log?: (line: string) => void): Promise<boolean> {
  await client.query('select crm.disown_superuser_objects()')
  const ownLoginsOnly = await admitOwnLoginRoles(client, logins)
  if (!ownLoginsOnly)
    log?.(
      'PUBLIC keeps CONNECT on this database (the migrating role does not own it): its owner should revoke it and grant CONNECT to the login roles (docs/operations.md)',
    )
  return ownLoginsOnly
}

/** Whether the newest migration number the database records is the newest on disk: /readyz answers 200 only then. */
export function schemaIsCurrent(recordedNewest: number | null): boolean {
  const files = readMigrationFiles()
  return (recordedNewest ?? 0) === (files.length > 0 ? files[files.length - 1].number : 0)
}

function quietWorkerLogger() {
  return new Logger(() => () => {})
}
