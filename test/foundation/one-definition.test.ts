// One definition per SQL object: every function, view, policy and trigger of crm is created by one
// file of sql/ (the variants of a definition file, of which a database applies one, count as one
// file), none is made from a string at migrate time, and the migrated database holds no routine,
// view, policy or trigger that no file creates.
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { SQL_DIR } from '../../src/db/migrate.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'

type SqlFile = { slot: string; path: string; text: string }

/** The files of sql/migrations/ and sql/definitions/; a definition file's variants share its slot. */
function sqlFiles(): SqlFile[] {
  return ['migrations', 'definitions'].flatMap((dir) =>
    readdirSync(join(SQL_DIR, dir))
      .filter((name) => name.endsWith('.sql'))
      .map((name) => ({
        slot: `${dir}/${name.replace(/\.[a-z0-9_]+\.sql$/, '').replace(/\.sql$/, '')}`,
        path: `sql/${dir}/${name}`,
        text: readFileSync(join(SQL_DIR, dir, name), 'utf8'),
      })),
  )
}

const normalise = (text: string) => text.toLowerCase().replace(/\s+/g, ' ').replace(/\( /g, '(').replace(/ \)/g, ')').trim()

/** What a text creates, as `kind name`: routines with their argument list, views, policies and triggers with their table. */
export function createdObjects(text: string): string[] {
  const found: string[] = []
  const routine = /create\s+(?:or\s+replace\s+)?(function|procedure)\s+(crm\.\w+)\s*\(/gi
  for (let match = routine.exec(text); match; match = routine.exec(text)) {
    let depth = 1
    let end = routine.lastIndex
    while (depth > 0 && end < text.length) {
      if (text[end] === '(') depth++
      if (text[end] === ')') depth--
      end++
    }
    const args = text
      .slice(routine.lastIndex, end - 1)
      .split(',')
      .map((arg) => normalise(arg).replace(/ default .*$/, ''))
      .join(', ')
    found.push(`routine ${match[2].toLowerCase()}(${args})`)
  }
  for (const match of text.matchAll(/create\s+(?:or\s+replace\s+)?(?:materialized\s+)?view\s+(crm\.\w+)/gi)) found.push(`view ${match[1]}`)
  for (const match of text.matchAll(/create\s+policy\s+(\w+)\s+on\s+(crm\.\w+)/gi)) found.push(`policy ${match[1]} on ${match[2]}`)
  for (const match of text.matchAll(/create\s+(?:or\s+replace\s+)?(?:constraint\s+)?trigger\s+(\w+)\s[\s\S]*?\bon\s+(crm\.\w+)/gi)) {
    found.push(`trigger ${match[1]} on ${match[2]}`)
  }
  return found
}

/** Objects created in more than one slot, with the files. */
export function definedTwice(files: SqlFile[]): string[] {
  const slots = new Map<string, Set<string>>()
  for (const file of files) {
    for (const object of createdObjects(file.text)) {
      if (!slots.has(object)) slots.set(object, new Set())
      slots.get(object)?.add(file.slot)
    }
  }
  return [...slots].filter(([, where]) => where.size > 1).map(([object, where]) => `${object}: ${[...where].join(', ')}`)
}

t.test('every function, view, policy and trigger is created in one file of sql/', async (t) => {
  const files = sqlFiles()
  t.ok(
    files.some((file) => createdObjects(file.text).length > 100),
    'the scanner finds the definitions (a file defines over 100 objects)',
  )
  t.same(definedTwice(files), [])
  const twice = [
    ...files,
    { slot: 'definitions/99_copy', path: 'copy', text: files.find((file) => file.path.endsWith('30_records.sql'))?.text ?? '' },
  ]
  t.ok(definedTwice(twice).length > 30, 'a file copied under another name is caught, object by object')
})

/**
 * The functions that may run DDL from a string, on objects outside crm whose names exist only when
 * they run: graphile-worker's tables (made by its own migrations, after sql/) and this database.
 */
const DYNAMIC_DDL_OUTSIDE_CRM = ['crm.grant_job_queue_to_worker', 'crm.admit_to_database']

t.test('nothing of crm is created from a string at migrate time', async (t) => {
  const fromStrings = sqlFiles().flatMap((file) =>
    [...file.text.matchAll(/execute\s+(?:format\s*\(\s*)?(?:\$\w*\$|')\s*(create|alter|drop|comment|grant|revoke)\b[^;]*/gi)]
      .filter((match) => {
        const enclosing = [...file.text.slice(0, match.index).matchAll(/create\s+or\s+replace\s+function\s+(crm\.\w+)/gi)].at(-1)?.[1]
        return !DYNAMIC_DDL_OUTSIDE_CRM.includes(enclosing ?? '')
      })
      .map((match) => `${file.path}: ${match[0].slice(0, 80)}`),
  )
  t.same(fromStrings, [], 'no EXECUTE of a CREATE, ALTER, DROP, COMMENT, GRANT or REVOKE built from a string')
  const before = readFileSync(new URL('../fixtures/schema-a38c368/000025_context_carrier.sql', import.meta.url), 'utf8')
  t.ok(/execute\s+format\(\$ddl\$\s*create/i.test(before), 'the check finds what the files before the fold did (000025)')
})

t.test('the migrated database holds nothing that no file creates', async (t) => {
  const client = await ownerClient(t, await createTestDatabase(t))
  const created = new Set(sqlFiles().flatMap((file) => createdObjects(file.text).map((object) => object.replace(/\(.*$/, ''))))
  const { rows } = await client.query<{ object: string }>(
    `select 'routine crm.' || p.proname as object from pg_proc p
      where p.pronamespace = 'crm'::regnamespace
        and not exists (select from pg_depend d where d.classid = 'pg_proc'::regclass and d.objid = p.oid and d.deptype = 'e')
     union
     select 'view crm.' || c.relname from pg_class c where c.relnamespace = 'crm'::regnamespace and c.relkind in ('v', 'm')
     union
     select format('policy %s on crm.%s', p.polname, c.relname) from pg_policy p join pg_class c on c.oid = p.polrelid
      where c.relnamespace = 'crm'::regnamespace
     union
     select format('trigger %s on crm.%s', g.tgname, c.relname) from pg_trigger g join pg_class c on c.oid = g.tgrelid
      where c.relnamespace = 'crm'::regnamespace and not g.tgisinternal`,
  )
  t.ok(rows.length > 300, 'the catalog lists the schema')
  t.same(
    rows.map((row) => row.object.toLowerCase()).filter((object) => !created.has(object)),
    [],
    'every routine, view, policy and trigger of crm is created by name in a file of sql/',
  )
})
