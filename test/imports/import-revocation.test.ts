// An import stops once the credential that started it is withdrawn: each batch checks the token
// that queued it, its OAuth grant and the user's API access (as a request would be checked), and
// the job fails with a code saying why, the batches before it kept and none after it landed.
import t from 'tap'
import { processImport } from '../../src/imports/process-import.ts'
import { ownerClient } from '../helpers/database.ts'
import { addMember, createTenant, mintToken } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { upload } from './helpers.ts'

const server = await startTestServer(t)
const db = await ownerClient(t, server.databaseUrl)

const ROWS = 6
const BATCH = 2
const csv = ['email', ...Array.from({ length: ROWS }, (_, i) => `person${i}@example.com`)].join('\r\n') + '\r\n'

type Started = { tenantId: string; userId: string; token: string; importId: string }

/** A member's import of ROWS contacts, queued through the API with `token` (default: the member's own). */
async function queueImport(email: string, token?: (tenantId: string, userId: string) => Promise<string>): Promise<Started> {
  const tenant = await createTenant(server.databaseUrl, { members: { [email]: 'admin' } })
  const member = tenant.members[email]
  const bearer = token ? await token(tenant.id, member.id) : member.token
  const uploaded = await upload(server, bearer, 'contacts', csv)
  if (uploaded.status !== 201) throw new Error(`upload answered ${uploaded.status}: ${uploaded.text}`)
  const queued = await server.request('POST', `/api/contacts/import/${uploaded.body.data.id}`, { token: bearer, body: {} })
  if (queued.status !== 202) throw new Error(`queue answered ${queued.status}: ${queued.text}`)
  return { tenantId: tenant.id, userId: member.id, token: bearer, importId: uploaded.body.data.id }
}

/** Runs the import in batches of BATCH, withdrawing something after the first batch committed. */
async function runWithdrawingAfterFirstBatch(started: Started, withdraw: () => Promise<unknown>) {
  await processImport(
    db,
    { workspace_id: started.tenantId, import_id: started.importId },
    {
      batchSize: BATCH,
      afterCommit: async (batch) => {
        if (batch === 1) await withdraw()
      },
    },
  )
  const { rows } = await db.query(
    `select i.status, i.failure, i.failure_code, i.created,
            (select count(*)::int from crm.contacts c where c.workspace_id = i.workspace_id) as contacts
       from crm.imports i where i.workspace_id = $1 and i.id = $2`,
    [started.tenantId, started.importId],
  )
  return rows[0]
}

t.test('an import whose token is revoked mid-way stops after the batch that was landing', async (t) => {
  const started = await queueImport('ada@revoked-token.test', (_, userId) => mintToken(db, userId))
  const job = await runWithdrawingAfterFirstBatch(started, () =>
    db.query(`update crm.tokens set revoked_at = now() where token_hash = sha256(convert_to($1, 'UTF8'))`, [started.token]),
  )
  t.match(job, { status: 'failed', failure_code: 'token_revoked', created: BATCH, contacts: BATCH })
  t.match(job.failure, /token .* revoked/)
})

t.test("an import whose user's API access is turned off mid-way stops", async (t) => {
  const started = await queueImport('bob@api-off.test')
  const job = await runWithdrawingAfterFirstBatch(started, () =>
    db.query('update crm.users set api_access = false where id = $1', [started.userId]),
  )
  t.match(job, { status: 'failed', failure_code: 'api_access_disabled', created: BATCH, contacts: BATCH })
})

t.test("an import started through an app stops when the app's connection (its OAuth grant) is revoked", async (t) => {
  const started = await queueImport('carol@grant.test', async (tenantId, userId) => {
    const {
      rows: [app],
    } = await db.query(
      `insert into crm.oauth_apps (workspace_id, name, client_id, redirect_uris, confidential)
       values ($1, 'Sync', 'crmapp_' || substr(md5(random()::text), 1, 22), array['https://app.example/callback'], false) returning id`,
      [tenantId],
    )
    return mintToken(db, userId, { kind: 'oauth', scopes: ['contacts:write'], workspaceId: tenantId, oauthAppId: app.id })
  })
  const job = await runWithdrawingAfterFirstBatch(started, () =>
    db.query(
      `update crm.oauth_grants set revoked_at = now()
        where id = (select oauth_grant_id from crm.tokens where token_hash = sha256(convert_to($1, 'UTF8')))`,
      [started.token],
    ),
  )
  t.match(job, { status: 'failed', failure_code: 'grant_revoked', created: BATCH, contacts: BATCH })
})

t.test("an import whose member loses the role's import grant mid-way stops", async (t) => {
  const started = await queueImport('dave@grant-gone.test')
  // Moved to a role of its own (another admin keeps the workspace), whose import grant then goes.
  await addMember(db, started.tenantId, 'admin@grant-gone.test', 'admin')
  await db.query(`insert into crm.roles (workspace_id, name) values ($1, 'importer')`, [started.tenantId])
  await db.query(
    `insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
     select $1, r.id, 'contacts', g.action, 'all' from crm.roles r, (values ('view'), ('create'), ('import')) g (action)
      where r.workspace_id = $1 and r.name = 'importer'`,
    [started.tenantId],
  )
  await db.query(
    `update crm.memberships set role_id = (select id from crm.roles where workspace_id = $1 and name = 'importer') where workspace_id = $1 and user_id = $2`,
    [started.tenantId, started.userId],
  )
  const job = await runWithdrawingAfterFirstBatch(started, () =>
    db.query(
      `delete from crm.role_grants g using crm.roles r
        where r.workspace_id = $1 and r.name = 'importer' and g.workspace_id = r.workspace_id and g.role_id = r.id and g.action = 'import'`,
      [started.tenantId],
    ),
  )
  t.match(job, { status: 'failed', failure_code: 'import_grant_missing', created: BATCH, contacts: BATCH })
})

t.test('GET on the job tells why it stopped', async (t) => {
  const started = await queueImport('erin@why.test', (_, userId) => mintToken(db, userId))
  await runWithdrawingAfterFirstBatch(started, () =>
    db.query(`update crm.tokens set revoked_at = now() where token_hash = sha256(convert_to($1, 'UTF8'))`, [started.token]),
  )
  const other = await mintToken(db, started.userId)
  const answer = await server.request('GET', `/api/contacts/import/${started.importId}`, { token: other })
  t.equal(answer.status, 200)
  t.match(answer.body.data, { status: 'failed', failure_code: 'token_revoked', counts: { created: BATCH } })
})
