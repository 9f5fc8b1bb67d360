// webhooks:manage can change a subscription's URL and redeliver or recover its deliveries, whose
// bodies carry every changed contact, company and deal: the words a user consents to, and the
// OpenAPI document's scope description, say that it reads those records.
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { authorize, pkcePair, registerApp, sessionCookie } from './helpers.ts'

const server = await startTestServer(t)
const tenant = await createTenant(server.databaseUrl, { slug: 'words', members: { 'ada@words.test': 'admin' } })
const ada = tenant.members['ada@words.test']
const readsRecords = /every contact, company and deal change: read all of those records/

t.test('the consent page says webhooks:manage reads the records its events carry', async (t) => {
  const app = await registerApp(server, ada.token)
  const page = await authorize(
    server,
    {
      client_id: app.client_id,
      redirect_uri: app.redirect_uris[0],
      scope: 'webhooks:manage',
      state: 's',
      code_challenge: pkcePair().challenge,
    },
    await sessionCookie(server, ada.id),
  )
  t.equal(page.status, 200)
  t.match(await page.text(), readsRecords)
})

t.test('so does the OpenAPI document', async (t) => {
  const document = (await server.request('GET', '/api/openapi.json')).body
  const schemes = Object.values(document.components.securitySchemes) as { flows?: Record<string, { scopes?: Record<string, string> }> }[]
  const words = schemes.flatMap((scheme) => Object.values(scheme.flows ?? {}).map((flow) => flow.scopes?.['webhooks:manage']))
  t.ok(words.length > 0 && words.every((text) => text !== undefined && readsRecords.test(text)), 'every flow describes it so')
})
