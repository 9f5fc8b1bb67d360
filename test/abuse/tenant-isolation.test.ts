// Tenant isolation sweep: every id of one workspace, tried on every /api route that takes an id,
// by an admin of another workspace, answers 404 — and nothing of the first workspace changes.
import t from 'tap'
import { allRoutes } from '../../src/http/routes/index.ts'
import { createTenant, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t, { worker: true, env: { WEBHOOK_ALLOW_HTTP: 'true', WEBHOOK_ALLOWED_CIDRS: '127.0.0.0/8' } })
const url = server.databaseUrl
const a = await createTenant(url, { slug: 'tenant-a', plan: 'pro', members: { 'admin@a.test': 'admin', 'bob@a.test': 'member' } })
const b = await createTenant(url, { slug: 'tenant-b', plan: 'pro', members: { 'admin@b.test': 'admin' } })
const tokenA = a.members['admin@a.test'].token
const tokenB = b.members['admin@b.test'].token

async function createIn(path: string, body: unknown): Promise<string> {
  const response = await server.request('POST', path, { token: tokenA, body })
  if (response.status !== 201) throw new Error(`setup ${path}: ${response.status} ${response.text}`)
  return response.body.data.id
}

const ids: Record<string, string> = {}
ids.subscription = await createIn('/api/webhook-subscriptions', { name: 'A hook', url: 'http://127.0.0.1:9/hook', events: ['*'] })
ids.company = await createIn('/api/companies', { name: 'A company', domain: 'a-company.test' })
ids.contact = await createIn('/api/contacts', { first_name: 'A', email: 'a.contact@a.test' })
ids.deal = await createIn('/api/deals', { name: 'A deal', amount: '10.00' })
ids.role = await createIn('/api/roles', { name: 'a_role', grants: ['deals:view:own'] })
ids.team = await createIn('/api/teams', { name: 'A team' })
ids.invitation = await createIn('/api/invitations', { email: 'new@a.test', role: 'member', teams: [] })
const upload = await server.request('POST', '/api/contacts/import/upload', {
  token: tokenA,
  raw: 'First Name,Email\nAda,ada@a.test\n',
  headers: { 'content-type': 'text/csv' },
})
ids.import = upload.body.data.id
ids.token = (await server.request('GET', '/api/tokens', { token: tokenA })).body.data[0].id
ids.member = a.members['bob@a.test'].id
// The worker fans the deal's events out to the subscription: wait for a delivery.
for (let i = 0; i < 100 && !ids.delivery; i++) {
  ids.delivery = await withOwner(
    url,
    async (client) =>
      (await client.query('select id from crm.webhook_deliveries where subscription_id = $1 limit 1', [ids.subscription])).rows[0]?.id,
  )
  if (!ids.delivery) await new Promise((resolve) => setTimeout(resolve, 100))
}
t.ok(ids.delivery, 'a delivery exists in workspace A')

function idFor(path: string, param: string): string {
  if (param === 'delivery_id') return ids.delivery
  if (param === 'user_id') return ids.member
  const area = /^\/api\/(?:associations\/)?([a-z-]+)/.exec(path)![1]
  if (path.includes('/import/')) return ids.import
  const byArea: Record<string, string> = {
    contacts: ids.contact,
    companies: ids.company,
    deals: ids.deal,
    'webhook-subscriptions': ids.subscription,
    roles: ids.role,
    teams: ids.team,
    invitations: ids.invitation,
    tokens: ids.token,
  }
  return byArea[area]
}

const BODIES: Record<string, unknown> = { '/api/roles/:id': { name: 'renamed' }, '/api/teams/:id': { name: 'renamed' } }
const swept: string[] = []
for (const route of allRoutes().filter((definition) => definition.path.includes(':'))) {
  const path = route.path.replace(/:([a-z_]+)/g, (_, param: string) => idFor(route.path, param))
  t.test(`${route.method} ${route.path}`, async (t) => {
    const body = route.body ? (BODIES[route.path] ?? route.example?.request ?? {}) : undefined
    const response = await server.request(route.method, path, { token: tokenB, body })
    t.equal(response.status, 404, `${response.status} ${response.text.slice(0, 160)}`)
    swept.push(`${route.method} ${route.path}`)
  })
}

t.test('workspace A is untouched', async (t) => {
  for (const [path, id] of [
    ['deals', ids.deal],
    ['contacts', ids.contact],
    ['companies', ids.company],
    ['webhook-subscriptions', ids.subscription],
    ['roles', ids.role],
    ['teams', ids.team],
  ]) {
    t.equal((await server.request('GET', `/api/${path}/${id}`, { token: tokenA })).status, 200, `${path} still there`)
  }
  t.equal((await server.request('GET', '/api/me', { token: tokenA })).status, 200, "A's token still works")
  const subscription = await server.request('GET', `/api/webhook-subscriptions/${ids.subscription}`, { token: tokenA })
  t.equal(subscription.body.data.status, 'active')
  t.ok(swept.length >= 50, `${swept.length} routes swept with foreign ids`)
})
