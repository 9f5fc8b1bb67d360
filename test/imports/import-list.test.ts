// GET /api/{type}/import: the imports a caller may find again. A member sees the imports they
// started, an admin every import of the workspace, another workspace none (row-level security:
// imports_select_own_or_admin); newest first, paged by cursor, one type at a time.
import t from 'tap'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { upload } from './helpers.ts'

t.test('the list of imports: own for members, all for admins, newest first, paged', async (t) => {
  const server = await startTestServer(t)
  const acme = await createTenant(server.databaseUrl, {
    slug: 'acme',
    members: { 'admin@acme.test': 'admin', 'ann@acme.test': 'member', 'bob@acme.test': 'member' },
  })
  const other = await createTenant(server.databaseUrl, { slug: 'other', members: { 'admin@other.test': 'admin' } })
  // ann and bob may import contacts here (the built-in member role may not): a role of the workspace's own.
  const db = await ownerClient(t, server.databaseUrl)
  await db.query(`insert into crm.roles (workspace_id, name) values ($1, 'importer')`, [acme.id])
  await db.query(
    `insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
     select $1, r.id, 'contacts', g.action, 'own' from crm.roles r, (values ('view'), ('import')) g (action)
      where r.workspace_id = $1 and r.name = 'importer'`,
    [acme.id],
  )
  await db.query(
    `update crm.memberships set role_id = (select id from crm.roles where workspace_id = $1 and name = 'importer')
      where workspace_id = $1 and user_id = any($2::uuid[])`,
    [acme.id, [acme.members['ann@acme.test'].id, acme.members['bob@acme.test'].id]],
  )
  const token = (email: string) => acme.members[email].token
  const uploaded: Record<string, string[]> = { 'admin@acme.test': [], 'ann@acme.test': [], 'bob@acme.test': [] }
  for (const email of ['ann@acme.test', 'bob@acme.test', 'ann@acme.test', 'admin@acme.test']) {
    const response = await upload(server, token(email), 'contacts', 'First Name,Email\nAda,ada@example.com\n', `${email}.csv`)
    t.equal(response.status, 201, `${email} uploads: ${response.text}`)
    uploaded[email].push(response.body.data.id)
  }
  const companies = await upload(server, token('admin@acme.test'), 'companies', 'Name\nAcme\n')
  t.equal(companies.status, 201)

  const list = async (email: string, query = '') => {
    const response = await server.request('GET', `/api/contacts/import${query}`, { token: token(email) })
    t.equal(response.status, 200, `${email} lists ${query}: ${response.text.slice(0, 300)}`)
    return response.body
  }
  const ann = await list('ann@acme.test')
  t.same(
    ann.data.map((job: { id: string }) => job.id),
    [...uploaded['ann@acme.test']].reverse(),
    'a member sees the imports they started, newest first',
  )
  t.match(ann.data[0], { status: 'uploaded', file_name: 'ann@acme.test.csv', counts: { total: 1 } }, 'each with status, counts, file name')
  t.notOk('errors' in ann.data[0], 'a list entry carries no errors (GET the import for them)')
  t.same((await list('bob@acme.test')).data.length, 1, 'bob sees his one')

  const all: string[] = []
  let cursor: string | null = null
  do {
    const body = await list('admin@acme.test', `?limit=1${cursor ? `&cursor=${cursor}` : ''}`)
    t.ok(body.data.length <= 1)
    all.push(...body.data.map((job: { id: string }) => job.id))
    cursor = body.next_cursor
  } while (cursor)
  const everyContactsImport = [...uploaded['ann@acme.test'], ...uploaded['bob@acme.test'], ...uploaded['admin@acme.test']]
  t.same(
    [...all].sort(),
    everyContactsImport.sort(),
    "an admin pages through every contacts import of the workspace, the companies' not among them",
  )
  t.same(all, [...all].sort().reverse(), 'newest first (ids are time-ordered)')

  const outsider = await server.request('GET', '/api/contacts/import', { token: other.members['admin@other.test'].token })
  t.same(outsider.body.data, [], "another workspace's admin sees none")

  const unknown = await server.request('GET', '/api/contacts/import?status=failed', { token: token('ann@acme.test') })
  t.equal(unknown.status, 400, 'an unknown parameter is refused')
  const forged = await server.request('GET', '/api/contacts/import?cursor=bm90LWEtY3Vyc29y', { token: token('ann@acme.test') })
  t.equal(forged.status, 400, 'a cursor made by hand is refused')
})
