// A running export never holds a lock that revocation or suspension needs (docs/security.md): its
// transaction is read-only and writes no bookkeeping (the token's last use, the user's last
// workspace), which a short transaction of its own wrote before. An export whose client stopped
// reading keeps its transaction open for up to EXPORT_TIMEOUT_MS; before, it held the token's row
// (last_used_at, the kept context) and DELETE /api/tokens/{id} waited for it, answering 503 when
// its statement timed out while the token went on working. The statement timeout is short here, so
// a revocation that waits answers 503 quickly: each check is of the status, never of the time taken.
import { connect, type Socket } from 'node:net'
import t from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant, mintToken } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { until } from '../helpers/until.ts'

const server = await startTestServer(t, { env: { STATEMENT_TIMEOUT_MS: '2000', RATE_LIMIT_PER_MINUTE: '1000000' } })
const owner = await ownerClient(t, server.databaseUrl)
const tenant = await createTenant(server.databaseUrl, { members: { 'ada@locks.test': 'admin', 'bob@locks.test': 'admin' } })
const ada = tenant.members['ada@locks.test']
const bob = tenant.members['bob@locks.test']

// Far more than sockets buffer (about 24 MB of CSV), so the export's transaction stays open while
// its client does not read.
await owner.query(
  `insert into crm.contacts (workspace_id, owner_id, first_name, job_title, created_by, updated_by)
   select $1, $2, 'Row ' || n, repeat('long ', 40), $2, $2 from generate_series(1, 20000) n`,
  [tenant.id, bob.id],
)

/** A new token of Bob's, never used yet: its first request is the export. */
async function newToken(name: string): Promise<{ id: string; token: string }> {
  const created = await server.request('POST', '/api/tokens', { token: bob.token, body: { name } })
  if (created.status !== 201) throw new Error(`POST /api/tokens answered ${created.status}: ${created.text}`)
  return { id: created.body.token_id, token: created.body.token }
}

/** Starts an export of every contact and stops reading once its status line is in. */
function stalledExport(token: string): Promise<{ status: number; socket: Socket }> {
  return new Promise((resolve, reject) => {
    const socket = connect(Number(new URL(server.url).port), '127.0.0.1')
    socket.on('error', reject)
    const body = '{"format":"csv"}'
    socket.write(
      `POST /api/contacts/export HTTP/1.1\r\nHost: crm.test\r\nAuthorization: Bearer ${token}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    )
    let head = ''
    const onData = (chunk: Buffer) => {
      head += chunk.toString('latin1')
      if (!head.includes('\r\n\r\n')) return
      socket.pause()
      socket.off('data', onData)
      t.teardown(() => socket.destroy())
      resolve({ status: Number(head.slice(9, 12)), socket })
    }
    socket.on('data', onData)
  })
}

/** The export's backend, idle in its transaction between fetches or blocked on its client. */
async function exportBackend(): Promise<{ pid: number; xid: string | null }> {
  return until('the export holds its transaction open', async () => {
    const { rows } = await owner.query(
      `select pid, backend_xid::text as xid from pg_stat_activity
        where datname = current_database() and query like 'fetch forward%' and state like 'idle in transaction%'`,
    )
    return rows[0] as { pid: number; xid: string | null } | undefined
  })
}

async function codeOf(token: string): Promise<string> {
  const answer = await server.request('GET', '/api/me', { token })
  return answer.status === 200 ? 'ok' : answer.body.code
}

t.test('a token whose export is stalled is revoked at once by another token of its user', async (t) => {
  const exporting = await newToken('exporting')
  const stalled = await stalledExport(exporting.token)
  t.equal(stalled.status, 200, 'the export began')
  const backend = await exportBackend()
  t.equal(backend.xid, null, "the export's transaction has no transaction id, so it holds no row lock")
  const { rows } = await owner.query(
    `select count(*)::int as row_locks from pg_locks where pid = $1 and locktype in ('tuple', 'transactionid')`,
    [backend.pid],
  )
  t.equal(rows[0].row_locks, 0, 'pg_locks shows none')
  t.equal((await server.request('DELETE', `/api/tokens/${exporting.id}`, { token: bob.token })).status, 204, 'revoked, not 503')
  t.equal(await codeOf(exporting.token), 'token_revoked', 'and refused on its next request')
  stalled.socket.destroy()
})

t.test('a token whose export is stalled revokes itself at once', async (t) => {
  const exporting = await newToken('revokes itself')
  const stalled = await stalledExport(exporting.token)
  t.equal(stalled.status, 200)
  await exportBackend()
  t.equal((await server.request('DELETE', `/api/tokens/${exporting.id}`, { token: exporting.token })).status, 204)
  t.equal(await codeOf(exporting.token), 'token_revoked')
  stalled.socket.destroy()
})

t.test("an admin suspends a member whose export is stalled at once, and the platform's suspension of the user does not wait", async (t) => {
  const exporting = await newToken('suspended')
  const stalled = await stalledExport(exporting.token)
  t.equal(stalled.status, 200)
  await exportBackend()
  const suspended = await server.request('POST', `/api/members/${bob.id}/suspend`, { token: ada.token })
  t.equal(suspended.status, 200, 'suspended, not 503')
  t.equal(await codeOf(exporting.token), 'user_suspended', 'and the token is refused')
  t.equal((await server.request('POST', `/api/members/${bob.id}/unsuspend`, { token: ada.token })).status, 200)
  // The user's own row (its last workspace) is not held either: the operator's suspension does not wait.
  await owner.query('begin')
  await owner.query(`set local lock_timeout = '1s'`)
  await owner.query('update crm.users set suspended_at = now() where id = $1', [bob.id])
  await owner.query('rollback')
  t.pass("the user's row was free")
  stalled.socket.destroy()
})

t.test('in SQL: crm.resume_identity writes no bookkeeping in a read-only transaction, and so takes no transaction id', async (t) => {
  const token = await mintToken(owner, bob.id)
  const {
    rows: [membership],
  } = await owner.query('select access_version::text from crm.memberships where workspace_id = $1 and user_id = $2', [tenant.id, bob.id])
  // Bookkeeping due: the token never used, the user's last workspace another one.
  await owner.query('update crm.users set last_workspace_id = null where id = $1', [bob.id])
  await owner.query('begin read only')
  try {
    const { rows } = await owner.query(`select failure, user_id from crm.resume_identity($1, $2, $3, 'api', false)`, [
      hashToken(token),
      tenant.id,
      membership.access_version,
    ])
    t.same(rows, [{ failure: null, user_id: bob.id }], 'the identity resumes')
    const { rows: xid } = await owner.query('select pg_current_xact_id_if_assigned()::text as xid')
    t.equal(xid[0].xid, null, 'without a transaction id: nothing was written, no row is locked')
  } finally {
    await owner.query('rollback')
  }
  const { rows } = await owner.query('select last_used_at from crm.tokens where token_hash = $1', [hashToken(token)])
  t.equal(rows[0].last_used_at, null, "the token's last use is left to a read-write transaction")
  await owner.query('begin')
  await owner.query(`select failure from crm.resume_identity($1, $2, $3, 'api', false)`, [
    hashToken(token),
    tenant.id,
    membership.access_version,
  ])
  await owner.query('commit')
  const { rows: after } = await owner.query('select last_used_at from crm.tokens where token_hash = $1', [hashToken(token)])
  t.not(after[0].last_used_at, null, 'which writes it')
})
