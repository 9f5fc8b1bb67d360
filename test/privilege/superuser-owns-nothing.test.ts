// With the embedded PostgreSQL the migrating role is a superuser (so is the test template's, made
// by migrate() as `make run` does), and every SECURITY DEFINER function ran as it. migrate now
// gives crm_owner, which is no superuser and cannot bypass row-level security, whatever a
// superuser owns in crm and graphile-worker's queue, at every run (sql/definitions/10_foundation.sql): also the functions
// the context carrier makes again when it changes path.
import t from 'tap'
import { migrate } from '../../src/db/migrate.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'

const url = await createTestDatabase(t)
const owner = await ownerClient(t, url)

/** Every object of crm and graphile_worker, the schemas included, that a superuser owns. */
const SUPERUSER_OWNED = `
  select kind, name from (
    select 'schema' as kind, n.nspname::text as name, n.nspowner as owner from pg_namespace n
     where n.nspname in ('crm', 'graphile_worker')
    union all
    select 'relation', c.oid::regclass::text, c.relowner from pg_class c
     where c.relnamespace in ('crm'::regnamespace, 'graphile_worker'::regnamespace)
    union all
    select 'function', p.oid::regprocedure::text, p.proowner from pg_proc p
     where p.pronamespace in ('crm'::regnamespace, 'graphile_worker'::regnamespace)
    union all
    select 'type', t.oid::regtype::text, t.typowner from pg_type t
     where t.typnamespace in ('crm'::regnamespace, 'graphile_worker'::regnamespace)
  ) o join pg_roles r on r.oid = o.owner
  where r.rolsuper
  order by kind, name`

/** The SECURITY DEFINER functions of crm by who they run as. */
const DEFINERS = `
  select r.rolname as owner, r.rolsuper, r.rolbypassrls, count(*)::int as functions
    from pg_proc p join pg_roles r on r.oid = p.proowner
   where p.pronamespace = 'crm'::regnamespace and p.prosecdef
   group by 1, 2, 3`

t.test('the database was migrated as make run migrates it: by a superuser', async (t) => {
  const { rows } = await owner.query('select rolsuper from pg_roles where rolname = current_user')
  t.equal(rows[0].rolsuper, true)
})

t.test('no SECURITY DEFINER function of crm runs as a superuser', async (t) => {
  const { rows } = await owner.query(DEFINERS)
  t.same(
    rows.map(({ functions, ...owner }) => owner),
    [{ owner: 'crm_owner', rolsuper: false, rolbypassrls: false }],
  )
  t.ok(rows[0]?.functions > 50, `${rows[0]?.functions} definer functions, all crm_owner's`)
})

t.test('a superuser owns no object of crm or graphile_worker', async (t) => {
  t.same((await owner.query(SUPERUSER_OWNED)).rows, [])
})

t.test('what a superuser makes later is handed over by the next migration run', async (t) => {
  // The context carrier changing path drops and makes the writer and the policy helpers again, as
  // the migrating superuser; a file of a later version does the same.
  await migrate(url, { contextCarrier: 'keyed_proof' })
  t.same((await owner.query(SUPERUSER_OWNED)).rows, [])
  await migrate(url)
  t.same((await owner.query(SUPERUSER_OWNED)).rows, [])
  t.same(
    (await owner.query(DEFINERS)).rows.map((row) => row.owner),
    ['crm_owner'],
  )
})
