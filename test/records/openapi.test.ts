// /api/openapi.json describes every /api route and is a valid OpenAPI 3.1 document.
import SwaggerParser from '@apidevtools/swagger-parser'
import t from 'tap'
import Type from 'typebox'
import { buildOpenApiDocument, hoistNamedSchemas } from '../../src/http/openapi.ts'
import { allRoutes } from '../../src/http/routes/index.ts'
import { named } from '../../src/schema-names.ts'
import { EVENT_NAMES } from '../../src/webhooks/subscription-schemas.ts'
import { startTestServer } from '../helpers/server.ts'

t.test('the document validates and covers every /api route', async (t) => {
  const server = await startTestServer(t)
  const response = await server.request('GET', '/api/openapi.json')
  t.equal(response.status, 200)
  t.match(response.headers.get('content-type'), /application\/json/)
  const document = response.body
  t.equal(document.openapi, '3.1.0')

  const validated = await SwaggerParser.validate(structuredClone(document))
  t.ok(validated, 'swagger-parser accepts it')

  const routes = allRoutes().filter((route) => route.path.startsWith('/api/'))
  t.ok(routes.length >= 25, `${routes.length} routes`)
  for (const route of routes) {
    const path = route.path.replace(/:([A-Za-z_]+)/g, '{$1}')
    const operation = document.paths[path]?.[route.method.toLowerCase()]
    t.ok(operation, `${route.method} ${route.path} is documented`)
    if (!operation) continue
    t.ok(operation.summary, `${route.method} ${route.path} has a summary`)
    if (route.body) t.ok(operation.requestBody?.content?.['application/json']?.schema, `${route.method} ${route.path} documents its body`)
  }
  const ids = Object.values(document.paths).flatMap((item: any) => Object.values(item).map((operation: any) => operation.operationId))
  t.equal(new Set(ids).size, ids.length, 'operation ids are unique')

  const createDeal = document.paths['/api/deals'].post
  t.ok(createDeal.requestBody.content['application/json'].example, 'examples are included')
  t.ok(createDeal.parameters.some((parameter: any) => parameter.name === 'Idempotency-Key'))
  t.ok(createDeal.responses['201'].headers.Location)
  t.equal(createDeal.responses['422'].$ref, '#/components/responses/Problem422')
  t.equal(createDeal.responses['408'].$ref, '#/components/responses/Problem408', 'a body can time out')
  const uploadContacts = document.paths['/api/contacts/import/upload'].post
  t.same(
    [uploadContacts.responses['408'], uploadContacts.responses['429']].map((response: any) => response.$ref),
    ['#/components/responses/Problem408', '#/components/responses/Problem429'],
  )
  t.ok(document.components.responses.Problem408.description)
  t.notOk(document.paths['/api/deals'].get.responses['408'], 'a route without a body cannot')
  t.same(createDeal.requestBody.content['application/json'].schema, { $ref: '#/components/schemas/DealCreate' }, 'a named body')
  t.equal(document.components.schemas.DealCreate.additionalProperties, false, 'the same schema that refuses unknown fields')
  const listDeals = document.paths['/api/deals'].get
  t.ok(listDeals.parameters.find((parameter: any) => parameter.name === 'filter' && parameter.style === 'deepObject'))
  t.ok(document.paths['/api/deals/{id}'].put.parameters.some((parameter: any) => parameter.name === 'If-Match'))
  t.same(document.paths['/api/openapi.json'].get.security, [], 'the document itself needs no token')

  const again = await server.request('GET', '/api/openapi.json')
  t.same(again.body, document, 'stable across requests')
})

t.test('record shapes, the webhook event, import and export are named components', async (t) => {
  const document = buildOpenApiDocument(allRoutes()) as any
  const schemas = document.components.schemas
  for (const type of ['Contact', 'Company', 'Deal']) {
    for (const name of [type, `${type}Create`, `${type}Update`]) t.equal(schemas[name]?.type, 'object', `${name} is a component`)
  }
  for (const name of ['WebhookEvent', 'Problem', 'ImportUpload', 'ImportStart', 'ImportJob', 'ExportRequest']) t.ok(schemas[name], name)
  const path = (type: string) => document.paths[`/api/${type}s/{id}`]
  t.same(path('contact').get.responses['200'].content['application/json'].schema.properties.data, { $ref: '#/components/schemas/Contact' })
  t.same(path('deal').patch.requestBody.content['application/json'].schema, { $ref: '#/components/schemas/DealUpdate' })
  t.same(document.paths['/api/contacts/import/upload'].post.responses['201'].content['application/json'].schema.properties.data, {
    $ref: '#/components/schemas/ImportUpload',
  })
  t.ok(document.paths['/api/contacts/import/upload'].post.requestBody.content['text/csv'], 'the upload body is described')
  t.ok(document.paths['/api/deals/export'].post.responses['200'].content['text/csv'], 'the export answer is described')
  t.notMatch(JSON.stringify(document), /x-component-name/, 'no naming marker is left in the document')

  t.same(Object.keys(document.webhooks).sort(), [...EVENT_NAMES].sort(), 'one webhook per event')
  for (const event of EVENT_NAMES) {
    const operation = document.webhooks[event].post
    t.same(operation.requestBody.content['application/json'].schema, { $ref: '#/components/schemas/WebhookEvent' })
    t.ok(operation.parameters.some((parameter: any) => parameter.name === 'webhook-signature'))
  }
  t.same(schemas.WebhookEvent.properties.event.enum, EVENT_NAMES)
})

t.test('a schema named by a new route becomes a component, and one name cannot hold two shapes', async (t) => {
  const Thing = named('Thing', Type.Object({ id: Type.String() }))
  const components: Record<string, Record<string, unknown>> = {}
  const hoisted = hoistNamedSchemas(JSON.parse(JSON.stringify({ a: Type.Object({ data: Thing }), b: Type.Array(Thing) })), components)
  t.same(hoisted, {
    a: { type: 'object', properties: { data: { $ref: '#/components/schemas/Thing' } }, required: ['data'] },
    b: { type: 'array', items: { $ref: '#/components/schemas/Thing' } },
  })
  t.same(components.Thing, { type: 'object', properties: { id: { type: 'string' } }, required: ['id'] })
  const Other = named('Thing', Type.Object({ name: Type.String() }))
  t.throws(() => hoistNamedSchemas(JSON.parse(JSON.stringify({ a: Thing, b: Other })), {}), /two different schemas are named Thing/)
})
