// The outbox's hand-off to the webhooks worker (crm.enqueue_event_fan_out, sql/definitions/40_events_and_webhooks.sql): each
// statement that writes events adds one fan_out_event job carrying exactly its events, and adding
// it does not scan the job queue, so record writes do not slow down while jobs pile up (the worker
// down or behind). The scan is read from PostgreSQL's own counters for the transaction.
import t from 'tap'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'

const PENDING = 2000

t.test('one job per writing statement, added without scanning a queue of pending jobs', async (t) => {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, url)

  const scans = async () =>
    (await db.query(`select seq_scan::int as n from pg_stat_xact_user_tables where relid = 'graphile_worker._private_jobs'::regclass`))
      .rows[0].n as number
  const statements: string[][] = []
  const write = async (names: string[]) => {
    const { rows: written } = await db.query(
      'insert into crm.companies (workspace_id, owner_id, name) select $1, $2, unnest($3::text[]) returning id',
      [tenant.id, admin.id, names],
    )
    const { rows: events } = await db.query('select id from crm.events where record_id = any($1::uuid[])', [written.map((row) => row.id)])
    statements.push(events.map((row) => row.id))
  }

  await db.query('begin')
  // Six statements on an empty queue: the plans inside add_job are past PostgreSQL's five custom
  // plans and kept, as in a service that started with its worker keeping up.
  for (const names of [['One'], ['Two', 'Three', 'Four'], ['Five'], ['Six'], ['Seven', 'Eight'], ['Nine']]) await write(names)
  // Then a backlog: jobs of a task no worker here runs, as when the worker is down.
  await db.query(
    `select count(*) from graphile_worker.add_jobs(array(
       select ('backlog_filler', '{}'::json, null, null, null, null, null, null)::graphile_worker.job_spec
         from generate_series(1, ${PENDING})))`,
  )
  const before = await scans()
  await write(['Ten'])
  await write(['Eleven', 'Twelve'])
  const after = await scans()
  await db.query('commit')
  t.equal(after - before, 0, 'no sequential scan of the job queue while adding the jobs')

  const { rows: jobs } = await db.query(
    `select j.payload from graphile_worker._private_jobs j join graphile_worker._private_tasks k on k.id = j.task_id where k.identifier = 'fan_out_event' order by j.id`,
  )
  t.same(
    jobs.map((job) => [...job.payload.event_ids].sort()),
    statements.map((ids) => [...ids].sort()),
    'each statement added one job, with exactly the events it wrote',
  )
  const { rows: backlog } = await db.query(`select count(*)::int as n from graphile_worker.jobs where task_identifier = 'backlog_filler'`)
  t.equal(backlog[0].n, PENDING, 'the pending jobs are untouched')
})
