// sql/schema.sql is the dump of what the migrations make: a change to sql/ that is not reflected in
// it (or an edit of the dump by hand) fails here, with the first lines that differ.
import { readFileSync } from 'node:fs'
import t from 'tap'
import { dumpSchema, SCHEMA_FILE, schemaFileText } from '../../src/db/schema-dump.ts'
import { closingParen } from '../../src/db/sql-layout.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { comparableDump } from '../helpers/schema.ts'

/** The first lines where two texts part, with a little context, as a unified-diff-like excerpt. */
function firstDifference(committed: string, fresh: string, context = 3, shown = 12): string {
  const a = committed.split('\n')
  const b = fresh.split('\n')
  let line = 0
  while (line < a.length && line < b.length && a[line] === b[line]) line++
  const from = Math.max(0, line - context)
  const excerpt = [`first difference at line ${line + 1}:`]
  for (let i = from; i < line; i++) excerpt.push(`  ${a[i]}`)
  for (const text of a.slice(line, line + shown)) excerpt.push(`- ${text}`)
  for (const text of b.slice(line, line + shown)) excerpt.push(`+ ${text}`)
  return excerpt.join('\n')
}

t.test('sql/schema.sql is the dump of a freshly migrated database', async (t) => {
  const client = await ownerClient(t, await createTestDatabase(t))
  const fresh = await comparableDump(client, schemaFileText(await dumpSchema(client)))
  const committed = await comparableDump(client, readFileSync(SCHEMA_FILE, 'utf8'))
  if (committed === fresh) {
    t.pass('sql/schema.sql matches the migrations')
    return
  }
  t.fail(
    `sql/schema.sql differs from what the migrations make: run \`make schema\` and commit the result\n${firstDifference(committed, fresh)}`,
  )
})

t.test('the dump is the same when taken twice', async (t) => {
  const client = await ownerClient(t, await createTestDatabase(t))
  t.equal(await dumpSchema(client), await dumpSchema(client))
})

t.test('the dump shows a table with its policies and a function with its grants', async (t) => {
  const client = await ownerClient(t, await createTestDatabase(t))
  const dump = await dumpSchema(client)
  const deals = dump.indexOf('create table crm.deals (')
  t.ok(deals > 0, 'crm.deals is dumped')
  const policy = dump.indexOf('create policy deals_select_scoped on crm.deals as permissive for select to crm_api', deals)
  const nextTable = dump.indexOf('\ncreate table ', deals + 1)
  t.ok(policy > deals && policy < nextTable, 'its policies follow it, before the next table')
  t.match(
    dump,
    /CREATE OR REPLACE FUNCTION crm\.authenticate\(p_token_hash bytea[\s\S]*?SECURITY DEFINER[\s\S]*?\ngrant execute on function crm\.authenticate\(/,
  )
  // No statement of the dump sets an owner (crm.disown_superuser_objects's body names OWNER TO in its strings).
  t.notMatch(dump, /^alter\b[^\n]*\bOWNER TO\b/im, 'no ownership')
})

/** Each policy of a dump: its table, command and the expression texts as the file writes them. */
function policiesOf(dump: string) {
  const policies: { name: string; table: string; command: string; using: string | null; check: string | null }[] = []
  for (const match of dump.matchAll(/^create policy (\S+) on (\S+) as \w+ for (\w+) to [^\n]*/gm)) {
    let at = (match.index ?? 0) + match[0].length
    const clause = (keyword: string) => {
      const prefix = `\n  ${keyword} (`
      if (!dump.startsWith(prefix, at)) return null
      const open = at + prefix.length - 1
      const statement = dump.slice(open, dump.indexOf(');\n', open) + 1)
      const close = open + closingParen(statement, 0)
      at = close + 1
      return dump.slice(open + 1, close)
    }
    const using = clause('using')
    const check = clause('with check')
    policies.push({ name: match[1], table: match[2], command: match[3], using, check })
  }
  return policies
}

t.test('the policies of sql/schema.sql, laid out over lines, parse to the expressions of the catalog', async (t) => {
  // The layout changes whitespace only: each expression of the file, given to a new policy on the
  // same table, deparses to exactly what the migrated policy deparses to.
  const client = await ownerClient(t, await createTestDatabase(t))
  const policies = policiesOf(readFileSync(SCHEMA_FILE, 'utf8'))
  const { rows: catalog } = await client.query<{ count: number }>(
    `select count(*)::int as count from pg_policy p join pg_class c on c.oid = p.polrelid where c.relnamespace = 'crm'::regnamespace`,
  )
  t.equal(policies.length, catalog[0].count, 'every policy of crm is in the file')
  t.ok(
    policies.some((policy) => (policy.using ?? '').includes('\n')),
    'some expressions span lines',
  )
  const differing: string[] = []
  await client.query('begin')
  for (const policy of policies) {
    const clauses = `${policy.using === null ? '' : ` using (${policy.using})`}${policy.check === null ? '' : ` with check (${policy.check})`}`
    await client.query(`create policy schema_file_copy on ${policy.table} for ${policy.command}${clauses}`)
    const { rows } = await client.query(
      `select pg_get_expr(o.polqual, o.polrelid) is not distinct from pg_get_expr(c.polqual, c.polrelid)
              and pg_get_expr(o.polwithcheck, o.polrelid) is not distinct from pg_get_expr(c.polwithcheck, c.polrelid) as same
         from pg_policy o, pg_policy c
        where o.polrelid = $1::regclass and o.polname = $2 and c.polrelid = $1::regclass and c.polname = 'schema_file_copy'`,
      [policy.table, policy.name],
    )
    if (rows[0]?.same !== true) differing.push(policy.name)
    await client.query(`drop policy schema_file_copy on ${policy.table}`)
  }
  await client.query('rollback')
  t.same(differing, [], 'no policy reads differently')
})

t.test('an object of crm with no place in the layout fails the dump, by name', async (t) => {
  const client = await ownerClient(t, await createTestDatabase(t))
  await client.query('create table crm.unplaced_example (id integer)')
  await t.rejects(dumpSchema(client), /no place in src\/db\/schema-layout\.ts: crm\.unplaced_example\b/)
})
