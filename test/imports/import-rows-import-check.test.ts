// Every staged row's import exists (migration 000017): checked once per statement by
// tg_import_rows__import_exists_* rather than by a foreign key's check per row, with the key's
// guarantee: a statement naming a missing import stages nothing (23503), and deleting an import,
// or its workspace, deletes its staged rows and only those, and a delete racing the staging either
// waits for it and takes its rows along or makes it fail.
import fc from 'fast-check'
import pg from 'pg'
import t from 'tap'
import { createTestDatabase } from '../helpers/database.ts'
import { createTenant, withOwner } from '../helpers/fixtures.ts'
import { until } from '../helpers/until.ts'

const STAGE_ROWS = `
  insert into crm.import_rows (workspace_id, import_id, row, user_id, cells)
  select i.workspace_id, i.import_id, 1000 + i.n::int, $2, array['x']
    from unnest($1::uuid[], $3::uuid[]) with ordinality as i (workspace_id, import_id, n)`

async function createImport(client: pg.Client, workspaceId: string, userId: string): Promise<string> {
  const { rows } = await client.query(
    `insert into crm.imports (workspace_id, user_id, record_type, file_name, file_size, delimiter, columns, row_count, sample_rows, suggested_mapping)
     values ($1, $2, 'contacts', 'a.csv', 1, ',', array['email'], 1, '[]', '{}') returning id`,
    [workspaceId, userId],
  )
  return rows[0].id
}

const stagedCount = (client: pg.Client, importId: string) =>
  client.query('select count(*)::int as n from crm.import_rows where import_id = $1', [importId]).then((r) => r.rows[0].n as number)

t.test('no foreign key check runs per staged row', async (t) => {
  const url = await createTestDatabase(t)
  await withOwner(url, async (client) => {
    const { rows } = await client.query(
      `select tgname from pg_trigger where tgrelid = 'crm.import_rows'::regclass and tgisinternal and tgtype & 1 = 1`,
    )
    t.same(rows, [], 'crm.import_rows has no per-row check trigger (a foreign key would add one)')
  })
})

t.test('a statement of staged rows is written only when every import it names exists', async (t) => {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'ann@stage.test': 'admin' } })
  const other = await createTenant(url, { members: { 'bob@other.test': 'admin' } })
  const ann = tenant.members['ann@stage.test'].id
  await withOwner(url, async (client) => {
    const imports = [await createImport(client, tenant.id, ann), await createImport(client, tenant.id, ann)]
    const foreign = await createImport(client, other.id, other.members['bob@other.test'].id)
    // An import named with another workspace's id is as missing as an unknown id.
    const target = fc.oneof(
      fc.constantFrom(...imports).map((id) => ({ workspace: tenant.id, id, exists: true })),
      fc.uuid({ version: 7 }).map((id) => ({ workspace: tenant.id, id, exists: false })),
      fc.constant({ workspace: tenant.id, id: foreign, exists: false }),
    )
    await fc.assert(
      fc.asyncProperty(fc.array(target, { minLength: 1, maxLength: 20 }), async (targets) => {
        await client.query('delete from crm.import_rows')
        const error = await client.query(STAGE_ROWS, [targets.map((x) => x.workspace), ann, targets.map((x) => x.id)]).then(
          () => null,
          (caught: { code?: string }) => caught,
        )
        const after = (await client.query('select count(*)::int as n from crm.import_rows')).rows[0].n
        if (targets.every((x) => x.exists)) return error === null && after === targets.length
        return error?.code === '23503' && after === 0
      }),
      { numRuns: 60 },
    )
    t.pass('written whole when every import exists, refused whole (23503) otherwise')

    // The property's last case may have staged this very row.
    await client.query('delete from crm.import_rows')
    await client.query(STAGE_ROWS, [[tenant.id], ann, [imports[0]]])
    const moved = await client.query('update crm.import_rows set import_id = crm.uuid_v7() where import_id = $1', [imports[0]]).then(
      () => null,
      (caught: { code?: string }) => caught.code,
    )
    t.equal(moved, '23503', 'an update that moves a staged row to a missing import is refused too')
  })
})

t.test('deleting an import or its workspace deletes its staged rows and only those', async (t) => {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'ann@stage.test': 'admin' } })
  const doomed = await createTenant(url, { members: { 'cid@doomed.test': 'admin' } })
  const ann = tenant.members['ann@stage.test'].id
  const cid = doomed.members['cid@doomed.test'].id
  await withOwner(url, async (client) => {
    const [gone, kept] = [await createImport(client, tenant.id, ann), await createImport(client, tenant.id, ann)]
    const ofDoomed = await createImport(client, doomed.id, cid)
    await client.query(STAGE_ROWS, [[tenant.id, tenant.id, tenant.id], ann, [gone, gone, kept]])
    await client.query(STAGE_ROWS, [[doomed.id], cid, [ofDoomed]])
    await client.query('delete from crm.imports where workspace_id = $1 and id = $2', [tenant.id, gone])
    t.equal(await stagedCount(client, gone), 0, "the deleted import's staged rows are gone")
    t.equal(await stagedCount(client, kept), 1, "the other import's staged row stays")
    await client.query('delete from crm.workspaces where id = $1', [doomed.id])
    t.equal(await stagedCount(client, ofDoomed), 0, "a deleted workspace's imports take their staged rows along")
    t.equal(await stagedCount(client, kept), 1, "another workspace's staged rows stay")
  })
})

t.test('an import deleted while its rows are staged', async (t) => {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'ann@stage.test': 'admin' } })
  const ann = tenant.members['ann@stage.test'].id
  const connect = async () => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    return client
  }
  const [writer, deleter, observer] = [await connect(), await connect(), await connect()]
  t.teardown(() => Promise.all([writer.end(), deleter.end(), observer.end()]))
  const pidOf = async (client: pg.Client) => (await client.query('select pg_backend_pid() as pid')).rows[0].pid as number
  const [writerPid, deleterPid] = [await pidOf(writer), await pidOf(deleter)]
  const waitingForLock = (pid: number) =>
    until(`backend ${pid} waits for a lock`, async () => {
      const { rows } = await observer.query(`select 1 from pg_stat_activity where pid = $1 and wait_event_type = 'Lock'`, [pid])
      return rows.length === 1
    })
  const deleteImport = (client: pg.Client, id: string) =>
    client.query('delete from crm.imports where workspace_id = $1 and id = $2', [tenant.id, id])

  // The rows are staged first: the delete waits for their transaction, then takes them along.
  const first = await createImport(observer, tenant.id, ann)
  await writer.query('begin')
  await writer.query(STAGE_ROWS, [[tenant.id, tenant.id], ann, [first, first]])
  const deleted = deleteImport(deleter, first)
  await waitingForLock(deleterPid)
  await writer.query('commit')
  t.equal((await deleted).rowCount, 1, 'the delete goes through once the staged rows are committed')
  t.equal(await stagedCount(observer, first), 0, 'and the rows committed meanwhile are deleted with it')

  // The import is deleted first: the staging statement waits, then finds no import.
  const second = await createImport(observer, tenant.id, ann)
  await deleter.query('begin')
  await deleteImport(deleter, second)
  const staged = writer.query(STAGE_ROWS, [[tenant.id], ann, [second]]).then(
    () => null,
    (caught: { code?: string }) => caught.code,
  )
  await waitingForLock(writerPid)
  await deleter.query('commit')
  t.equal(await staged, '23503', 'the rows of an import deleted meanwhile are refused')
  t.equal(await stagedCount(observer, second), 0, 'and none is left')
})
