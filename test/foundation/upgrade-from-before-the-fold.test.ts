// A database migrated by the numbered files of a38c368 (the last main before sql/ was folded into
// sql/migrations/ and sql/definitions/; those files are kept as they were in
// test/fixtures/schema-a38c368/) upgrades with `crm migrate` to exactly the schema of a new database:
// the catalog dump of both is the same, on whichever PostgreSQL the suite runs (15 and 18 in CI),
// and so is `pg_dump -s` where the server's own pg_dump is installed. What each member may do is
// the same before and after: the permission matrix, every member's access and what each member sees
// through crm.act_as.
import { execFileSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { Logger, runMigrations as runWorkerMigrations } from 'graphile-worker'
import pg from 'pg'
import t from 'tap'
import { migrate } from '../../src/db/migrate.ts'
import { dumpSchema } from '../../src/db/schema-dump.ts'
import { createEmptyDatabase, testPostgresBuild } from '../helpers/database.ts'

const BEFORE_THE_FOLD = new URL('../fixtures/schema-a38c368/', import.meta.url).pathname

async function withClient<T>(url: string, work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return await work(client)
  } finally {
    await client.end()
  }
}

/** What a38c368's `crm migrate` did: each file in a transaction with its ledger row, then the queue and the carrier. */
async function migrateAsBeforeTheFold(url: string): Promise<void> {
  await withClient(url, async (client) => {
    await client.query(`create schema if not exists crm;
      create table if not exists crm.schema_migrations (number integer primary key, name text not null, checksum text not null,
                                                        applied_at timestamptz not null default now());
      comment on table crm.schema_migrations is 'One row per applied sql/ migration file, with its sha256.';`)
    for (const name of readdirSync(BEFORE_THE_FOLD).sort()) {
      const sql = readFileSync(join(BEFORE_THE_FOLD, name), 'utf8')
      await client.query('begin')
      await client.query('insert into crm.schema_migrations (number, name, checksum) values ($1, $2, $3)', [
        Number(name.slice(0, 6)),
        name,
        createHash('sha256').update(sql).digest('hex'),
      ])
      await client.query(sql)
      await client.query('commit')
    }
    await runWorkerMigrations({ connectionString: url, logger: new Logger(() => () => {}) })
    await client.query('select crm.grant_job_queue_to_worker()')
    await client.query(`select crm.install_context_carrier('auto')`)
  })
}

/** Two workspaces with members of each built-in role, a team, records of several owners. */
async function addMembersAndRecords(url: string): Promise<void> {
  await withClient(url, async (client) => {
    for (const [email, workspace] of [
      ['ada@example.com', 'Analytical'],
      ['grace@example.com', 'Compilers'],
    ]) {
      await client.query(`select * from crm.sign_up($1, $2, 'not a hash', $3, lower($3), $4, interval '1 day')`, [
        email,
        email.split('@')[0],
        workspace,
        randomBytes(32),
      ])
    }
    await client.query(`
      insert into crm.users (email, name, password_hash) values ('bob@example.com', 'bob', 'x'), ('eve@example.com', 'eve', 'x');
      insert into crm.memberships (workspace_id, user_id, role_id)
        select w.id, u.id, r.id from crm.workspaces w, crm.users u, crm.roles r
         where w.slug = 'analytical' and r.workspace_id = w.id
           and ((u.email = 'bob@example.com' and r.name = 'member') or (u.email = 'eve@example.com' and r.name = 'read_only'));`)
    for (const email of ['ada@example.com', 'bob@example.com', 'eve@example.com', 'grace@example.com']) {
      const slug = email === 'grace@example.com' ? 'compilers' : 'analytical'
      await client.query('begin')
      const { rows } = await client.query<{ may: boolean }>(
        `select crm.act_as($1, $2), exists (select from crm.role_grants g join crm.memberships m on m.role_id = g.role_id
                                             where m.user_id = crm.current_user_id() and g.resource = 'contacts' and g.action = 'create') as may`,
        [email, slug],
      )
      if (rows[0].may) {
        await client.query(`insert into crm.contacts (first_name, email) values ($1, $2)`, [email.split('@')[0], `c.${email}`])
        await client.query(`insert into crm.companies (name) values ($1)`, [`${email.split('@')[0]} inc`])
      }
      await client.query('commit')
    }
  })
}

const TABLES = ['contacts', 'companies', 'deals', 'memberships', 'roles', 'role_grants', 'users', 'workspaces', 'tokens', 'deal_stages']

/** What decides access, as a DBA reads it: the audit views, and what each member sees as themselves. */
async function accessSnapshot(url: string): Promise<Record<string, unknown>> {
  return withClient(url, async (client) => {
    const snapshot: Record<string, unknown> = {}
    for (const view of ['permission_matrix', 'member_access', 'scope_actions']) {
      const { rows } = await client.query(`select * from crm.${view}`)
      snapshot[view] = rows.map((row) => JSON.stringify(row)).sort()
    }
    for (const [email, slug] of [
      ['ada@example.com', 'analytical'],
      ['bob@example.com', 'analytical'],
      ['eve@example.com', 'analytical'],
      ['grace@example.com', 'compilers'],
    ]) {
      await client.query('begin')
      await client.query('select crm.act_as($1, $2)', [email, slug])
      const counts: Record<string, number> = {}
      for (const table of TABLES) {
        const { rows } = await client.query<{ count: number }>(`select count(*)::int as count from crm.${table}`)
        counts[table] = rows[0].count
      }
      await client.query('rollback')
      snapshot[`${email} in ${slug}`] = counts
    }
    return snapshot
  })
}

async function catalogDump(url: string): Promise<string> {
  return withClient(url, (client) => dumpSchema(client))
}

/** The server's own pg_dump -s, when a pg_dump of its major version is installed (Debian's, in CI on 15). */
function pgDumpSchema(url: string, major: number): string | null {
  const candidates = [
    testPostgresBuild() && join(testPostgresBuild() as string, 'bin', 'pg_dump'),
    `/usr/lib/postgresql/${major}/bin/pg_dump`,
  ]
  const program = candidates.find((candidate): candidate is string => typeof candidate === 'string' && existsSync(candidate))
  if (!program) return null
  return execFileSync(program, ['--schema-only', '--no-owner', '--schema=crm', url], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 })
    .split('\n')
    .filter((line) => !line.startsWith('-- Dumped') && !line.startsWith('\\restrict') && !line.startsWith('\\unrestrict'))
    .join('\n')
}

t.test('a database of a38c368 upgrades to the schema of a new one, with the same access', async (t) => {
  const upgraded = await createEmptyDatabase(t)
  await migrateAsBeforeTheFold(upgraded)
  await addMembersAndRecords(upgraded)
  const before = await accessSnapshot(upgraded)

  const result = await migrate(upgraded)
  // Every migration numbered after the fold's last (000007), however many later issues add.
  const afterTheFold = readdirSync(new URL('../../sql/migrations/', import.meta.url).pathname)
    .filter((name) => /^\d{6}_.*\.sql$/.test(name) && Number(name.slice(0, 6)) > 7)
    .sort()
  t.ok(afterTheFold.includes('000008_tokens_authenticated_at.sql'))
  t.same(result.applied, afterTheFold, 'the ledger of the fold stands for 000001 to 000007; the table changes made after it are applied')
  t.ok(result.definitions.length > 0, 'every definition is made again from sql/definitions/')

  const fresh = await createEmptyDatabase(t)
  await migrate(fresh)
  t.equal(await catalogDump(upgraded), await catalogDump(fresh), 'the catalog dump of the upgraded database is that of a new one')

  const major = await withClient(fresh, async (client) => {
    const { rows } = await client.query<{ major: number }>(`select current_setting('server_version_num')::int / 10000 as major`)
    return rows[0].major
  })
  const upgradedDump = pgDumpSchema(upgraded, major)
  if (upgradedDump === null) t.comment(`no pg_dump ${major} installed: compared by the catalog dump alone`)
  else t.equal(upgradedDump, pgDumpSchema(fresh, major), `pg_dump ${major} -s is the same`)

  t.same(await accessSnapshot(upgraded), before, 'the permission matrix, member access and what each member sees are unchanged')

  const again = await migrate(upgraded)
  t.same([again.applied, again.definitions], [[], []], 'a second run finds nothing to do')
})

t.test('a database migrated by only part of the files before the fold is refused with what to do', async (t) => {
  const partial = await createEmptyDatabase(t)
  await withClient(partial, (client) =>
    client.query(`create schema crm;
      create table crm.schema_migrations (number integer primary key, name text not null, checksum text not null,
                                          applied_at timestamptz not null default now());
      insert into crm.schema_migrations (number, name, checksum) values (1, '000001_foundation.sql', 'x'), (2, '000002_tenancy.sql', 'x');`),
  )
  await t.rejects(migrate(partial), /not by every file up to 000032_context_writer_inlined\.sql.*migrate it with an earlier version first/)
})
