// What every fault test checks afterwards, straight from the database as the owner role:
// no lost committed write, no record written twice for one Idempotency-Key, every committed
// change has its crm.events row, and (with a subscription) every event reached the receiver.
import type { Test } from 'tap'
import { eventually, ownerQuery } from '../helpers/processes.ts'
import type { Receiver } from '../webhooks/receiver.ts'
import type { Load } from './load.ts'

type Assert = Pick<Test, 'equal' | 'same' | 'ok'>

export async function checkNoLostWrites(t: Assert, databaseUrl: string, workspaceId: string, load: Load): Promise<void> {
  const ids = [...load.confirmed.values()]
  const [found] = await ownerQuery(
    databaseUrl,
    `select count(*)::int as n from crm.contacts where workspace_id = $1 and id = any($2::uuid[])`,
    [workspaceId, ids],
  )
  t.equal(
    found.n,
    ids.length,
    `every confirmed create is in the database (${ids.length} confirmed, ${load.retriedCreates} retries with the same key)`,
  )

  // last_name is the Idempotency-Key: one row per key, and the confirmed id is that row.
  const rows = await ownerQuery(
    databaseUrl,
    `select last_name, array_agg(id::text) as ids from crm.contacts where workspace_id = $1 and last_name like $2 group by last_name`,
    [workspaceId, `${load.options.tag}-%`],
  )
  const twice = rows.filter((row) => row.ids.length > 1)
  t.same(
    twice.map((row) => row.last_name),
    [],
    'no Idempotency-Key wrote its record twice',
  )
  const byKey = new Map(rows.map((row) => [row.last_name as string, row.ids[0] as string]))
  const mismatched = [...load.confirmed].filter(([key, id]) => byKey.get(key) !== id)
  t.same(mismatched, [], 'each key maps to the record the service confirmed')
  const strays = rows.filter((row) => !load.keys.has(row.last_name))
  t.same(strays, [], 'no record without a key the client sent')

  const updates = load.updates
  const [missingUpdates] = await ownerQuery(
    databaseUrl,
    `select count(*)::int as n from unnest($2::uuid[], $3::text[]) as u(id, value)
      where not exists (select 1 from crm.contacts c where c.workspace_id = $1 and c.id = u.id)`,
    [workspaceId, updates.map((u) => u.id), updates.map((u) => u.value)],
  )
  t.equal(missingUpdates.n, 0, `every confirmed update's record exists (${updates.length} updates)`)
}

export async function checkEvents(t: Assert, databaseUrl: string, workspaceId: string, load: Load): Promise<void> {
  const [created] = await ownerQuery(
    databaseUrl,
    `select count(*)::int as records,
            count(*) filter (where not exists (select 1 from crm.events e where e.workspace_id = c.workspace_id and e.record_id = c.id and e.event = 'contact.created'))::int as without_event
       from crm.contacts c where c.workspace_id = $1`,
    [workspaceId],
  )
  t.equal(created.without_event, 0, `every committed create has its contact.created event (${created.records} records)`)
  const updates = load.updates
  const [missing] = await ownerQuery(
    databaseUrl,
    `select count(*)::int as n from unnest($2::uuid[], $3::text[]) as u(id, value)
      where not exists (select 1 from crm.events e where e.workspace_id = $1 and e.record_id = u.id and e.event = 'contact.updated'
                           and e.data -> 'object' ->> 'job_title' = u.value)`,
    [workspaceId, updates.map((u) => u.id), updates.map((u) => u.value)],
  )
  t.equal(missing.n, 0, `every confirmed update has its contact.updated event (${updates.length} updates)`)
  const [orphans] = await ownerQuery(
    databaseUrl,
    `select count(*)::int as n from crm.events e where e.workspace_id = $1 and e.event = 'contact.created'
        and not exists (select 1 from crm.contacts c where c.workspace_id = e.workspace_id and c.id = e.record_id)`,
    [workspaceId],
  )
  t.equal(orphans.n, 0, 'no event for a change that was rolled back')
}

/** Waits until every event of the workspace reached the receiver at least once; returns how many did. */
export async function checkEveryEventDelivered(
  t: Assert,
  databaseUrl: string,
  workspaceId: string,
  receivers: Receiver[],
  timeoutMs = 90_000,
): Promise<number> {
  const events = await ownerQuery(databaseUrl, `select id::text as id from crm.events where workspace_id = $1`, [workspaceId])
  const wanted = events.map((row) => row.id as string)
  const missing = () => {
    const got = new Set(receivers.flatMap((receiver) => receiver.received.map((r) => r.body?.id as string)))
    return wanted.filter((id) => !got.has(id))
  }
  let left: string[] = []
  try {
    await eventually('every event at the receiver', async () => (left = missing()).length === 0, timeoutMs, 250)
  } catch {}
  t.same(left.slice(0, 5), [], `every one of ${wanted.length} events reached the receiver at least once (${left.length} missing)`)
  // A first attempt a killed worker sent but never recorded has no delivery row yet, and an attempt
  // it made on an existing delivery is not recorded either: both are settled when the job runs
  // again, which the heartbeat allows 30 s after the kill (fan_out_event sends the first attempt
  // again with the same delivery id and creates the row). So allow a minute for both.
  const state = async () => {
    const [row] = await ownerQuery(
      databaseUrl,
      `select count(distinct event_id)::int as events, count(*) filter (where status <> 'delivered')::int as open from crm.webhook_deliveries where workspace_id = $1`,
      [workspaceId],
    )
    return row as { events: number; open: number }
  }
  let last = await state()
  await eventually(
    'every event has a delivery row and every delivery is delivered',
    async () => {
      last = await state()
      return last.events === wanted.length && last.open === 0
    },
    60_000,
  ).catch(() => {})
  t.equal(last.events, wanted.length, 'every event has its delivery row')
  t.equal(last.open, 0, 'every delivery is marked delivered')
  return wanted.length - left.length
}
