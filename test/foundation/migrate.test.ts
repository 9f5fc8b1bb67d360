import { appendFileSync, cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { MigrationError, migrate, readMigrationFiles, SQL_DIR } from '../../src/db/migrate.ts'
import { adminQuery, createEmptyDatabase, ownerClient } from '../helpers/database.ts'

function copyOfSqlDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'crm-sql-'))
  cpSync(SQL_DIR, dir, { recursive: true })
  return dir
}

t.test('two migrators at once both succeed and the schema is applied once', async (t) => {
  const url = await createEmptyDatabase(t)
  const [a, b] = await Promise.all([migrate(url), migrate(url)])
  const files = readMigrationFiles()
  t.equal(a.applied.length + b.applied.length, files.length, 'every file applied exactly once between them')
  const client = await ownerClient(t, url)
  const { rows } = await client.query('select number, checksum from crm.schema_migrations order by number')
  t.same(
    rows.map((row) => row.number),
    files.map((file) => file.number),
  )
  t.same(
    rows.map((row) => row.checksum),
    files.map((file) => file.checksum),
  )
  const { rows: worker } = await client.query(
    "select count(*)::int as n from information_schema.schemata where schema_name = 'graphile_worker'",
  )
  t.equal(worker[0].n, 1, 'graphile-worker schema installed by the same command')
  const again = await migrate(url)
  t.same(again.applied, [], 'running it again is a no-op')
})

t.test('a migration whose file changed after it was applied is refused', async (t) => {
  const url = await createEmptyDatabase(t)
  const dir = copyOfSqlDir()
  await migrate(url, { dir })
  appendFileSync(join(dir, 'migrations', '000001_foundation.sql'), '\n-- edited\n')
  const error = await migrate(url, { dir }).catch((caught) => caught)
  t.type(error, MigrationError)
  t.match(error.message, /000001_foundation\.sql was changed after it was applied/)
})

t.test('a failing migration leaves nothing half-applied', async (t) => {
  const url = await createEmptyDatabase(t)
  const dir = copyOfSqlDir()
  writeFileSync(join(dir, 'migrations', '999998_good.sql'), 'create table crm.migration_probe_a (id int);')
  writeFileSync(join(dir, 'migrations', '999999_broken.sql'), 'create table crm.migration_probe_b (id int);\nselect * from no_such_table;')
  const error = await migrate(url, { dir }).catch((caught) => caught)
  t.type(error, MigrationError)
  t.match(error.message, /999999_broken\.sql failed and was rolled back/)
  const client = await ownerClient(t, url)
  const { rows } = await client.query("select to_regclass('crm.migration_probe_a') as a, to_regclass('crm.migration_probe_b') as b")
  t.equal(rows[0].a, 'crm.migration_probe_a', 'earlier files stay applied')
  t.equal(rows[0].b, null, 'the failing file left nothing')
  const { rows: recorded } = await client.query('select count(*)::int as n from crm.schema_migrations where number = 999999')
  t.equal(recorded[0].n, 0)
})

t.test('a database migrated by the pre-release files is told to be recreated, not that 000001 changed', async (t) => {
  const url = await createEmptyDatabase(t)
  const client = await ownerClient(t, url)
  await client.query(`create schema crm;
    create table crm.schema_migrations (number integer primary key, name text not null, checksum text not null, applied_at timestamptz not null default now());
    insert into crm.schema_migrations (number, name, checksum) values
      (1, '000001_foundation.sql', 'a pre-release checksum'), (15, '000015_webhook_plans_without_statistics.sql', 'another')`)
  const error = await migrate(url).catch((caught) => caught)
  t.type(error, MigrationError)
  t.match(
    error.message,
    /migrated by the pre-release migration files \(it records 000015_webhook_plans_without_statistics\.sql\), which were folded into a new baseline; recreate it \(`make clean` removes/,
  )
  t.notMatch(error.message, /changed after it was applied/)
  const { rows } = await client.query('select count(*)::int as n from crm.schema_migrations')
  t.equal(rows[0].n, 2, 'nothing was applied')
})

t.test('a database that records a migration file this checkout does not have is refused', async (t) => {
  const url = await createEmptyDatabase(t)
  const dir = copyOfSqlDir()
  writeFileSync(join(dir, 'migrations', '999999_from_elsewhere.sql'), 'select 1;')
  await migrate(url, { dir })
  const error = await migrate(url).catch((caught) => caught)
  t.type(error, MigrationError)
  t.match(error.message, /records migration 999999_from_elsewhere\.sql, which is not in sql\/migrations\//)
})

t.test('a changed definition file makes every definition again; what a file no longer defines is gone', async (t) => {
  const url = await createEmptyDatabase(t)
  const dir = copyOfSqlDir()
  const records = join(dir, 'definitions', '30_records.sql')
  appendFileSync(
    records,
    '\ncreate function crm.definition_probe() returns int language sql return 1;\ngrant execute on function crm.definition_probe() to crm_api;\n',
  )
  await migrate(url, { dir })
  const client = await ownerClient(t, url)
  const probe = async () =>
    (await client.query("select to_regprocedure('crm.definition_probe()') is not null as defined")).rows[0].defined as boolean
  t.equal(await probe(), true, 'the function a definition file adds is made')
  t.same((await migrate(url, { dir })).definitions, [], 'nothing changed: nothing is made again')

  writeFileSync(records, readFileSync(records, 'utf8').replace(/\ncreate function crm\.definition_probe[\s\S]*$/, '\n'))
  const again = await migrate(url, { dir })
  t.ok(again.definitions.includes('30_records.sql'), 'the changed file is applied again, with the others')
  t.equal(await probe(), false, 'a function taken out of its file is dropped')
  const { rows } = await client.query(
    `select count(*)::int as n from pg_proc p where p.pronamespace = 'crm'::regnamespace
        and exists (select from aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) x where x.grantee = 0)`,
  )
  t.equal(rows[0].n, 0, 'no function of crm is executable by PUBLIC after the definitions are made again')
})

t.test('a failing definition file leaves the definitions as they were', async (t) => {
  const url = await createEmptyDatabase(t)
  const dir = copyOfSqlDir()
  await migrate(url, { dir })
  const client = await ownerClient(t, url)
  const policies = async () => (await client.query('select count(*)::int as n from pg_policies where schemaname = $1', ['crm'])).rows[0].n
  const before = await policies()
  appendFileSync(join(dir, 'definitions', '70_oauth.sql'), '\nselect * from no_such_table;\n')
  const error = await migrate(url, { dir }).catch((caught) => caught)
  t.type(error, MigrationError)
  t.match(
    error.message,
    /definitions of sql\/definitions\/ failed and was rolled back: sql\/definitions\/70_oauth\.sql: relation "no_such_table" does not exist/,
  )
  t.equal(await policies(), before, 'every policy is still there')
})

t.test('the API role is created by a migration and cannot log in', async (t) => {
  const { rows } = await adminQuery("select rolcanlogin, rolsuper, rolbypassrls from pg_roles where rolname = 'crm_api'")
  t.same(rows, [{ rolcanlogin: false, rolsuper: false, rolbypassrls: false }])
})
