// The package's batch calls and events feed (clients/typescript/crm-client.ts) against a live server:
// per-item results in input order, narrowed on their status; an atomic batch's failure thrown with
// its results; `events.follow()` catching up, long-polling for an event committed while it waits,
// and resuming from its cursor after a stop.
import t from 'tap'
import { type BatchItem, type Contact, CrmApiError, createClient } from '../../clients/typescript/crm-client.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { until } from '../helpers/until.ts'

const server = await startTestServer(t)
const tenant = await createTenant(server.databaseUrl, { slug: 'batchy', members: { 'ada@batchy.test': 'admin' } })
const crm = createClient({ baseUrl: server.url, token: tenant.members['ada@batchy.test'].token, workspace: 'batchy' })

/** The record of a successful item, failing the test on any other. */
function record<R>(item: BatchItem<R> | undefined): R {
  if (item?.status !== 200 && item?.status !== 201) throw new Error(`not a record: ${JSON.stringify(item)}`)
  return item.data
}

t.test('batch create, read, update, upsert and delete answer per item, in input order', async (t) => {
  const made = await crm.contacts.batch.create({
    inputs: [{ first_name: 'Grace', email: 'grace@batch.test' }, { first_name: 'Ada', email: 'not an email' }, { first_name: 'Lin' }],
  })
  t.same(
    made.results.map((item) => [item.index, item.status]),
    [
      [0, 201],
      [1, 422],
      [2, 201],
    ],
  )
  t.same(made.counts, { succeeded: 2, failed: 1 })
  const bad = made.results[1]
  t.ok(bad.status === 422 && bad.problem.code === 'validation_failed', 'the failed item carries its problem')
  const [grace, lin] = [record(made.results[0]), record(made.results[2])]

  const read = await crm.contacts.batch.read({ ids: [lin.id, grace.id], fields: ['email'] })
  t.same(
    read.results.map((item) => record(item)),
    [
      { id: lin.id, email: null },
      { id: grace.id, email: 'grace@batch.test' },
    ],
  )

  const updated = await crm.contacts.batch.update({ inputs: [{ id: grace.id, last_name: 'Hopper' }] })
  t.equal(record(updated.results[0]).last_name, 'Hopper')

  const upserted = await crm.contacts.batch.upsert({
    inputs: [
      { email: 'grace@batch.test', job_title: 'Admiral' },
      { email: 'new@batch.test', first_name: 'New' },
    ],
    match_on: 'email',
  })
  t.same(
    upserted.results.map((item) => [item.status, record(item).email]),
    [
      [200, 'grace@batch.test'],
      [201, 'new@batch.test'],
    ],
  )
  t.equal(record(upserted.results[0]).id, grace.id, 'the existing record was updated')

  const atomic = await crm.contacts.batch
    .create({ inputs: [{ first_name: 'Kept?' }, { email: 'nope' }], atomic: true })
    .catch((error) => error)
  t.ok(atomic instanceof CrmApiError, 'a failed atomic batch throws')
  t.match(atomic, { status: 422, code: 'batch_failed', problem: { results: [{ status: 424 }, { status: 422 }] } })

  const deleted = await crm.contacts.batch.delete({ ids: [lin.id, lin.id] })
  t.same(
    deleted.results.map((item) => item.status),
    [204, 404],
  )
  const left: Contact[] = (await crm.contacts.list({ sort: 'created_at' })).data
  t.same(
    left.map((contact) => contact.first_name),
    ['Grace', 'New'],
    'nothing of the atomic batch was written',
  )
})

t.test('events.follow catches up, long-polls for the next event, and resumes from its cursor', async (t) => {
  const start = (await crm.events.list({ types: ['contact.*'] })).next_cursor
  // Stops the first follow once it has the events it is waiting for: `break` ends the long poll's loop.
  const first = crm.events.follow({ after: start, types: ['contact.*'], wait: 30 })
  const seen: string[] = []
  const first3 = (async () => {
    for await (const event of first) {
      seen.push((event.data.object as { first_name: string }).first_name)
      if (seen.length === 3) break
    }
  })()
  await crm.contacts.create({ first_name: 'One' })
  await crm.contacts.batch.create({ inputs: [{ first_name: 'Two' }] })
  // Up to two minutes: the feed shows the two events once every older transaction of the cluster
  // has ended, another test file's included.
  await until('the follow waits for more', async () => seen.length === 2 && server.feedListener!.waiting() >= 1, 2400)
  await crm.contacts.create({ first_name: 'Three, committed while it waits' })
  await first3
  t.same(seen, ['One', 'Two', 'Three, committed while it waits'])
  t.equal(typeof first.cursor, 'string', 'the cursor after the events handled')

  await crm.contacts.create({ first_name: 'Four, while stopped' })
  const resumed = crm.events.follow({ after: first.cursor, types: ['contact.*'] })
  const next = await resumed.next()
  await resumed.return()
  t.equal(
    (next.value as { data: { object: { first_name: string } } }).data.object.first_name,
    'Four, while stopped',
    'resumes after the last one handled',
  )

  const expired = await crm.events
    .follow({ after: 'not-a-cursor' })
    .next()
    .catch((error) => error)
  t.match(expired, { status: 400, code: 'invalid_parameter' }, "the feed's refusal is thrown")
})
