// What confines the login roles of requests (crm_runtime) and jobs (crm_worker), read from the
// catalog and tried by hand: the worker role sees no record of any workspace whatever it sets in
// its session; each login role reaches only its own functions; every table forces row-level
// security; every pinned search path leaves out public; the pre-sign-in functions never hand out
// a password key and issue a token only for a password the database checked, once per claim.
import pg from 'pg'
import t from 'tap'
import { hashPassword, passwordKey } from '../../src/auth/passwords.ts'
import { hashToken } from '../../src/auth/tokens.ts'
import { ensureRuntimeRole, ensureWorkerRole, loginRoleName, RUNTIME_ROLE, WORKER_ROLE } from '../../src/db/runtime-role.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { createTenant, TEST_PASSWORD, withOwner } from '../helpers/fixtures.ts'
import { TEST_APP_SECRET } from '../helpers/server.ts'

const url = await createTestDatabase(t)
const a = await createTenant(url, { slug: 'confine-a', plan: 'pro', members: { 'admin@a.test': 'admin' } })
const ownerName = decodeURIComponent(new URL(url).username)
const passwordHash = await hashPassword(TEST_PASSWORD)
await withOwner(url, async (client) => {
  await client.query(`update crm.users set password_hash = $1 where email = 'admin@a.test'`, [passwordHash])
  await client.query(`insert into crm.contacts (workspace_id, owner_id, first_name) values ($1, $2, 'Someone')`, [
    a.id,
    a.members['admin@a.test'].id,
  ])
})

const connect = async (connectionString: string) => {
  const client = new pg.Client({ connectionString })
  await client.connect()
  t.teardown(() => client.end())
  return client
}
const worker = await connect(await ensureWorkerRole(url, TEST_APP_SECRET))
const runtime = await connect(await ensureRuntimeRole(url, TEST_APP_SECRET))
const owner = await connect(url)
const database = new URL(url).pathname.slice(1)
const codeOf = (client: pg.Client, text: string, values: unknown[] = []) =>
  client.query(text, values).then(
    () => null,
    (error: { code?: string }) => error.code,
  )

t.test('the worker role is confined', async (t) => {
  const { rows } = await worker.query(
    `select current_user as name, r.rolsuper, r.rolbypassrls,
       pg_has_role(current_user, 'crm_worker', 'usage') as worker_privileges, pg_has_role(current_user, 'crm_api', 'usage') as api_privileges,
       (select count(*) from pg_class c where c.relowner = r.oid)::int as owned_relations,
       (select count(*) from pg_proc p where p.proowner = r.oid)::int as owned_functions
     from pg_roles r where r.rolname = current_user`,
  )
  // crm_worker is NOINHERIT: its login role holds crm_worker's grants, never crm_api's.
  t.same(rows[0], {
    name: loginRoleName(WORKER_ROLE, database),
    rolsuper: false,
    rolbypassrls: false,
    worker_privileges: true,
    api_privileges: false,
    owned_relations: 0,
    owned_functions: 0,
  })
})

t.test('the worker role reads no record of any workspace, whatever its session sets', async (t) => {
  t.equal(await codeOf(worker, 'select count(*) from crm.contacts'), '42501', 'no privilege on records of its own')
  await worker.query('reset role')
  t.equal(await codeOf(worker, 'select count(*) from crm.contacts'), '42501', 'nor after RESET ROLE')
  t.equal(await codeOf(worker, `set role ${worker.escapeIdentifier(ownerName)}`), '42501', 'SET ROLE to the owner is refused')
  t.equal(await codeOf(worker, 'set role crm_owner'), '42501', 'SET ROLE to crm_owner is refused')
  await worker.query('begin')
  try {
    await worker.query(
      `select set_config('crm.user_id', $1, true), set_config('crm.workspace_id', $2, true), set_config('crm.via', 'import', true),
         set_config('crm.context_proof', repeat('0', 64), true), set_config('role', 'crm_api', true)`,
      [a.members['admin@a.test'].id, a.id],
    )
    const { rows } = await worker.query('select count(*)::int as n from crm.contacts')
    t.equal(rows[0].n, 0, 'as crm_api with a hand-set context: none')
  } finally {
    await worker.query('rollback')
  }
  t.equal(await codeOf(worker, 'select count(*) from crm.import_rows'), '42501', 'staged rows: it adds them, it reads none')
  t.equal(await codeOf(worker, 'select count(*) from crm.users'), '42501', 'users: nothing')
})

t.test('each login role calls only its own functions', async (t) => {
  t.equal(await codeOf(runtime, 'select crm.housekeeping(30)'), '42501', 'housekeeping is the worker’s')
  t.equal(await codeOf(runtime, 'select crm.import_file_slice($1, $1, 1, 10)', [a.id]), '42501', 'an import file is the worker’s')
  t.equal(await codeOf(runtime, `select crm.worker_heartbeat('w', 'h', '1 minute')`), '42501', 'the heartbeat is the worker’s')
  t.equal(await codeOf(worker, `select crm.claim_sign_in('admin@a.test')`), '42501', 'sign-in is the runtime role’s')
  t.equal(await codeOf(worker, 'select crm.invitation_preview($1)', [Buffer.alloc(32)]), '42501', 'invitations are the runtime role’s')
  t.equal(await codeOf(runtime, 'select crm.grant_job_queue_to_worker()'), '42501', 'granting is the owner’s')
  t.equal(await codeOf(worker, 'select crm.grant_job_queue_to_worker()'), '42501')
  await runtime.query('begin')
  try {
    await runtime.query(`select set_config('role', 'crm_api', true)`)
    t.equal(
      await codeOf(runtime, `select crm.claim_sign_in('admin@a.test')`),
      '42501',
      'inside a request, as crm_api, no sign-in functions',
    )
  } finally {
    await runtime.query('rollback')
  }
  const { rows } = await worker.query('select step from crm.housekeeping(30)')
  t.ok(rows.length > 0, 'the worker runs housekeeping')
})

t.test('no login role of requests or jobs is, or may become, the owner', async (t) => {
  const { rows } = await owner.query(
    `select r.rolname, pg_has_role(r.oid, 'crm_owner', 'member') as crm_owner,
       pg_has_role(r.oid, (select relowner from pg_class where oid = 'crm.contacts'::regclass), 'member') as owner
     from pg_roles r where r.rolname in ('crm_runtime', 'crm_worker', 'crm_api', $1, $2)`,
    [loginRoleName(RUNTIME_ROLE, database), loginRoleName(WORKER_ROLE, database)],
  )
  const byName = (x: { rolname: string }, y: { rolname: string }) => (x.rolname < y.rolname ? -1 : 1)
  t.same(
    rows.sort(byName),
    [
      { rolname: 'crm_api', crm_owner: false, owner: false },
      { rolname: 'crm_runtime', crm_owner: false, owner: false },
      { rolname: loginRoleName(RUNTIME_ROLE, database), crm_owner: false, owner: false },
      { rolname: 'crm_worker', crm_owner: false, owner: false },
      { rolname: loginRoleName(WORKER_ROLE, database), crm_owner: false, owner: false },
    ].sort(byName),
  )
})

t.test('crm_api updates no column of crm.users but the name: a password is set by the owner’s functions alone', async (t) => {
  const { rows } = await owner.query(
    `select array_agg(attname::text order by attname) as columns from pg_attribute
      where attrelid = 'crm.users'::regclass and attnum > 0 and not attisdropped
        and has_column_privilege('crm_api', attrelid, attnum, 'UPDATE')`,
  )
  t.same(rows[0].columns, ['name'])
  // A member's own row, as crm_api under the member's context (crm.act_as, what a request runs).
  await owner.query('begin')
  try {
    await owner.query(`select crm.act_as('admin@a.test', 'confine-a')`)
    await owner.query('savepoint probe')
    const error = await owner.query(`update crm.users set password_hash = 'scrypt$1$1$1$salt$key' where email = 'admin@a.test'`).then(
      () => null,
      (caught) => caught,
    )
    t.match(error, { code: '42501', message: /permission denied for table users/ }, 'its own password hash: permission denied')
    await owner.query('rollback to savepoint probe')
    const renamed = await owner.query(`update crm.users set name = 'Renamed' where email = 'admin@a.test'`)
    t.equal(renamed.rowCount, 1, 'its own name: updated')
  } finally {
    await owner.query('rollback')
  }
})

t.test('every table forces row-level security and names the owner’s access in a policy', async (t) => {
  const { rows } = await owner.query(
    `select c.relname, c.relrowsecurity, c.relforcerowsecurity,
       exists (select from pg_policy p where p.polrelid = c.oid and p.polroles = array['crm_owner'::regrole::oid]
                 and p.polname = c.relname || '_all_owner') as owner_policy
     from pg_class c where c.relnamespace = 'crm'::regnamespace and c.relkind = 'r' and c.relname not in ('schema_migrations', 'schema_definitions')
     order by 1`,
  )
  t.ok(rows.length > 20)
  t.same(
    rows.filter((row) => !(row.relrowsecurity && row.relforcerowsecurity && row.owner_policy)),
    [],
    'each one: row-level security enabled and forced, and <table>_all_owner to crm_owner',
  )
})

t.test('search paths: pinned by every SECURITY DEFINER function, never with public', async (t) => {
  const { rows } = await owner.query(
    `select p.oid::regprocedure::text as name, p.prosecdef,
       (select s from unnest(p.proconfig) s where s like 'search_path=%') as search_path,
       p.prosrc ~ '(^|[^.[:alnum:]_])hmac\\s*\\(' as hmac_unqualified
     from pg_proc p where p.pronamespace = 'crm'::regnamespace order by 1`,
  )
  t.same(
    rows.filter((row) => row.search_path?.includes('public')).map((row) => row.name),
    [],
    'no function has public on its search path',
  )
  t.same(
    rows
      .filter(
        (row) => row.prosecdef && !['search_path=pg_catalog, crm, pg_temp', 'search_path=pg_catalog, pg_temp'].includes(row.search_path),
      )
      .map((row) => `${row.name}: ${row.search_path}`),
    [],
    'every SECURITY DEFINER function pins pg_catalog, crm, pg_temp (or pg_catalog, pg_temp, naming everything by its schema)',
  )
  t.same(
    rows.filter((row) => row.hmac_unqualified).map((row) => row.name),
    [],
    'pgcrypto is called by its schema',
  )
})

t.test('what the worker may call runs as the owner, so the worker needs no table of crm', async (t) => {
  const { rows } = await owner.query(
    `select p.oid::regprocedure::text as name from pg_proc p
      where p.pronamespace = 'crm'::regnamespace and has_function_privilege('crm_worker', p.oid, 'execute') and not p.prosecdef
      order by 1`,
  )
  // A later migration that redefines one of these with create or replace must say security definer again.
  t.same(rows, [], 'every crm function crm_worker may execute is SECURITY DEFINER')
})

t.test('no crm function is executable by PUBLIC', async (t) => {
  // PostgreSQL grants EXECUTE to PUBLIC on every new function; each is revoked by name, trigger
  // functions included (they fire without it).
  const { rows } = await owner.query(
    `select p.oid::regprocedure::text as name from pg_proc p
      where p.pronamespace = 'crm'::regnamespace and has_function_privilege('public', p.oid, 'execute')
        and not exists (select from pg_depend d where d.classid = 'pg_proc'::regclass and d.objid = p.oid and d.deptype = 'e')
      order by 1`,
  )
  t.same(
    rows.map((row) => row.name),
    [],
  )
})

t.test('sign-in hands out no password key, and checks a password once per claimed attempt', async (t) => {
  const claim = async () => (await runtime.query(`select allowed, ticket, password_params from crm.claim_sign_in('admin@a.test')`)).rows[0]
  const first = await claim()
  t.equal(first.allowed, true)
  t.match(first.password_params, /^scrypt\$\d+\$\d+\$\d+\$[A-Za-z0-9_-]+$/, 'parameters and salt')
  const stored = await owner.query(`select password_hash from crm.users where email = 'admin@a.test'`)
  t.equal(stored.rows[0].password_hash.startsWith(`${first.password_params}$`), true, 'the stored hash without its key')

  const signIn = (ticket: string, key: string) =>
    runtime
      .query(`select failure, two_factor, id from crm.sign_in($1, $2, 'token', 'test', $3, interval '1 day', interval '5 minutes')`, [
        ticket,
        key,
        hashToken(`crm_${'x'.repeat(43)}`),
      ])
      .then((result) => result.rows[0])
  const rightKey = await passwordKey(TEST_PASSWORD, first.password_params)
  t.same(await signIn(first.ticket, 'a guessed key'), { failure: 'invalid_credentials', two_factor: null, id: null })
  t.same(await signIn(first.ticket, rightKey), { failure: 'invalid_credentials', two_factor: null, id: null }, 'the ticket is used up')
  t.same(
    await signIn('00000000-0000-4000-8000-000000000000', rightKey),
    { failure: 'invalid_credentials', two_factor: null, id: null },
    'no ticket, no check',
  )
  const second = await claim()
  const signedIn = await signIn(second.ticket, rightKey)
  t.equal(signedIn.failure, null, 'a right key with a fresh ticket signs in')
  t.equal(signedIn.two_factor, false)
  t.ok(signedIn.id)
})

t.test('an invitation is seen only with its secret', async (t) => {
  const { rows } = await runtime.query('select * from crm.invitation_preview($1)', [hashToken('inv_not-a-real-one')])
  t.same(rows, [])
})
