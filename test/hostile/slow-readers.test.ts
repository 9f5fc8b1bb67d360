// Streams cannot take the pool (docs/api.md section 9, docs/security.md): an export or
// an errors.csv holds a connection for as long as its client reads, so clients that stop reading
// are bounded per workspace (4, errors.csv counted as an export) and per process
// (STREAMS_PER_PROCESS), and every other tenant keeps being answered; a reader that keeps its
// connection but takes nothing for STREAM_STALL_MS is cut, and its connection and slots come back.
import { connect, type Socket } from 'node:net'
import t, { type Test } from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant, type Tenant } from '../helpers/fixtures.ts'
import { startTestServer, type TestServer } from '../helpers/server.ts'
import { until } from '../helpers/until.ts'
import { upload } from '../imports/helpers.ts'

// The default pool of 20 and a short wait: before the bound, twenty slow readers held every
// connection and the next request got 503 after DB_WAIT_MS.
const server = await startTestServer(t, { env: { DB_WAIT_MS: '500', RATE_LIMIT_PER_MINUTE: '1000000' } })
const owner = await ownerClient(t, server.databaseUrl)
const victim = await createTenant(server.databaseUrl, { members: { 'ada@victim.test': 'admin' } })
const victimToken = victim.members['ada@victim.test'].token

t.equal(server.config.streamsPerProcess, 5, 'the default bound is a quarter of the pool')

type Reader = { token: string; importId: string }

/** A workspace with an import whose errors.csv is far larger than what sockets buffer (about 20 MB). */
let readerWorkspaces = 0
async function readerWorkspace(): Promise<Reader> {
  const email = `mallory-${++readerWorkspaces}@slow.test`
  const tenant: Tenant = await createTenant(server.databaseUrl, { members: { [email]: 'admin' } })
  const member = tenant.members[email]
  const uploaded = await upload(server, member.token, 'contacts', 'email\r\na@example.com\r\n')
  if (uploaded.status !== 201) throw new Error(`upload answered ${uploaded.status}: ${uploaded.text}`)
  await owner.query(
    `insert into crm.import_errors (workspace_id, import_id, row, position, user_id, message)
     select $1, $2, n, 1, $3, repeat('slow ', 800) from generate_series(1, 5000) n`,
    [tenant.id, uploaded.body.data.id, member.id],
  )
  return { token: member.token, importId: uploaded.body.data.id }
}

type SlowRead = { status: number; retryAfter: string | null; socket: Socket }

/** GETs errors.csv and stops reading once the status line is in: a client that never reads on. */
function slowRead(reader: Reader, service: TestServer = server): Promise<SlowRead> {
  return new Promise((resolve, reject) => {
    const socket = connect(Number(new URL(service.url).port), '127.0.0.1')
    socket.on('error', reject)
    socket.write(
      `GET /api/contacts/import/${reader.importId}/errors.csv HTTP/1.1\r\nHost: crm.test\r\nAuthorization: Bearer ${reader.token}\r\n\r\n`,
    )
    let head = ''
    const onData = (chunk: Buffer) => {
      head += chunk.toString('latin1')
      const end = head.indexOf('\r\n\r\n')
      if (end < 0) return
      socket.pause()
      socket.off('data', onData)
      t.teardown(() => socket.destroy())
      const status = Number(head.slice(9, 12))
      const retryAfter = /\r\nretry-after: *(\d+)/i.exec(head.slice(0, end))?.[1] ?? null
      resolve({ status, retryAfter, socket })
    }
    socket.on('data', onData)
  })
}

/** Connections inside a transaction (no worker runs here: only the streams), as PostgreSQL sees them. */
async function streamingConnections(): Promise<number> {
  const { rows } = await owner.query(
    `select count(*)::int as n from pg_stat_activity
      where datname = current_database() and xact_start is not null and pid <> pg_backend_pid()`,
  )
  return rows[0].n
}

async function checkReaders(t: Test, readers: Reader[], expected: Record<number, number>) {
  const answers = await Promise.all(readers.map((reader) => slowRead(reader)))
  const statuses: Record<number, number> = {}
  for (const { status } of answers) statuses[status] = (statuses[status] ?? 0) + 1
  t.same(statuses, expected, 'the readers are streamed up to the bounds, then refused')
  const streaming = statuses[200] ?? 0
  t.ok(
    answers.filter((answer) => answer.status !== 200).every((answer) => answer.retryAfter !== null),
    'every refusal says when to retry',
  )
  // Another transaction may be passing through at the moment of a look (the rate limit's settlement):
  // the streams' own are there once it has gone.
  await until('the streaming readers hold their connections', async () => (await streamingConnections()) === streaming)
  t.pass('the streaming readers still hold their connections (they stopped reading)')

  // Exports share the bound: with every stream slot taken, a third workspace's export is refused at once.
  const email = `eve-${++readerWorkspaces}@export.test`
  const exporter = await createTenant(server.databaseUrl, { members: { [email]: 'admin' } })
  if (streaming === server.config.streamsPerProcess) {
    const exported = await server.request('POST', '/api/contacts/export', { token: exporter.members[email].token, body: {} })
    t.equal(exported.status, 503, 'an export past the bound is refused')
    t.equal(exported.body.code, 'unavailable')
    t.ok(exported.headers.get('retry-after'), 'with Retry-After')
  }

  const list = await server.request('GET', '/api/contacts', { token: victimToken })
  t.equal(list.status, 200, "another workspace's GET is answered while the readers hold their streams")

  for (const answer of answers) answer.socket.destroy()
  // The connections come back when the clients go away (a stream cut in the middle once kept its
  // connection for good), and so do the slots: a reader that reads is streamed again.
  let left = streaming
  for (let i = 0; i < 600 && left > 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50))
    left = await streamingConnections()
  }
  t.equal(left, 0, 'the streams of the readers that went away are rolled back')
  let again = 0
  for (let i = 0; i < 200 && again !== 200; i++) {
    const response = await server.request('GET', `/api/contacts/import/${readers[0].importId}/errors.csv`, { token: readers[0].token })
    again = response.status
    if (again !== 200) await new Promise((resolve) => setTimeout(resolve, 50))
  }
  t.equal(again, 200, 'once the slow readers are gone, errors.csv is streamed again')
}

t.test('20 slow readers of errors.csv in one workspace leave the other tenants answered', async (t) => {
  const reader = await readerWorkspace()
  // The workspace's 4 slots are the tighter bound: errors.csv takes one like an export.
  await checkReaders(
    t,
    Array.from({ length: 20 }, () => reader),
    { 200: 4, 429: 16 },
  )
})

t.test('slow readers spread over five workspaces leave the other tenants answered', async (t) => {
  const workspaces: Reader[] = []
  for (let i = 0; i < 5; i++) workspaces.push(await readerWorkspace())
  await checkReaders(
    t,
    workspaces.flatMap((reader) => Array.from({ length: 4 }, () => reader)),
    { 200: 5, 503: 15 },
  )
})

t.test('a reader that stops reading is cut after STREAM_STALL_MS, and its slot and connection come back', async (t) => {
  // One stream slot: the stalled reader holds the only one until it is cut.
  const tight = await startTestServer(t, {
    databaseUrl: server.databaseUrl,
    env: { RATE_LIMIT_PER_MINUTE: '1000000', STREAMS_PER_PROCESS: '1', STREAM_STALL_MS: '1000' },
  })
  const reader = await readerWorkspace()
  const stalled = await slowRead(reader, tight)
  t.equal(stalled.status, 200, 'the reader is streamed, then stops reading')
  let closed = false
  stalled.socket.on('close', () => (closed = true))
  // The client never closes its socket: the server must.
  await until('the stalled stream is rolled back', async () => (await streamingConnections()) === 0)
  // Reading again, it finds the response cut: the rest of what was buffered, then the end.
  stalled.socket.resume()
  await until('the server closed the stalled connection', async () => closed)
  const again = await tight.request('GET', `/api/contacts/import/${reader.importId}/errors.csv`, { token: reader.token })
  t.equal(again.status, 200, 'the only stream slot is free again: a reader that reads is streamed')
  t.ok(again.text.split('\r\n').length > 5000, 'the whole file')
  t.ok(
    tight.logLines.some((line) => line.includes('client went away') && line.includes('read nothing of the response')),
    'the cut is logged with its reason',
  )
})
