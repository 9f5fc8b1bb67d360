// Every event's workspace exists (migration 000015): checked once per statement by
// tg_events__workspace_exists_* rather than by a foreign key's check per row, with the key's
// guarantee: a statement naming a missing workspace writes nothing (23503), deleting a workspace
// deletes its events, and a delete racing an insert either waits for it and takes its events along
// or makes it fail.
import fc from 'fast-check'
import pg from 'pg'
import t from 'tap'
import { createTestDatabase } from '../helpers/database.ts'
import { createTenant, withOwner } from '../helpers/fixtures.ts'
import { until } from '../helpers/until.ts'

const INSERT_EVENTS = `
  insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
  select w, 'contact.created', 'contact', crm.uuid_v7(), '{"object": {}}', '{"type": "system", "via": "api"}'
    from unnest($1::uuid[]) as w`

const eventCount = (client: pg.Client, workspaceId: string) =>
  client.query('select count(*)::int as n from crm.events where workspace_id = $1', [workspaceId]).then((r) => r.rows[0].n as number)

async function connect(url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  return client
}

t.test('no foreign key check runs per event row', async (t) => {
  const url = await createTestDatabase(t)
  await withOwner(url, async (client) => {
    const { rows } = await client.query(
      `select tgname from pg_trigger where tgrelid = 'crm.events'::regclass and tgisinternal and tgtype & 1 = 1`,
    )
    t.same(rows, [], 'crm.events has no per-row check trigger (a foreign key would add one)')
  })
})

t.test('a statement of events is written only when every workspace it names exists', async (t) => {
  const url = await createTestDatabase(t)
  const tenants = [await createTenant(url, { members: {} }), await createTenant(url, { members: {} })]
  await withOwner(url, async (client) => {
    const existing = tenants.map((tenant) => tenant.id)
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.oneof(fc.constantFrom(...existing), fc.uuid({ version: 7 })), { minLength: 1, maxLength: 20 }),
        async (workspaces) => {
          const before = (await client.query('select count(*)::int as n from crm.events')).rows[0].n
          const allExist = workspaces.every((id) => existing.includes(id))
          const error = await client.query(INSERT_EVENTS, [workspaces]).then(
            () => null,
            (caught: { code?: string }) => caught,
          )
          const after = (await client.query('select count(*)::int as n from crm.events')).rows[0].n
          if (allExist) return error === null && after === before + workspaces.length
          return error?.code === '23503' && after === before
        },
      ),
      { numRuns: 60 },
    )
    t.pass('written whole when every workspace exists, refused whole (23503) otherwise')

    const [first] = existing
    await client.query(INSERT_EVENTS, [[first]])
    const updated = await client.query('update crm.events set workspace_id = crm.uuid_v7() where workspace_id = $1', [first]).then(
      () => null,
      (caught: { code?: string }) => caught.code,
    )
    t.equal(updated, '23503', 'an update that moves an event to a missing workspace is refused too')
  })
})

t.test('deleting a workspace deletes its events and only its own', async (t) => {
  const url = await createTestDatabase(t)
  const doomed = await createTenant(url, { members: { 'ann@doomed.test': 'admin' } })
  const kept = await createTenant(url, { members: {} })
  await withOwner(url, async (client) => {
    await client.query(`insert into crm.contacts (workspace_id, owner_id, first_name) values ($1, $2, 'Ann')`, [
      doomed.id,
      doomed.members['ann@doomed.test'].id,
    ])
    await client.query(INSERT_EVENTS, [[kept.id, kept.id]])
    t.equal(await eventCount(client, doomed.id), 1, "the contact's created event")
    await client.query('delete from crm.workspaces where id = $1', [doomed.id])
    t.equal(await eventCount(client, doomed.id), 0, 'its events are gone, the deleted event its contact wrote on the way included')
    t.equal(await eventCount(client, kept.id), 2, "the other workspace's events stay")
  })
})

t.test('a workspace deleted while events are written for it', async (t) => {
  const url = await createTestDatabase(t)
  const waitingForLock = (client: pg.Client, pid: number) =>
    until(`backend ${pid} waits for a lock`, async () => {
      const { rows } = await client.query(`select 1 from pg_stat_activity where pid = $1 and wait_event_type = 'Lock'`, [pid])
      return rows.length === 1
    })
  const writer = await connect(url)
  const deleter = await connect(url)
  const observer = await connect(url)
  t.teardown(() => Promise.all([writer.end(), deleter.end(), observer.end()]))
  const pidOf = async (client: pg.Client) => (await client.query('select pg_backend_pid() as pid')).rows[0].pid as number
  const [writerPid, deleterPid] = [await pidOf(writer), await pidOf(deleter)]

  // The events are written first: the delete waits for their transaction, then takes them along.
  const first = await createTenant(url, { members: {} })
  await writer.query('begin')
  await writer.query(INSERT_EVENTS, [[first.id, first.id]])
  const deleted = deleter.query('delete from crm.workspaces where id = $1', [first.id])
  await waitingForLock(observer, deleterPid)
  await writer.query('commit')
  t.equal((await deleted).rowCount, 1, 'the delete goes through once the events are committed')
  t.equal(await eventCount(observer, first.id), 0, 'and the events committed meanwhile are deleted with it')

  // The workspace is deleted first: the events' statement waits, then finds no workspace.
  const second = await createTenant(url, { members: {} })
  await deleter.query('begin')
  await deleter.query('delete from crm.workspaces where id = $1', [second.id])
  const written = writer.query(INSERT_EVENTS, [[second.id]]).then(
    () => null,
    (caught: { code?: string }) => caught.code,
  )
  await waitingForLock(observer, writerPid)
  await deleter.query('commit')
  t.equal(await written, '23503', 'the events of a workspace deleted meanwhile are refused')
  t.equal(await eventCount(observer, second.id), 0, 'and none is left')
})
