// sql/000012_oauth.sql meets databases in two states: migrated from scratch (000013, which gives
// every table FORCE ROW LEVEL SECURITY and the owner's policy, runs after it) and migrated up to
// 000014 before it arrived (000013 ran already, so 000012 creates the owner's policies itself).
// Both end in the same schema, sql/schema.sql.
import { randomBytes } from 'node:crypto'
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { migrate, SQL_DIR } from '../../src/db/migrate.ts'
import { dumpSchema, SCHEMA_FILE, schemaFileText } from '../../src/db/schema-dump.ts'
import { adminQuery, databaseUrl, ownerClient } from '../helpers/database.ts'
import { comparableDump } from '../helpers/schema.ts'

t.test('000012 applied after 000013 and 000014 gives the schema of a fresh database', async (t) => {
  const name = `crm_order_${randomBytes(4).toString('hex')}`
  await adminQuery(`create database ${name}`)
  t.teardown(() => adminQuery(`drop database if exists ${name} with (force)`))
  const url = databaseUrl(name)

  const withoutOAuth = mkdtempSync(join(tmpdir(), 'crm-sql-'))
  t.teardown(() => rmSync(withoutOAuth, { recursive: true, force: true }))
  // The files as they were then: up to 000014, without 000012 (later files may build on 000012).
  cpSync(SQL_DIR, withoutOAuth, { recursive: true })
  const later = readdirSync(withoutOAuth).filter((file) => /^\d{6}_.*\.sql$/.test(file) && Number(file.slice(0, 6)) > 14)
  for (const file of [...later, '000012_oauth.sql']) rmSync(join(withoutOAuth, file))

  const before = await migrate(url, { dir: withoutOAuth })
  t.ok(before.applied.includes('000013_runtime_confinement.sql') && before.applied.includes('000014_webhook_operations.sql'))
  const after = await migrate(url)
  t.same(after.applied, ['000012_oauth.sql', ...later.sort()], 'the OAuth file is applied, then the files after 000014')

  const client = await ownerClient(t, url)
  const dump = schemaFileText(await dumpSchema(client))
  t.equal(
    (await comparableDump(client, dump)) === (await comparableDump(client, readFileSync(SCHEMA_FILE, 'utf8'))),
    true,
    'the dump equals sql/schema.sql',
  )
  const { rows } = await client.query(
    `select c.relname from pg_class c
      where c.relnamespace = 'crm'::regnamespace and c.relname like 'oauth\\_%' and c.relkind = 'r'
        and c.relforcerowsecurity and exists (select from pg_policy p where p.polrelid = c.oid and p.polname = c.relname || '_all_owner')
      order by 1`,
  )
  t.same(
    rows.map((row) => row.relname),
    ['oauth_apps', 'oauth_codes', 'oauth_grants', 'oauth_refresh_tokens'],
  )
})
