// A worker that dies mid-import leaves whole batches: counts always match the database, and the
// retried job resumes after the last committed batch. Two ways:
// 1. processImport run in this process with hooks that throw inside a batch transaction (a death
//    before COMMIT) and right after one (a death between batches), then run again;
// 2. the real worker (`node bin/crm.js worker`) killed with SIGKILL mid-import; its job is unlocked
//    (as graphile-worker does after its lock timeout) and a fresh worker finishes it.
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { processImport } from '../../src/imports/process-import.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer, TEST_APP_SECRET } from '../helpers/server.ts'
import { upload, waitForImport } from './helpers.ts'

function contactsCsv(rows: number, offset = 0): string {
  const lines = ['First Name,Last Name,Email,Company']
  for (let i = 1 + offset; i <= rows + offset; i++) lines.push(`First${i},Last${i},person${i}@example.com,Company ${i % 50}`)
  return lines.join('\n') + '\n'
}

t.test('a death inside or between batches loses nothing and lands nothing twice', async (t) => {
  const server = await startTestServer(t, { worker: false })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, server.databaseUrl)
  const uploaded = await upload(server, admin.token, 'contacts', contactsCsv(1000))
  const id = uploaded.body.data.id
  t.equal((await server.request('POST', `/api/contacts/import/${id}`, { token: admin.token, body: {} })).status, 202)
  const job = { workspace_id: tenant.id, import_id: id }
  const state = async () =>
    (
      await db.query(
        `select i.last_row_done, i.created, i.companies_created,
              (select count(*)::int from crm.contacts c where c.workspace_id = i.workspace_id) as contacts,
              (select count(*)::int from crm.companies c where c.workspace_id = i.workspace_id) as companies,
              (select count(*)::int from crm.events e where e.workspace_id = i.workspace_id and e.event = 'contact.created') as events
         from crm.imports i where i.workspace_id = $1 and i.id = $2`,
        [tenant.id, id],
      )
    ).rows[0]

  await t.rejects(
    processImport(db, job, {
      batchSize: 300,
      beforeCommit: (batch) => {
        if (batch === 2) throw new Error('killed before commit')
      },
    }),
    /killed before commit/,
  )
  t.same(
    await state(),
    { last_row_done: 300, created: 300, companies_created: 50, contacts: 300, companies: 50, events: 300 },
    'batch 2 left no trace',
  )

  await t.rejects(
    processImport(db, job, {
      batchSize: 300,
      afterCommit: (batch) => {
        if (batch === 1) throw new Error('killed after commit')
      },
    }),
    /killed after commit/,
  )
  t.same(
    await state(),
    { last_row_done: 600, created: 600, companies_created: 50, contacts: 600, companies: 50, events: 600 },
    'the retry resumed after row 300',
  )

  t.equal(await processImport(db, job, { batchSize: 300 }), true)
  t.same(await state(), { last_row_done: 1000, created: 1000, companies_created: 50, contacts: 1000, companies: 50, events: 1000 })
  const done = await waitForImport(server, admin.token, 'contacts', id)
  t.same(done.counts, { total: 1000, created: 1000, updated: 0, skipped: 0, failed: 0, companies_created: 50 })
  t.equal(await processImport(db, job), false, 'a finished import is left alone')
})

t.test('the worker process killed with SIGKILL mid-import: a new worker finishes it', async (t) => {
  const server = await startTestServer(t, { worker: false })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@a.test': 'admin' } })
  const admin = tenant.members['admin@a.test']
  const db = await ownerClient(t, server.databaseUrl)
  const rows = 60_000
  const uploaded = await upload(server, admin.token, 'contacts', contactsCsv(rows))
  const id = uploaded.body.data.id
  t.equal((await server.request('POST', `/api/contacts/import/${id}`, { token: admin.token, body: {} })).status, 202)

  const root = fileURLToPath(new URL('../../', import.meta.url))
  const env = { ...process.env, DATABASE_URL: server.databaseUrl, APP_SECRET: TEST_APP_SECRET, LOG_LEVEL: 'error', WORKER_CONCURRENCY: '1' }
  const startWorker = () => spawn(process.execPath, ['bin/crm.js', 'worker'], { cwd: root, env, stdio: 'ignore' })
  const child = startWorker()
  const exited = new Promise((resolve) => child.on('exit', resolve))
  // Kill it once at least one batch is committed and the import is still running.
  for (let waited = 0; ; waited += 50) {
    const {
      rows: [row],
    } = await db.query('select last_row_done from crm.imports where id = $1', [id])
    if (row.last_row_done > 0) break
    if (waited > 60_000) throw new Error('the worker never committed a batch')
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  child.kill('SIGKILL')
  await exited
  const {
    rows: [killed],
  } = await db.query(
    `select i.status, i.last_row_done, i.created, (select count(*)::int from crm.contacts c where c.workspace_id = i.workspace_id) as contacts
       from crm.imports i where i.id = $1`,
    [id],
  )
  t.equal(killed.status, 'processing')
  t.ok(killed.last_row_done < rows, `killed mid-import (after row ${killed.last_row_done})`)
  t.equal(killed.contacts, killed.created, 'counts match the database: no half batch')
  t.equal(killed.contacts, killed.last_row_done, 'every row up to the mark landed, none after it')

  // graphile-worker frees a dead worker's jobs after its lock timeout; do it now.
  await db.query(`update graphile_worker._private_jobs set locked_at = null, locked_by = null, run_at = now() where locked_by is not null`)
  const second = startWorker()
  t.teardown(() => second.kill('SIGKILL'))
  const done = await waitForImport(server, admin.token, 'contacts', id, 120_000)
  t.equal(done.status, 'completed')
  t.equal(done.counts.created, rows)
  const {
    rows: [final],
  } = await db.query(
    `select (select count(*)::int from crm.contacts where workspace_id = $1) as contacts,
            (select count(distinct email)::int from crm.contacts where workspace_id = $1) as emails,
            (select count(*)::int from crm.events where workspace_id = $1 and event = 'contact.created') as events`,
    [tenant.id],
  )
  t.same(final, { contacts: rows, emails: rows, events: rows })
})
