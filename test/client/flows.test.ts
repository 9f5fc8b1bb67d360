// The flows of docs/api.md's client example, with the generated client (clients/typescript) against the live API:
// sign up and take a token, create (an Idempotency-Key on every create), filter, page through 1,000
// records, import a sample file, export, subscribe a webhook and verify a delivery with the
// standardwebhooks and svix libraries; problems arrive as typed errors and a 429 is waited out.
import t from 'tap'
import { ApiError, createCrmClient, type ImportJob, paginate, unwrap, uploadCsv } from '../../clients/typescript/index.ts'
import { TEST_PASSWORD } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { fixture } from '../imports/helpers.ts'
import { startReceiver, WEBHOOK_TEST_ENV, waitUntil } from '../webhooks/receiver.ts'
import { everyVerifierAccepts } from '../webhooks/verifiers.ts'

t.test('the README flows with the generated client', async (t) => {
  const server = await startTestServer(t, { worker: true, env: { ...WEBHOOK_TEST_ENV, RATE_LIMIT_PER_MINUTE: '100000' } })
  const anonymous = createCrmClient({ baseUrl: server.url })

  // Token: sign up (a workspace in its trial, so webhooks work), then take a token.
  const signedUp = await unwrap(
    anonymous.POST('/api/signup', { body: { email: 'ada@client.test', password: TEST_PASSWORD, name: 'Ada', workspace_name: 'Client' } }),
  )
  t.ok(signedUp, 'signed up')
  const signedIn = await unwrap(
    anonymous.POST('/api/token', { body: { email: 'ada@client.test', password: TEST_PASSWORD, device_name: 'client test' } }),
  )
  if (!('token' in signedIn)) throw new Error('no token: two-factor is off for a new user')
  const sent: Request[] = []
  const crm = createCrmClient({
    baseUrl: server.url,
    token: signedIn.token,
    fetch: (request) => {
      sent.push(request)
      return fetch(request)
    },
  })

  // Create: the client adds an Idempotency-Key; one sent by the caller is kept, and a repeat replays.
  const created = await unwrap(
    crm.POST('/api/contacts', { body: { first_name: 'Grace', last_name: 'Hopper', email: 'grace@example.com' } }),
  )
  t.match(created.data, { first_name: 'Grace', last_name: 'Hopper', email: 'grace@example.com' })
  t.match(sent.at(-1)!.headers.get('idempotency-key'), /^[0-9a-f-]{36}$/, 'a create carries an Idempotency-Key')
  const once = { params: { header: { 'Idempotency-Key': 'import-row-7' } }, body: { first_name: 'Alan', email: 'alan@example.com' } }
  const first = await crm.POST('/api/contacts', once)
  const again = await crm.POST('/api/contacts', once)
  t.equal(again.data?.data.id, first.data?.data.id, 'the same key gets the first answer')
  t.equal(again.response.headers.get('idempotent-replayed'), 'true')
  await unwrap(crm.GET('/api/contacts/{id}', { params: { path: { id: created.data.id } } }))
  t.equal(sent.at(-1)!.headers.get('idempotency-key'), null, 'reads carry none')

  // Problems are typed errors.
  const invalid = await unwrap(crm.POST('/api/contacts', { body: { email: 'not an email' } })).catch((error: unknown) => error)
  t.type(invalid, ApiError)
  t.match(invalid, { status: 422, code: 'validation_failed', problem: { errors: [{ pointer: '/email' }] } })
  const missing = await unwrap(crm.GET('/api/contacts/{id}', { params: { path: { id: '01935f3c-9c00-7a11-9d2e-3c4b5a6f7e8d' } } })).catch(
    (error: unknown) => error,
  )
  t.match(missing, { status: 404, code: 'not_found' })

  // Filter: equality and an operator, as deepObject query parameters.
  const hoppers = await unwrap(crm.GET('/api/contacts', { params: { query: { filter: { last_name: 'Hopper' } } } }))
  t.same(
    hoppers.data.map((contact) => contact.email),
    ['grace@example.com'],
  )
  const startingWithA = await unwrap(crm.GET('/api/contacts', { params: { query: { filter: { email: { starts_with: 'ala' } } } } }))
  t.same(
    startingWithA.data.map((contact) => contact.email),
    ['alan@example.com'],
  )

  // Import a sample file: upload, start with the suggested mapping, wait for the job.
  const upload = await uploadCsv(crm, 'contacts', fixture('people-100.csv'))
  t.equal(upload.row_count, 100)
  const started = await crm.POST('/api/contacts/import/{id}', { params: { path: { id: upload.id } }, body: { mode: 'create' } })
  t.equal(started.response.status, 202)
  const job = await waitUntil(async () => {
    const read = await unwrap(crm.GET('/api/contacts/import/{id}', { params: { path: { id: upload.id } } }))
    const data = (read as unknown as { data: ImportJob }).data
    return data.status === 'completed' || data.status === 'failed' ? data : null
  })
  t.match(job, { status: 'completed', counts: { total: 100, created: 100, failed: 0 } })

  // Page through 1,000 records: a generated file brings the workspace to 1,102 contacts.
  const rows = Array.from({ length: 1000 }, (_, i) => `Person,${i},person${i}@paging.test`)
  const bulk = await uploadCsv(crm, 'contacts', ['First Name,Last Name,Email', ...rows].join('\n'))
  await crm.POST('/api/contacts/import/{id}', { params: { path: { id: bulk.id } }, body: {} })
  await waitUntil(async () => {
    const read = await unwrap(crm.GET('/api/contacts/import/{id}', { params: { path: { id: bulk.id } } }))
    return (read as unknown as { data: ImportJob }).data.status === 'completed'
  }, 60_000)
  const pagesBefore = sent.length
  const ids = new Set<string>()
  for await (const contact of paginate((cursor) => crm.GET('/api/contacts', { params: { query: { limit: 100, cursor } } }))) {
    ids.add(contact.id)
  }
  t.equal(ids.size, 1102, 'every contact once')
  t.equal(sent.length - pagesBefore, 12, 'in 12 pages of at most 100')

  // Export: NDJSON, one line a visible contact.
  const exported = await crm.POST('/api/contacts/export', { body: { format: 'ndjson', fields: ['id', 'email'] }, parseAs: 'text' })
  t.equal(exported.response.status, 200)
  t.equal(exported.response.headers.get('content-type'), 'application/x-ndjson')
  const lines = String(exported.data).trim().split('\n')
  t.equal(lines.length, 1102)
  t.same(Object.keys(JSON.parse(lines[0])), ['id', 'email'])

  // Subscribe a webhook and verify a delivery with both Standard Webhooks libraries (and Stripe's).
  const receiver = await startReceiver(t)
  const subscription = await unwrap(
    crm.POST('/api/webhook-subscriptions', { body: { name: 'Client', url: `${receiver.url}/in`, events: ['contact.created'] } }),
  )
  await unwrap(crm.POST('/api/contacts', { body: { first_name: 'Katherine', email: 'katherine@example.com' } }))
  const [delivery] = await receiver.waitFor((all) => all.length >= 1)
  t.equal(delivery.body.data.object.email, 'katherine@example.com')
  t.same(everyVerifierAccepts(delivery, subscription.data.secret), { stripe: true, standardwebhooks: true, svix: true })
})

t.test('a 429 is waited out per Retry-After and the same request, Idempotency-Key included, is sent again', async (t) => {
  const server = await startTestServer(t)
  const signedUp = await unwrap(
    createCrmClient({ baseUrl: server.url }).POST('/api/signup', {
      body: { email: 'lin@client.test', password: TEST_PASSWORD, name: 'Lin', workspace_name: 'Waits' },
    }),
  )
  t.ok(signedUp)
  const signedIn = await unwrap(
    createCrmClient({ baseUrl: server.url }).POST('/api/token', {
      body: { email: 'lin@client.test', password: TEST_PASSWORD, device_name: 'client test' },
    }),
  )
  if (!('token' in signedIn)) throw new Error('no token')
  // The limit is per clock minute (Retry-After up to 60 s), so the first answer is a 429 made here
  // and the rest reach the live API.
  const keys: (string | null)[] = []
  let limited = 1
  const limitedOnce = async (request: Request) => {
    keys.push(request.headers.get('idempotency-key'))
    if (limited-- <= 0) return fetch(request)
    const problem = { type: '/problems/rate_limited', title: 'Too many requests', status: 429, code: 'rate_limited', request_id: 'x' }
    return new Response(JSON.stringify(problem), {
      status: 429,
      headers: { 'content-type': 'application/problem+json', 'retry-after': '1' },
    })
  }
  const crm = createCrmClient({ baseUrl: server.url, token: signedIn.token, fetch: limitedOnce })
  const created = await unwrap(crm.POST('/api/contacts', { body: { first_name: 'Once', email: 'once@example.com' } }))
  t.equal(keys.length, 2, 'sent twice')
  t.equal(keys[0], keys[1], 'with the same Idempotency-Key')
  const all = await unwrap(crm.GET('/api/contacts'))
  t.same(
    all.data.map((contact) => contact.id),
    [created.data.id],
    'and created once',
  )

  // Past its retries the client hands the 429 over as a typed error.
  limited = 10
  const sends = keys.length
  const giving = createCrmClient({ baseUrl: server.url, token: signedIn.token, retries: 1, fetch: (request) => limitedOnce(request) })
  const refused = await unwrap(giving.GET('/api/contacts')).catch((error: unknown) => error)
  t.match(refused, { status: 429, code: 'rate_limited' })
  t.equal(keys.length - sends, 2, 'one wait, then the error')
})
