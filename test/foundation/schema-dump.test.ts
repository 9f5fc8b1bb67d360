// sql/schema.sql is the dump of what the migrations make: a change to sql/ that is not reflected in
// it (or an edit of the dump by hand) fails here, with the first lines that differ.
import { readFileSync } from 'node:fs'
import t from 'tap'
import { dumpSchema, SCHEMA_FILE, schemaFileText } from '../../src/db/schema-dump.ts'
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
  t.notMatch(dump, /\bOWNER TO\b/i, 'no ownership')
})
