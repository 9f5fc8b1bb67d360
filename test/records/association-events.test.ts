// crm.write_associations_changed_event, called as crm_api through crm.act_as: it needs update on
// the record (a read-only member who may view it writes no event), and the event's
// associations_changed is what the function checked against the links as they are now, never
// what the caller made up. A property test throws changes of every shape at it and compares with
// a model of the rule.
import fc from 'fast-check'
import type pg from 'pg'
import t from 'tap'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'

const url = await createTestDatabase(t)
const owner = await ownerClient(t, url)
const tenant = await createTenant(url, { slug: 'links', members: { 'admin@links.test': 'admin', 'reader@links.test': 'read_only' } })
const other = await createTenant(url, { slug: 'elsewhere', members: { 'eve@elsewhere.test': 'admin' } })
const adminId = tenant.members['admin@links.test'].id

async function insert(table: string, workspaceId: string, ownerId: string, name: string): Promise<string> {
  const column = table === 'contacts' ? 'first_name' : 'name'
  const { rows } = await owner.query(`insert into crm.${table} (workspace_id, owner_id, ${column}) values ($1, $2, $3) returning id`, [
    workspaceId,
    ownerId,
    name,
  ])
  return rows[0].id
}

const contact = await insert('contacts', tenant.id, adminId, 'Ada')
const companies = [await insert('companies', tenant.id, adminId, 'K1'), await insert('companies', tenant.id, adminId, 'K2')]
const deals = [await insert('deals', tenant.id, adminId, 'D1'), await insert('deals', tenant.id, adminId, 'D2')]
const foreignCompany = await insert('companies', other.id, other.members['eve@elsewhere.test'].id, 'Foreign')
// Linked now: the first company and the first deal.
for (const [column, id] of [
  ['company_id', companies[0]],
  ['deal_id', deals[0]],
]) {
  await owner.query(`insert into crm.associations (workspace_id, contact_id, ${column}) values ($1, $2, $3)`, [tenant.id, contact, id])
}
const linked = new Set([companies[0], deals[0]])

/** Calls the function as the member in a transaction rolled back after; answers the SQLSTATE or the event's data. */
async function write(email: string, changes: unknown, recordId = contact): Promise<{ code: string } | { data: any }> {
  await owner.query('begin')
  try {
    await owner.query('select crm.act_as($1, $2)', [email, 'links'])
    const { rows } = await owner.query('select crm.write_associations_changed_event($1, $2, $3::jsonb) as id', [
      'contact',
      recordId,
      JSON.stringify(changes),
    ])
    if (rows[0].id === null) return { data: null }
    await owner.query('reset role')
    const event = await owner.query('select data from crm.events where id = $1', [rows[0].id])
    return { data: event.rows[0].data }
  } catch (error) {
    return { code: (error as pg.DatabaseError).code ?? 'unknown' }
  } finally {
    await owner.query('rollback')
  }
}

t.test('a read-only member who may view the record writes no event', async (t) => {
  const answer = await write('reader@links.test', { companies: { added: [], removed: [companies[1]] } })
  t.same(answer, { code: 'CR403' }, 'refused: view is not update')
  const invisible = await write('reader@links.test', { companies: { added: [companies[0]], removed: [] } }, foreignCompany)
  t.same(invisible, { code: 'CR404' }, 'a record of another workspace is not found')
})

t.test('a true change is written as checked', async (t) => {
  const answer = await write('admin@links.test', { companies: { added: [companies[0].toUpperCase()], removed: [companies[1]] } })
  t.same((answer as { data: any }).data.associations_changed, { companies: { added: [companies[0]], removed: [companies[1]] } })
  t.equal((answer as { data: any }).data.object.id, contact)
})

t.test('made-up changes are refused', async (t) => {
  const cases: [string, unknown][] = [
    ['a link that is not there claimed added', { companies: { added: [companies[1]], removed: [] } }],
    ['a link that is there claimed removed', { deals: { added: [], removed: [deals[0]] } }],
    ['another workspace’s record', { companies: { added: [], removed: [foreignCompany] } }],
    ['a record of the wrong type', { companies: { added: [], removed: [deals[1]] } }],
    ['the record’s own type', { contacts: { added: [], removed: [contact] } }],
    ['a key that is no type', { notes: { added: [], removed: [] } }],
    ['an extra field', { companies: { added: [companies[0]], removed: [], note: 'hi' } }],
    ['not an id', { companies: { added: ['<script>'], removed: [] } }],
    ['an id twice', { companies: { added: [companies[0], companies[0]], removed: [] } }],
    ['not an object', ['companies']],
  ]
  for (const [what, changes] of cases) t.same(await write('admin@links.test', changes), { code: 'CR422' }, what)
})

/** The rule: what the function must accept, and the event it must write then (null: none). */
function model(changes: unknown): { ok: false } | { ok: true; written: Record<string, { added: string[]; removed: string[] }> | null } {
  if (typeof changes !== 'object' || changes === null || Array.isArray(changes)) return { ok: false }
  const written: Record<string, { added: string[]; removed: string[] }> = {}
  const ofType: Record<string, string[]> = { companies, deals }
  for (const [key, value] of Object.entries(changes)) {
    const known = ofType[key]
    if (!known || typeof value !== 'object' || value === null || Array.isArray(value)) return { ok: false }
    const keys = Object.keys(value).sort()
    if (keys.join() !== 'added,removed') return { ok: false }
    const { added, removed } = value as { added: unknown; removed: unknown }
    if (!Array.isArray(added) || !Array.isArray(removed)) return { ok: false }
    const all = [...added, ...removed]
    if (!all.every((id) => typeof id === 'string' && known.includes(id.toLowerCase()))) return { ok: false }
    if (new Set(all.map((id) => id.toLowerCase())).size !== all.length) return { ok: false }
    if (!added.every((id) => linked.has(id.toLowerCase())) || removed.some((id) => linked.has(id.toLowerCase()))) return { ok: false }
    if (all.length > 0) written[key] = { added: added.map((id) => id.toLowerCase()), removed: removed.map((id) => id.toLowerCase()) }
  }
  return { ok: true, written: Object.keys(written).length > 0 ? written : null }
}

t.test('any change: accepted exactly when it matches the links, and written as the model says', async (t) => {
  const id = fc.oneof(
    fc.constantFrom(...companies, ...deals, contact, foreignCompany),
    fc.uuid(),
    fc.string(),
    fc.integer(),
    fc.constantFrom(companies[0].toUpperCase()),
  )
  const pair = fc.oneof(
    { weight: 4, arbitrary: fc.record({ added: fc.array(id, { maxLength: 3 }), removed: fc.array(id, { maxLength: 3 }) }) },
    { weight: 1, arbitrary: fc.record({ added: fc.array(id), removed: fc.array(id), extra: fc.jsonValue() }, { requiredKeys: [] }) },
    { weight: 1, arbitrary: fc.jsonValue() },
  )
  const changes = fc.oneof(
    { weight: 6, arbitrary: fc.dictionary(fc.constantFrom('companies', 'deals', 'contacts', 'notes'), pair, { maxKeys: 3 }) },
    { weight: 1, arbitrary: fc.jsonValue() },
  )
  let accepted = 0
  await fc.assert(
    fc.asyncProperty(changes, async (given) => {
      const expected = model(given)
      const answer = await write('admin@links.test', given)
      if (!expected.ok) return 'code' in answer && answer.code === 'CR422'
      accepted++
      if (!('data' in answer)) return false
      if (expected.written === null) return answer.data === null
      return JSON.stringify(answer.data.associations_changed) === JSON.stringify(expected.written)
    }),
    { numRuns: 300 },
  )
  t.ok(accepted > 0, `some changes were true ones (${accepted} of 300)`)
})
