// Batch routes (docs/api.md section 5a) over HTTP: each operation with per-item answers in input
// order, the limit, atomic and non-atomic batches, an Idempotency-Key replay, per-item permissions
// (a member's role, a scoped token) and one event per record written with its actor.
import t from 'tap'
import { mintToken, withOwner } from '../helpers/fixtures.ts'
import { startWorld } from './helpers.ts'

const world = await startWorld(t, {
  roles: { seller: ['deals:view:own', 'deals:create:own', 'deals:update:own'] },
  members: { 'carol@acme.test': 'seller' },
})
const admin = world.as('admin@acme.test')
const ann = world.as('ann@acme.test')
const bob = world.as('bob@acme.test')
const reader = world.as('reader@acme.test')
const MISSING = '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'

const statuses = (body: any) => body.results.map((result: any) => result.status)

async function eventsOf(recordIds: string[]) {
  const { rows } = await world.owner(
    `select record_id, event, actor from crm.events where record_id = any($1::uuid[]) order by occurred_at, id`,
    [recordIds],
  )
  return rows
}

t.test('create, read, update, upsert and delete, one answer per input in order', async (t) => {
  const created = await ann.post('/api/contacts/batch/create', {
    inputs: [{ first_name: 'One', email: 'one@batch.test' }, { first_name: 'Bad', email: 'not an email' }, { last_name: 'Three' }],
  })
  t.equal(created.status, 200, created.text)
  t.same(statuses(created.body), [201, 422, 201])
  t.same(created.body.counts, { succeeded: 2, failed: 1 })
  t.equal(created.body.results[1].problem.code, 'validation_failed')
  t.equal(created.body.results[1].problem.errors[0].pointer, '/email', 'the pointer is into the item, as the single route gives it')
  const [one, , three] = created.body.results.map((result: any) => result.data?.id)
  t.equal(created.body.results[0].data.owner_id, ann.member.id)

  const single = await ann.get(`/api/contacts/${one}`)
  t.equal(created.body.results[0].etag, single.headers.get('etag'), 'the item carries the ETag of the single route')

  const duplicate = await ann.post('/api/contacts/batch/create', { inputs: [{ email: 'ONE@batch.test' }] })
  t.same(statuses(duplicate.body), [409])
  t.equal(duplicate.body.results[0].problem.code, 'duplicate')

  const read = await ann.post('/api/contacts/batch/read', { ids: [three, MISSING, 'not-a-uuid', one], fields: ['email'] })
  t.equal(read.status, 200, read.text)
  t.same(statuses(read.body), [200, 404, 404, 200])
  t.same(read.body.results[3].data, { id: one, email: 'one@batch.test' }, 'fields keeps those asked for and the id')
  const unknownField = await ann.post('/api/contacts/batch/read', { ids: [one], fields: ['email', 'nope'] })
  t.equal(unknownField.status, 422)
  t.equal(unknownField.body.errors[0].pointer, '/fields/1')

  const etag = created.body.results[2].etag
  const updated = await ann.post('/api/contacts/batch/update', {
    inputs: [
      { id: three, job_title: 'CTO', if_match: etag },
      { id: one, job_title: 'Stale', if_match: etag },
      { id: MISSING, job_title: 'x' },
      { id: one, email: 'still an email?' },
    ],
  })
  t.equal(updated.status, 200, updated.text)
  t.same(statuses(updated.body), [200, 412, 404, 422])
  t.equal(updated.body.results[0].data.job_title, 'CTO')
  t.equal((await ann.get(`/api/contacts/${one}`)).body.data.job_title, null, 'the refused items changed nothing')

  const upserted = await ann.post('/api/contacts/batch/upsert', {
    match_on: 'email',
    inputs: [
      { email: 'One@Batch.test', city: 'Lyon' },
      { email: 'new@batch.test', first_name: 'New' },
    ],
  })
  t.equal(upserted.status, 200, upserted.text)
  t.same(statuses(upserted.body), [200, 201])
  t.equal(upserted.body.results[0].data.id, one, 'matched case-insensitively')
  t.equal(upserted.body.results[0].data.city, 'Lyon')
  const domainOnContacts = await ann.post('/api/contacts/batch/upsert', { match_on: 'domain', inputs: [] })
  t.equal(domainOnContacts.status, 422, 'contacts match on id or email only')

  const companies = await ann.post('/api/companies/batch/upsert', {
    match_on: 'domain',
    inputs: [{ name: 'Globex', domain: 'globex.test' }, { name: 'Globex again', domain: 'globex.test' }, { name: 'No domain' }],
  })
  t.same(statuses(companies.body), [201, 200, 422], 'the second input finds the record the first created')
  t.equal(companies.body.results[1].data.name, 'Globex again')

  const deleted = await ann.post('/api/contacts/batch/delete', { ids: [three, three, MISSING] })
  t.same(statuses(deleted.body), [204, 404, 404], 'a second delete of the same id finds nothing')
  t.equal(deleted.body.results[0].data, undefined)
  t.equal((await ann.get(`/api/contacts/${three}`)).status, 404)
})

t.test('at most 100 inputs', async (t) => {
  const inputs = Array.from({ length: 101 }, (_, index) => ({ name: `Deal ${index}` }))
  const tooMany = await ann.post('/api/deals/batch/create', { inputs })
  t.equal(tooMany.status, 422)
  t.equal(tooMany.body.code, 'batch_too_large')
  t.equal(tooMany.body.errors[0].pointer, '/inputs')
  t.equal((await ann.post('/api/deals/batch/delete', { ids: inputs.map(() => MISSING) })).body.code, 'batch_too_large')
  const hundred = await ann.post('/api/deals/batch/create', { inputs: inputs.slice(1) })
  t.equal(hundred.status, 200)
  t.equal(hundred.body.counts.succeeded, 100)
  t.same(
    hundred.body.results.map((result: any) => [result.index, result.data.name]),
    inputs.slice(1).map((input, index) => [index, input.name]),
    'each result is its input’s record, in input order',
  )
})

t.test('atomic: one failed item writes nothing; non-atomic keeps the others', async (t) => {
  const inputs = [{ name: 'Atomic A' }, { name: '' }, { name: 'Atomic C', stage: 'no such stage' }, { name: 'Atomic D' }]
  const atomic = await ann.post('/api/deals/batch/create', { inputs, atomic: true })
  t.equal(atomic.status, 422, atomic.text)
  t.equal(atomic.body.code, 'batch_failed')
  t.equal(atomic.headers.get('content-type'), 'application/problem+json')
  t.same(statuses(atomic.body), [424, 422, 422, 424], 'the failed items carry their problems, the others 424')
  t.same(atomic.body.counts, { succeeded: 0, failed: 4 })
  const names = async () =>
    (await world.owner(`select name from crm.deals where name like 'Atomic %' order by name`)).rows.map((row) => row.name)
  t.same(await names(), [], 'nothing was written')

  const partial = await ann.post('/api/deals/batch/create', { inputs })
  t.same(statuses(partial.body), [201, 422, 422, 201])
  t.same(await names(), ['Atomic A', 'Atomic D'])

  const fine = await ann.post('/api/deals/batch/create', { inputs: [{ name: 'Atomic E' }], atomic: true })
  t.equal(fine.status, 200)
  t.same(statuses(fine.body), [201])
})

t.test('Idempotency-Key covers the whole call', async (t) => {
  const body = { inputs: [{ name: 'Idem 1' }, { name: 'Idem 2' }] }
  const first = await ann.post('/api/companies/batch/create', body, { 'idempotency-key': 'batch-1' })
  t.equal(first.status, 200)
  const again = await ann.post('/api/companies/batch/create', body, { 'idempotency-key': 'batch-1' })
  t.equal(again.status, 200)
  t.equal(again.headers.get('idempotent-replayed'), 'true')
  t.same(again.body, first.body)
  const { rows } = await world.owner(`select count(*)::int as n from crm.companies where name like 'Idem %'`)
  t.equal(rows[0].n, 2, 'the replay created nothing')
  const other = await ann.post('/api/companies/batch/create', { inputs: [{ name: 'Idem 3' }] }, { 'idempotency-key': 'batch-1' })
  t.equal(other.status, 409)
  t.equal(other.body.code, 'idempotency_conflict')

  const failing = { inputs: [{ name: '' }], atomic: true }
  t.equal((await ann.post('/api/companies/batch/create', failing, { 'idempotency-key': 'batch-2' })).status, 422)
  const retried = await ann.post('/api/companies/batch/create', failing, { 'idempotency-key': 'batch-2' })
  t.equal(retried.headers.get('idempotent-replayed'), null, 'a failed atomic batch is not remembered: a retry runs again')
})

t.test('permissions apply per item, in row-level security', async (t) => {
  const mine = (await ann.post('/api/deals', { name: 'Ann deal' })).body.data.id
  const bobs = (await bob.post('/api/deals', { name: 'Bob deal' })).body.data.id
  const update = await ann.post('/api/deals/batch/update', {
    inputs: [
      { id: mine, amount: '10.00' },
      { id: bobs, amount: '20.00' },
    ],
  })
  t.same(statuses(update.body), [200, 403], 'a member updates her own deal, not another member’s')
  t.equal(update.body.results[1].problem.code, 'forbidden')
  const owner = await ann.post('/api/deals/batch/create', { inputs: [{ name: 'For Bob', owner_id: bob.member.id }, { name: 'Mine' }] })
  t.same(statuses(owner.body), [403, 201], 'create:own refuses another owner per item')
  const deletes = await ann.post('/api/deals/batch/delete', { ids: [bobs, mine] })
  t.same(statuses(deletes.body), [403, 204])
  const carol = world.as('carol@acme.test')
  const carols = (await carol.post('/api/deals', { name: 'Carol deal' })).body.data.id
  const invisible = await carol.post('/api/deals/batch/read', { ids: [carols, bobs] })
  t.same(statuses(invisible.body), [200, 404], 'a record the caller may not see is a 404 item, like absent')
  const hidden = await carol.post('/api/deals/batch/update', {
    inputs: [
      { id: bobs, name: 'Taken' },
      { id: carols, name: 'Kept' },
    ],
  })
  t.same(statuses(hidden.body), [404, 200])
  t.equal((await bob.get(`/api/deals/${bobs}`)).body.data.name, 'Bob deal', 'the invisible record is unchanged')
  const readOnly = await reader.post('/api/deals/batch/create', { inputs: [{ name: 'x' }] })
  t.same(statuses(readOnly.body), [403])

  const scoped = await withOwner(world.server.databaseUrl, async (client) => ({
    read: await mintToken(client, ann.member.id, { scopes: ['deals:read'] }),
    contacts: await mintToken(client, ann.member.id, { scopes: ['contacts:write'] }),
  }))
  const as = (token: string, path: string, body: unknown) =>
    world.server.request('POST', path, { token, body, headers: { 'x-tenant-slug': world.tenant.slug } })
  const readOnlyToken = await as(scoped.read, '/api/deals/batch/update', { inputs: [{ id: bobs, name: 'x' }] })
  t.equal(readOnlyToken.status, 403)
  t.equal(readOnlyToken.body.code, 'insufficient_scope')
  t.equal((await as(scoped.read, '/api/deals/batch/read', { ids: [bobs] })).status, 200, 'deals:read may read in batch')
  const contactsToken = await as(scoped.contacts, '/api/deals/batch/read', { ids: [bobs] })
  t.equal(contactsToken.status, 403, 'a token without deals:read reads no deal')
})

t.test('every record written emits its own event, with the caller as actor via api', async (t) => {
  const created = await admin.post('/api/companies/batch/create', { inputs: [{ name: 'Ev 1' }, { name: 'Ev 2' }, { name: '' }] })
  const ids = created.body.results.filter((result: any) => result.data).map((result: any) => result.data.id)
  t.equal(ids.length, 2)
  await admin.post('/api/companies/batch/update', {
    inputs: [
      { id: ids[0], city: 'Paris' },
      { id: ids[1], name: 'Ev 2' },
    ],
  })
  await admin.post('/api/companies/batch/delete', { ids: [ids[1]] })
  const events = await eventsOf(ids)
  t.same(
    events.map((event) => [event.record_id, event.event]),
    [
      [ids[0], 'company.created'],
      [ids[1], 'company.created'],
      [ids[0], 'company.updated'],
      [ids[1], 'company.deleted'],
    ],
    'one event per record written; an update that changes nothing emits none',
  )
  for (const event of events) t.match(event.actor, { type: 'user', id: admin.member.id, via: 'api' })
})
