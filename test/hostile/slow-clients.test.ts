// Slow clients and uploads cannot starve the service (docs/api.md sections 2 and 9): a body that stops
// arriving gets 408 and its socket closed, uploads are received whole (into a temporary file that
// is always removed) before a connection is taken, and a workspace runs at most 4 uploads at once.
import { mkdtempSync, readdirSync } from 'node:fs'
import { request as httpRequest } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer, type TestServer } from '../helpers/server.ts'
import { upload } from '../imports/helpers.ts'

// Uploads are received under os.tmpdir(): a directory of this file's own shows what is left behind.
const uploadsDirectory = mkdtempSync(join(tmpdir(), 'crm-slow-clients-'))
process.env.TMPDIR = uploadsDirectory
const leftUploads = () => readdirSync(uploadsDirectory).filter((name) => name.startsWith('crm-upload-'))

const server = await startTestServer(t, { env: { BODY_IDLE_TIMEOUT_MS: '500' } })
const attacker = await createTenant(server.databaseUrl, { members: { 'mallory@evil.test': 'admin' } })
const victim = await createTenant(server.databaseUrl, { members: { 'ada@acme.test': 'admin' } })
const malloryToken = attacker.members['mallory@evil.test'].token
const adaToken = victim.members['ada@acme.test'].token

const BOUNDARY = 'slowboundary42'
const MULTIPART_HEAD = `--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="slow.csv"\r\nContent-Type: text/csv\r\n\r\n`
const uploadHeaders = (token: string, length: number) => ({
  authorization: `Bearer ${token}`,
  'content-type': `multipart/form-data; boundary=${BOUNDARY}`,
  'content-length': String(length),
})

type Answer = { status: number; headers: Record<string, string | string[] | undefined>; body: any; closed: Promise<void> }

/** A request whose body the test writes by hand; `answer` settles with the response, or null when the socket dies first. */
function openRequest(target: TestServer, method: string, path: string, headers: Record<string, string>) {
  const url = new URL(path, target.url)
  const request = httpRequest(url, { method, headers, agent: false })
  const answer = new Promise<Answer | null>((resolve) => {
    request.on('error', () => resolve(null))
    request.on('response', (response) => {
      const closed = new Promise<void>((resolveClosed) => response.socket.once('close', () => resolveClosed()))
      let text = ''
      response.setEncoding('utf8')
      response.on('data', (chunk) => {
        text += chunk
      })
      response.on('end', () => {
        let body: unknown = null
        try {
          body = JSON.parse(text)
        } catch {}
        resolve({ status: response.statusCode ?? 0, headers: response.headers, body, closed })
      })
      response.on('error', () => resolve(null))
    })
  })
  return { request, answer }
}

/** The answer, or 'no answer' after `ms`: a stalled request on code without deadlines never answers. */
const within = <T>(promise: Promise<T>, ms: number) =>
  Promise.race([promise, new Promise<'no answer'>((resolve) => setTimeout(() => resolve('no answer'), ms).unref())])

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

t.test('a JSON body that stops arriving gets 408 request_timeout and its connection closed', async (t) => {
  const { request, answer } = openRequest(server, 'POST', '/api/contacts', {
    authorization: `Bearer ${adaToken}`,
    'content-type': 'application/json',
    'content-length': '100',
  })
  request.write('{"first_name": "Sl')
  const answered = await within(answer, 5000)
  request.destroy()
  t.not(answered, 'no answer', 'answered while the client still owed bytes')
  if (answered === 'no answer' || answered === null) return
  t.equal(answered.status, 408)
  t.equal(answered.headers['content-type'], 'application/problem+json')
  t.match(answered.body, { code: 'request_timeout', status: 408, type: '/problems/request_timeout' })
  t.equal(answered.headers.connection, 'close')
  await answered.closed
  t.pass('the server closed the socket')
})

t.test('a body that keeps trickling gets 408 once the head start is spent', async (t) => {
  const { request, answer } = openRequest(server, 'POST', '/api/contacts', {
    authorization: `Bearer ${adaToken}`,
    'content-type': 'application/json',
    'content-length': '1000',
  })
  request.write('{"first_name": "')
  // A byte every 100 ms never trips the idle deadline (500 ms here); the rate deadline cuts it.
  const trickle = setInterval(() => request.write('a'), 100)
  const answered = await within(answer, 5000)
  clearInterval(trickle)
  request.destroy()
  t.not(answered, 'no answer', 'answered while the client still owed bytes')
  if (answered === 'no answer' || answered === null) return
  t.equal(answered.status, 408)
  t.match(answered.body, { code: 'request_timeout', detail: /KiB\/s/ })
})

t.test('an upload that stops arriving gets 408, and its temporary file is removed', async (t) => {
  const { request, answer } = openRequest(server, 'POST', '/api/contacts/import/upload', uploadHeaders(malloryToken, 10_000))
  request.write(`${MULTIPART_HEAD}first_name,email\r\nAnn,ann@example.com\r\n`)
  const answered = await within(answer, 5000)
  request.destroy()
  t.not(answered, 'no answer', 'answered while the client still owed bytes')
  if (answered === 'no answer' || answered === null) return
  t.equal(answered.status, 408)
  t.equal(answered.body.code, 'request_timeout')
  t.same(leftUploads(), [], 'nothing left in the temporary directory')

  // A Content-Type no upload can have is refused from the headers, before the body is received.
  const refused = openRequest(server, 'POST', '/api/contacts/import/upload', {
    ...uploadHeaders(malloryToken, 10_000),
    'content-type': 'application/pdf',
  })
  refused.request.write('%PDF-1.7')
  const refusal = await within(refused.answer, 5000)
  refused.request.destroy()
  t.match(refusal, { status: 415, body: { code: 'unsupported_media_type' } }, 'a wrong Content-Type is refused at once')
})

t.test('temporary files are gone after a success, a refusal and an abort', async (t) => {
  const created = await upload(server, malloryToken, 'contacts', 'first_name,email\nAnn,ann@example.com\n')
  t.equal(created.status, 201)
  t.same(leftUploads(), [], 'after a success')

  const refused = await server.request('POST', '/api/contacts/import/upload', {
    token: malloryToken,
    raw: `--${BOUNDARY}\r\nContent-Disposition: form-data; name="other"\r\n\r\nx\r\n--${BOUNDARY}--\r\n`,
    headers: { 'content-type': `multipart/form-data; boundary=${BOUNDARY}` },
  })
  t.equal(refused.status, 422)
  t.same(leftUploads(), [], 'after a refusal')

  const { request, answer } = openRequest(server, 'POST', '/api/contacts/import/upload', uploadHeaders(malloryToken, 10_000))
  request.write(MULTIPART_HEAD)
  let receiving = false
  for (let i = 0; i < 50 && !receiving; i++) {
    await sleep(20)
    receiving = leftUploads().length === 1
  }
  t.ok(receiving, 'the body is received into a temporary file')
  request.destroy()
  await answer
  let left = leftUploads()
  for (let i = 0; i < 100 && left.length > 0; i++) {
    await sleep(20)
    left = leftUploads()
  }
  t.same(left, [], 'after an abort')
})

t.test('a fifth concurrent upload in one workspace gets 429 rate_limited', async (t) => {
  const blocker = await ownerClient(t, server.databaseUrl)
  await blocker.query('begin')
  // Holds every insert into crm.imports: the four uploads stay in progress, in their transaction.
  await blocker.query('lock table crm.imports in share mode')
  const csv = 'first_name,email\nAnn,ann@example.com\n'
  const held = Array.from({ length: 4 }, () => upload(server, malloryToken, 'contacts', csv))
  let waiting = 0
  for (let i = 0; i < 250 && waiting < 4; i++) {
    await sleep(20)
    const { rows } = await blocker.query(
      `select count(*)::int as waiting from pg_locks where relation = 'crm.imports'::regclass and not granted`,
    )
    waiting = rows[0].waiting
  }
  t.equal(waiting, 4, 'four uploads are in progress')
  const fifth = await within(upload(server, malloryToken, 'contacts', csv), 5000)
  await blocker.query('rollback')
  t.not(fifth, 'no answer', 'the fifth upload is answered while four are in progress')
  if (fifth !== 'no answer') {
    t.equal(fifth.status, 429)
    t.equal(fifth.body.code, 'rate_limited')
    t.equal(fifth.headers.get('retry-after'), '10')
  }
  t.same(
    (await Promise.all(held)).map((response) => response.status),
    [201, 201, 201, 201],
    'the four finish once the database moves',
  )
  t.equal((await upload(server, malloryToken, 'contacts', csv)).status, 201, 'and their slots are free again')
  t.same(leftUploads(), [])
})

t.test('a fifth concurrent export in one workspace gets 429 rate_limited', async (t) => {
  const blocker = await ownerClient(t, server.databaseUrl)
  await blocker.query('begin')
  // Holds every read of crm.contacts: the four exports stay in progress, streaming nothing yet.
  await blocker.query('lock table crm.contacts in access exclusive mode')
  const exportContacts = () => server.request('POST', '/api/contacts/export', { token: malloryToken, body: {} })
  const held = Array.from({ length: 4 }, exportContacts)
  let waiting = 0
  for (let i = 0; i < 250 && waiting < 4; i++) {
    await sleep(20)
    const { rows } = await blocker.query(
      `select count(*)::int as waiting from pg_locks where relation = 'crm.contacts'::regclass and not granted`,
    )
    waiting = rows[0].waiting
  }
  t.equal(waiting, 4, 'four exports are in progress')
  const fifth = await within(exportContacts(), 5000)
  await blocker.query('rollback')
  t.not(fifth, 'no answer', 'the fifth export is answered while four are in progress')
  if (fifth !== 'no answer') {
    t.equal(fifth.status, 429)
    t.equal(fifth.body.code, 'rate_limited')
    t.equal(fifth.headers.get('retry-after'), '10')
  }
  t.same(
    (await Promise.all(held)).map((response) => response.status),
    [200, 200, 200, 200],
    'the four finish once the database moves',
  )
  t.equal((await exportContacts()).status, 200, 'and their slots are free again')
})

t.test('30 uploaders trickling a byte a second leave other tenants answered', async (t) => {
  // A pool of 4 connections: on code that reads uploads inside the request transaction, four
  // trickling uploaders hold all of it and everyone else gets 503 after DB_WAIT_MS.
  const small = await startTestServer(t, {
    databaseUrl: server.databaseUrl,
    // The reader makes more than a minute's worth of the per-user limit on a fast machine; that limit is not what is tested here.
    env: { DB_POOL_SIZE: '4', DB_WAIT_MS: '500', RATE_LIMIT_PER_MINUTE: '1000000' },
  })
  const contact = await small.request('POST', '/api/contacts', { token: adaToken, body: { first_name: 'Grace' } })
  t.equal(contact.status, 201)
  const uploaders = Array.from({ length: 30 }, () =>
    openRequest(small, 'POST', '/api/contacts/import/upload', uploadHeaders(malloryToken, 1_000_000)),
  )
  for (const { request } of uploaders) request.write(MULTIPART_HEAD)
  const trickle = setInterval(() => {
    for (const { request } of uploaders) request.write('a')
  }, 1000)

  const statuses: number[] = []
  const timings: number[] = []
  const until = performance.now() + 4000
  await Promise.all(
    Array.from({ length: 4 }, async () => {
      while (performance.now() < until) {
        const started = performance.now()
        const response = await small.request('GET', `/api/contacts/${contact.body.data.id}`, { token: adaToken })
        timings.push(performance.now() - started)
        statuses.push(response.status)
      }
    }),
  )
  clearInterval(trickle)
  for (const { request } of uploaders) request.destroy()
  await Promise.all(uploaders.map(({ answer }) => answer))

  t.ok(statuses.length > 0)
  t.same(
    statuses.filter((status) => status !== 200),
    [],
    `every one of ${statuses.length} GETs answered 200`,
  )
  timings.sort((a, b) => a - b)
  t.comment(
    `GET /api/contacts/{id} beside 30 trickling uploads: ${timings.length} requests, p50 ${timings[Math.floor(timings.length * 0.5)]?.toFixed(1)} ms, p99 ${timings[Math.floor(timings.length * 0.99)]?.toFixed(1)} ms`,
  )
  let left = leftUploads()
  for (let i = 0; i < 100 && left.length > 0; i++) {
    await sleep(20)
    left = leftUploads()
  }
  t.same(left, [], 'every aborted upload removed its temporary file')
  const failures = small.logLines.filter((line) => JSON.parse(line).level === 'error')
  t.same(failures, [], 'a client that went away is logged as such, not as a failed request')
})
