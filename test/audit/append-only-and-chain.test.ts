// The audit log in SQL (sql/definitions/80_audit.sql): no role, the owner's and a superuser's
// included, may update, delete or truncate an entry or move a chain's anchor; only
// crm.retire_audit_log removes old entries, and the chain verifies across its removal; a change or
// a removal made behind the service's back is named by crm.verify_audit_log and by
// `crm audit verify`; writers of two workspaces never wait for each other, writers of one are
// ordered without losing an entry.
import pg from 'pg'
import t from 'tap'
import { ensureRuntimeRole, ensureWorkerRole } from '../../src/db/runtime-role.ts'
import { crm } from '../helpers/cli.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { TEST_APP_SECRET } from '../helpers/server.ts'
import { until } from '../helpers/until.ts'

const url = await createTestDatabase(t)
const connect = async (connectionString: string) => {
  const client = new pg.Client({ connectionString })
  await client.connect()
  t.teardown(() => client.end())
  return client
}
const superuser = await connect(url)
const runtime = await connect(await ensureRuntimeRole(url, TEST_APP_SECRET))
const worker = await connect(await ensureWorkerRole(url, TEST_APP_SECRET))

const one = createTenant(url, { slug: 'audit-one', members: { 'ada@one.test': 'admin', 'bob@one.test': 'member' } })
const two = createTenant(url, { slug: 'audit-two', members: { 'cy@two.test': 'admin' } })
const [tenantOne, tenantTwo] = await Promise.all([one, two])

const verify = async (workspaceId: string) =>
  (await superuser.query('select intact, entries::int, first_bad_id from crm.verify_audit_log($1)', [workspaceId])).rows[0]
const entries = async (workspaceId: string) =>
  (await superuser.query('select id, seq::int, action from crm.audit_log where workspace_id = $1 order by seq', [workspaceId])).rows

/** Runs `statement` on `client` as `role` (null: the connection's own role) and answers the error's message, or null. */
async function refusal(client: pg.Client, role: string | null, statement: string): Promise<string | null> {
  await client.query('begin')
  try {
    if (role) await client.query(`set local role ${role}`)
    await client.query(statement)
    return null
  } catch (error) {
    return (error as Error).message
  } finally {
    await client.query('rollback')
  }
}

t.test('the fixtures wrote a verifiable chain per workspace', async (t) => {
  const log = await entries(tenantOne.id)
  t.ok(log.some((entry) => entry.action === 'member.added'))
  t.same(
    log.map((entry) => entry.seq),
    log.map((_, index) => index + 1),
  )
  t.same(await verify(tenantOne.id), { intact: true, entries: log.length, first_bad_id: null })
})

t.test('no role may update, delete or truncate an entry or move an anchor', async (t) => {
  const statements = [
    `update crm.audit_log set details = '{}' where workspace_id = '${tenantOne.id}'`,
    `delete from crm.audit_log where workspace_id = '${tenantOne.id}'`,
    'truncate crm.audit_log cascade',
    `update crm.audit_chain_heads set anchor_seq = 1 where workspace_id = '${tenantOne.id}'`,
    `update crm.audit_chain_heads set last_seq = 0 where workspace_id = '${tenantOne.id}'`,
    `delete from crm.audit_chain_heads where workspace_id = '${tenantOne.id}'`,
    'truncate crm.audit_chain_heads cascade',
  ]
  const roles: [string, pg.Client, string | null][] = [
    ['the superuser', superuser, null],
    ['crm_owner, the tables owner', superuser, 'crm_owner'],
    ['crm_api', superuser, 'crm_api'],
    ['the runtime login', runtime, null],
    ['the worker login', worker, null],
  ]
  for (const [name, client, role] of roles) {
    // The superuser and the owner hold every privilege: the triggers are what refuses them.
    const why = client === superuser && role !== 'crm_api' ? /append-only|moves forward/ : /append-only|moves forward|permission denied/
    for (const statement of statements) {
      t.match(await refusal(client, role, statement), why, `${name}: ${statement} is refused`)
    }
  }
  // The retention job's flag alone lets nobody delete what is above the anchor.
  t.ok(
    await refusal(
      superuser,
      'crm_owner',
      `select set_config('crm.audit_retention', txid_current()::text, true);
       delete from crm.audit_log where workspace_id = '${tenantOne.id}'`,
    ),
    "the retention job's flag set by hand deletes nothing above the anchor",
  )
  t.same(await verify(tenantOne.id), { intact: true, entries: (await entries(tenantOne.id)).length, first_bad_id: null })
})

t.test('only the retention job removes entries; the chain verifies across the removal', async (t) => {
  // Made old behind the service's back (the superuser can switch the trigger off; verify sees it).
  await superuser.query('alter table crm.audit_log disable trigger tg_audit_log__append_only')
  await superuser.query(`update crm.audit_log set occurred_at = occurred_at - interval '500 days' where workspace_id = $1 and seq <= 2`, [
    tenantTwo.id,
  ])
  await superuser.query('alter table crm.audit_log enable trigger tg_audit_log__append_only')
  const before = await entries(tenantTwo.id)
  t.equal((await verify(tenantTwo.id)).intact, false, 'an entry whose time was changed breaks the chain')
  t.equal((await verify(tenantTwo.id)).first_bad_id, before[0].id, 'and is named')

  const removed = (await worker.query('select crm.retire_audit_log(400) as removed')).rows[0].removed
  t.equal(Number(removed), 2, 'the worker removes the two old entries')
  const after = await entries(tenantTwo.id)
  t.same(
    after.map((entry) => entry.seq),
    [...before.slice(2).map((entry) => entry.seq), before.length + 1],
  )
  t.equal(after.at(-1)?.action, 'audit_log.retention_ran', 'and records that it ran')
  t.same(await verify(tenantTwo.id), { intact: true, entries: after.length, first_bad_id: null }, 'the anchor carries the chain')
})

t.test('verify names an entry changed or removed behind the service', async (t) => {
  const log = await entries(tenantOne.id)
  t.ok(log.length >= 4)
  await superuser.query('alter table crm.audit_log disable trigger tg_audit_log__append_only')
  t.teardown(() => superuser.query('alter table crm.audit_log enable trigger tg_audit_log__append_only'))

  await superuser.query(`update crm.audit_log set details = details || '{"role_id": null}' where id = $1`, [log[2].id])
  t.same(await verify(tenantOne.id), { intact: false, entries: 2, first_bad_id: log[2].id }, 'a changed entry')
  const cli = crm(url, ['audit', 'verify', '--workspace', tenantOne.slug, '--json'])
  t.not(cli.status, 0, 'the CLI exits non-zero on a broken chain')
  t.match(cli.json, { code: 'audit_chain_broken', exit_code: 1, intact: false, first_bad_id: log[2].id })

  // A changed entry whose own hash is made right again still breaks the next one's link.
  await superuser.query('update crm.audit_log l set hash = crm.audit_hash(l) where id = $1', [log[2].id])
  t.equal((await verify(tenantOne.id)).first_bad_id, log[3].id, 'a changed entry rehashed: the next one is named')

  await superuser.query('delete from crm.audit_log where id = $1', [log[3].id])
  t.equal((await verify(tenantOne.id)).first_bad_id, log[4]?.id ?? log[3].id, 'a removed entry: the one after it is named')

  const intact = await entries(tenantTwo.id)
  const last = intact.at(-1)
  await superuser.query('delete from crm.audit_log where id = $1', [last?.id])
  t.same(
    await verify(tenantTwo.id),
    { intact: false, entries: intact.length - 1, first_bad_id: last?.id },
    'the newest entry removed: the head names it',
  )
})

t.test('writers in two workspaces never wait for each other; one workspace keeps every entry in order', async (t) => {
  const first = await connect(url)
  const second = await connect(url)
  const headBefore = (await superuser.query('select last_seq::int from crm.audit_chain_heads where workspace_id = $1', [tenantTwo.id]))
    .rows[0].last_seq
  // A writer that waited on the other workspace would fail here instead of hanging the test.
  await second.query(`set lock_timeout = '30s'`)
  await first.query('begin')
  await first.query(`insert into crm.roles (workspace_id, name) values ($1, 'held_open')`, [tenantOne.id])
  // The other workspace's writer commits while the first transaction holds its chain head.
  await second.query(`insert into crm.roles (workspace_id, name) values ($1, 'not_waiting')`, [tenantTwo.id])
  t.equal(
    (await superuser.query('select last_seq::int from crm.audit_chain_heads where workspace_id = $1', [tenantTwo.id])).rows[0].last_seq,
    headBefore + 1,
    "the other workspace's entry is written while the first transaction is open",
  )
  // A second writer of the held workspace waits, then follows.
  const third = await connect(url)
  const queued = third.query(`insert into crm.roles (workspace_id, name) values ($1, 'queued')`, [tenantOne.id])
  await until('the same-workspace writer waits on the chain head', async () => {
    const { rows } = await superuser.query(
      `select 1 from pg_stat_activity where wait_event_type = 'Lock' and query like '%queued%' and datname = current_database()`,
    )
    return rows.length > 0 || null
  })
  await first.query('commit')
  await queued
  const log = await entries(tenantOne.id)
  const names = log.filter((entry) => entry.action === 'role.created').map((entry) => entry.seq)
  t.ok(names.length >= 2)
  const held = await superuser.query(
    `select seq::int, details->>'name' as name from crm.audit_log where workspace_id = $1 and action = 'role.created' and details->>'name' in ('held_open', 'queued') order by seq`,
    [tenantOne.id],
  )
  t.same(
    held.rows.map((row) => row.name),
    ['held_open', 'queued'],
    'ordered as they committed',
  )
  t.equal(held.rows[1].seq, held.rows[0].seq + 1, 'consecutive, none lost')
})
