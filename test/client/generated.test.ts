// The committed client types (clients/typescript/schema.ts) are what `make client` generates from
// the document the service serves: a route, field or description changed without regenerating
// fails here.
import { readFileSync } from 'node:fs'
import t from 'tap'
import { generateSchema, SCHEMA_FILE, servedDocument } from '../../clients/typescript/generate.ts'
import { startTestServer } from '../helpers/server.ts'

t.test('clients/typescript/schema.ts is generated from the served /api/openapi.json', async (t) => {
  const server = await startTestServer(t)
  const served = await server.request('GET', '/api/openapi.json')
  t.equal(served.status, 200)
  const expected = await generateSchema(served.body)
  const committed = readFileSync(SCHEMA_FILE, 'utf8')
  t.ok(committed === expected, 'schema.ts matches the served document; run `make client` and commit the result')
  t.match(committed, /"\/api\/contacts": \{/, 'it names the routes')
  t.same(await servedDocument(undefined), served.body, '`make client` builds the document the service serves')
  t.same(await servedDocument(server.url), served.body, '`make client URL=...` reads it from a running service')
})
