// Hostile filters of GET /api/audit-log and POST /api/audit-log/export (docs/api.md section 11):
// any filter value (NUL bytes, a megabyte, times PostgreSQL cannot store, unknown actions), a forged
// cursor or another workspace's answers a 4xx problem or a page of the caller's own workspace,
// never a 500 and never another workspace's entry.
import fc from 'fast-check'
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const [one, two] = await Promise.all([
  createTenant(server.databaseUrl, { slug: 'audit-a', members: { 'ada@a.test': 'admin', 'bob@a.test': 'member', 'cy@a.test': 'member' } }),
  createTenant(server.databaseUrl, { slug: 'audit-b', members: { 'dee@b.test': 'admin', 'eve@b.test': 'member' } }),
])
const ada = one.members['ada@a.test']
const dee = two.members['dee@b.test']
const list = (query: string, member = ada, slug = one.slug) =>
  server.request('GET', `/api/audit-log${query}`, { token: member.token, headers: { 'x-tenant-slug': slug } })
const exportOf = (filter: unknown) =>
  server.request('POST', '/api/audit-log/export', {
    token: ada.token,
    headers: { 'x-tenant-slug': one.slug },
    body: { format: 'ndjson', filter },
  })

/** A refusal the caller can act on, or a page of the caller's workspace alone. */
function clearAnswer(answer: { status: number; body: any; text: string }, workspaceIds = ownIds): boolean {
  if (answer.status >= 400 && answer.status < 500) return typeof answer.body?.code === 'string' && typeof answer.body?.detail === 'string'
  if (answer.status !== 200) return false
  const entries = answer.body
    ? answer.body.data
    : answer.text
        .split('\n')
        .filter(Boolean)
        .map((line) => JSON.parse(line))
  return entries.every((entry: { id: string }) => workspaceIds.has(entry.id))
}
/** A refusal of one filter says which: the list's detail names the parameter, the export's pointer the field. */
function namesFilter(answer: { status: number; body: any }, name: string, exported: boolean): boolean {
  if (answer.status === 200) return true
  if (exported) return answer.status === 422 && answer.body.errors?.[0]?.pointer === `/filter/${name}`
  return answer.status === 400 && answer.body.code === 'invalid_parameter' && answer.body.detail.startsWith(name)
}
const ownIds = new Set<string>((await list('?limit=100')).body.data.map((entry: { id: string }) => entry.id))
t.ok(ownIds.size >= 3, 'the fixtures wrote entries to page through')

const FILTERS = ['action', 'actor_id', 'target_type', 'target_id', 'since', 'until'] as const
// Times the format check lets through but a calendar or PostgreSQL may not: day 30 of February,
// year 0, hour 24, a leap second, offsets at the edge.
const oddTime = fc
  .tuple(
    fc.constantFrom('0000', '0001', '1969', '2026', '9999'),
    fc.constantFrom('00', '01', '02', '12', '13'),
    fc.constantFrom('00', '01', '29', '30', '31', '32'),
    fc.constantFrom('00', '23', '24', '25'),
    fc.constantFrom('00', '59', '60'),
    fc.constantFrom('00', '59', '60', '61'),
    fc.constantFrom('', '.5', '.999999'),
    fc.constantFrom('Z', '+00:00', '-23:59', '+24:00', '+99:99', '+14:00'),
  )
  .map(
    ([year, month, day, hour, minute, second, fraction, zone]) => `${year}-${month}-${day}T${hour}:${minute}:${second}${fraction}${zone}`,
  )
const hostileValue = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 80 }),
  fc.string({ unit: fc.constantFrom('\u0000', 'a', '.', '_', '-', '0', 'Z', 'T', ':', '%', '\uffff'), maxLength: 80 }),
  oddTime,
  fc.constantFrom(
    'member.exploded',
    'nothing.at_all',
    'a.b',
    `${'a'.repeat(40)}.${'b'.repeat(40)}`,
    'workspace',
    '00000000-0000-0000-0000-000000000000',
  ),
)

t.test('any filter value answers a 4xx problem or a page of the workspace', async (t) => {
  await fc.assert(
    fc.asyncProperty(fc.constantFrom(...FILTERS), hostileValue, async (name, value) => {
      const answer = await list(`?${name}=${encodeURIComponent(value)}`)
      const exported = await exportOf({ [name]: value })
      return clearAnswer(answer) && clearAnswer(exported) && namesFilter(answer, name, false) && namesFilter(exported, name, true)
    }),
    { numRuns: 150 },
  )
  t.pass('every value answered clearly')
})

t.test('times of no calendar are refused naming the filter, not moved to another day', async (t) => {
  // JavaScript's parser moves February 30th to March 2nd and hour 24 to the next day; PostgreSQL
  // refuses the first with no pointer to the filter and moves the second.
  const times = ['2026-02-30T00:00:00Z', '2026-04-31T23:00:00Z', '0000-01-01T00:00:00Z', '2026-01-01T24:00:00Z', '2026-01-01T23:59:60Z']
  for (const name of ['since', 'until']) {
    for (const time of times) {
      const answer = await list(`?${name}=${encodeURIComponent(time)}`)
      t.ok(
        clearAnswer(answer) && answer.status === 400 && namesFilter(answer, name, false),
        `${name}=${time}: ${answer.status} ${answer.text.slice(0, 200)}`,
      )
      const exported = await exportOf({ [name]: time })
      t.ok(
        exported.status === 422 && namesFilter(exported, name, true),
        `export ${name}=${time}: ${exported.status} ${exported.text.slice(0, 200)}`,
      )
    }
  }
  t.equal((await list(`?since=${encodeURIComponent('9999-12-31T23:59:59-14:00')}`)).status, 200, 'the last instant of year 9999 is a time')
})

t.test('NUL bytes, a megabyte and unknown parameters', async (t) => {
  for (const query of ['?action=member.%00added', '?since=2026-01-01T00:00:00Z%00', '?cursor=%00', '?actor=me', '?action=a&action=b']) {
    const answer = await list(query)
    t.equal(answer.status, 400, query)
    t.ok(clearAnswer(answer), answer.text)
  }
  const huge = await list(`?action=${'a'.repeat(1024 * 1024)}`).catch((error) => ({ status: 0, body: null, text: String(error) }))
  t.ok(huge.status === 0 || (huge.status >= 400 && huge.status < 500 && clearAnswer(huge)), `a 1 MiB query string: ${huge.status}`)
  t.equal((await list('?limit=1')).status, 200, 'the server answers on')
})

t.test('forged cursors and cursors from another workspace', async (t) => {
  const forge = (payload: unknown) => Buffer.from(JSON.stringify(payload)).toString('base64url')
  const forged = fc.oneof(
    fc.string({ unit: 'binary', maxLength: 60 }).map((text) => Buffer.from(text).toString('base64url')),
    fc.anything().map((k) => forge({ s: '-seq', k })),
    fc.oneof(fc.integer(), fc.string(), fc.bigInt(), fc.double()).map((value) => forge({ s: '-seq', k: [String(value)] })),
    fc.string({ maxLength: 20 }).map((s) => forge({ s, k: ['1'] })),
  )
  await fc.assert(
    fc.asyncProperty(forged, async (cursor) => clearAnswer(await list(`?limit=1&cursor=${encodeURIComponent(cursor)}`))),
    { numRuns: 100 },
  )
  // Another workspace's cursor is only a place in a chain: it pages the caller's own workspace.
  const theirs = (await list('?limit=1', dee, two.slug)).body.next_cursor
  t.ok(theirs)
  const answer = await list(`?limit=100&cursor=${theirs}`)
  t.equal(answer.status, 200)
  t.ok(clearAnswer(answer), 'only the caller’s entries')
  const theirIds = new Set<string>((await list('?limit=100', dee, two.slug)).body.data.map((entry: { id: string }) => entry.id))
  t.notOk(
    answer.body.data.some((entry: { id: string }) => theirIds.has(entry.id)),
    'none of the other workspace’s',
  )
})
