// An import judges owners by the scopes of the policies, through crm.owners_outside_scope: a new
// record's owner under the import grant, a matched record's owner and its new owner under the
// update grant, row by row, so that the batch's other rows still land.
import t from 'tap'
import { processImport } from '../../src/imports/process-import.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'

async function scopedTenant(t: Parameters<typeof ownerClient>[0]) {
  const url = await createTestDatabase(t)
  const tenant = await createTenant(url, {
    members: { 'admin@a.test': 'admin', 'bob@a.test': 'member', 'carol@a.test': 'member', 'dave@a.test': 'member' },
    teams: { sales: ['bob@a.test', 'carol@a.test'] },
  })
  const db = await ownerClient(t, url)
  // bob sees every contact, updates his team's, imports his own, may not delete any.
  await db.query(`insert into crm.roles (workspace_id, name) values ($1, 'scoped')`, [tenant.id])
  await db.query(
    `insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
     select $1, r.id, 'contacts', g.action, g.scope from crm.roles r, (values ('view', 'all'), ('update', 'team'), ('import', 'own')) g (action, scope)
      where r.workspace_id = $1 and r.name = 'scoped'`,
    [tenant.id],
  )
  await db.query(
    `update crm.memberships set role_id = (select id from crm.roles where workspace_id = $1 and name = 'scoped') where workspace_id = $1 and user_id = $2`,
    [tenant.id, tenant.members['bob@a.test'].id],
  )
  const ids = Object.fromEntries(Object.entries(tenant.members).map(([email, member]) => [email.split('@')[0], member.id as string]))
  return { tenant, db, ids }
}

t.test('crm.owners_outside_scope judges a set of owners at once: all, team, own, no grant', async (t) => {
  const { tenant, db, ids } = await scopedTenant(t)
  const outside = async (email: string, action: string, owners: (string | null)[]) => {
    await db.query('begin')
    try {
      await db.query(`select crm.act_as($1, $2)`, [email, tenant.slug])
      const {
        rows: [row],
      } = await db.query(`select crm.owners_outside_scope('contacts', $1, $2::uuid[])::text[] as owners`, [action, owners])
      return row.owners
    } finally {
      await db.query('rollback')
    }
  }
  const everyone = [ids.admin, ids.bob, ids.carol, ids.dave, null, ids.dave]
  const sorted = (owners: string[]) => [...owners].sort()
  t.same(
    await outside('bob@a.test', 'update', everyone),
    sorted([ids.admin, ids.dave]),
    'team: everyone outside the team, each once, nulls left out',
  )
  t.same(await outside('bob@a.test', 'import', everyone), sorted([ids.admin, ids.carol, ids.dave]), 'own: everyone but bob')
  t.same(await outside('bob@a.test', 'delete', everyone), sorted([ids.admin, ids.bob, ids.carol, ids.dave]), 'no grant: everyone')
  t.same(await outside('admin@a.test', 'update', everyone), [], 'all: nobody')
  t.same(await outside('bob@a.test', 'update', []), [], 'no owners: nobody')
})

t.test('an upsert refuses, row by row, the owners its update and import scopes do not cover', async (t) => {
  const { tenant, db, ids } = await scopedTenant(t)
  await db.query(
    `insert into crm.contacts (workspace_id, owner_id, email, first_name)
     values ($1, $2, 'admins@example.com', 'A'), ($1, $3, 'carols@example.com', 'C'), ($1, $4, 'bobs@example.com', 'B')`,
    [tenant.id, ids.admin, ids.carol, ids.bob],
  )
  const file =
    [
      'Email,First name,owner_id',
      'admins@example.com,A2,', // matched, owned outside bob's team
      `carols@example.com,C2,${ids.carol}`, // matched, within the team: updated
      `bobs@example.com,B2,${ids.admin}`, // matched, given to an owner outside the team
      `new-carol@example.com,N,${ids.carol}`, // new, for an owner outside bob's own import scope
      'new-bob@example.com,M,', // new, bob's own: created
    ].join('\n') + '\n'
  const columns = ['Email', 'First name', 'owner_id']
  const {
    rows: [created],
  } = await db.query(
    `insert into crm.imports (workspace_id, user_id, record_type, file_name, file_bytes, file_size, delimiter, columns, row_count, sample_rows, suggested_mapping, status, mapping, mode, match_on, dry_run)
     values ($1, $2, 'contacts', 'f.csv', $3, $4, ',', $5, 5, '[]', '{}', 'queued', $6, 'upsert', 'email', false) returning id`,
    [
      tenant.id,
      ids.bob,
      Buffer.from(file),
      Buffer.byteLength(file),
      columns,
      JSON.stringify({ Email: 'email', 'First name': 'first_name', owner_id: 'owner_id' }),
    ],
  )
  t.equal(await processImport(db, { workspace_id: tenant.id, import_id: created.id }), true)

  const { rows: errors } = await db.query(
    `select row, field, message from crm.import_errors where workspace_id = $1 and import_id = $2 order by row, position`,
    [tenant.id, created.id],
  )
  t.same(errors, [
    { row: 1, field: null, message: 'your role may not update this contact' },
    { row: 1, field: 'owner_id', message: 'your role may not give this record to that owner' },
    { row: 3, field: 'owner_id', message: 'your role may not give this record to that owner' },
    { row: 4, field: 'owner_id', message: 'your role may not import records for this owner' },
  ])
  const {
    rows: [counts],
  } = await db.query(`select status, created, updated, skipped, failed from crm.imports where workspace_id = $1 and id = $2`, [
    tenant.id,
    created.id,
  ])
  t.same(counts, { status: 'completed', created: 1, updated: 1, skipped: 0, failed: 3 })
  const { rows: contacts } = await db.query(`select email, first_name, owner_id from crm.contacts where workspace_id = $1 order by email`, [
    tenant.id,
  ])
  t.same(contacts, [
    { email: 'admins@example.com', first_name: 'A', owner_id: ids.admin },
    { email: 'bobs@example.com', first_name: 'B', owner_id: ids.bob },
    { email: 'carols@example.com', first_name: 'C2', owner_id: ids.carol },
    { email: 'new-bob@example.com', first_name: 'M', owner_id: ids.bob },
  ])
})
