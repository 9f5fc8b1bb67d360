// Every route of the service, by area. A new area adds its file here. GET /api/openapi.json is
// defined here too: its document is built from this list (when first asked, so every area is in it).
import Type from 'typebox'
import { buildOpenApiDocument } from '../openapi.ts'
import { defineRoutes, type RouteDefinition } from '../route.ts'
import associations from './associations.ts'
import auditLog from './audit-log.ts'
import auth from './auth.ts'
import dealStages from './deal-stages.ts'
import events from './events.ts'
import exports from './exports.ts'
import health from './health.ts'
import history from './history.ts'
import imports from './imports.ts'
import workspaceAdministration from './members.ts'
import oauth from './oauth.ts'
import oauthApps from './oauth-apps.ts'
import records from './records.ts'
import recordsBatch from './records-batch.ts'
import search from './search.ts'
import webhookSubscriptions from './webhook-subscriptions.ts'

export function allRoutes(): RouteDefinition[] {
  return [
    ...health,
    ...auth,
    // Before the records: GET /api/{type}/import would otherwise be read as GET /api/{type}/{id}.
    ...imports,
    ...records,
    ...recordsBatch,
    ...associations,
    ...history,
    ...search,
    ...dealStages,
    ...webhookSubscriptions,
    ...events,
    ...exports,
    ...workspaceAdministration,
    ...oauthApps,
    ...auditLog,
    ...oauth,
    ...openapi,
  ]
}

let document: Record<string, unknown> | null = null

const openapi = defineRoutes({
  method: 'GET',
  path: '/api/openapi.json',
  summary: 'This API as an OpenAPI 3.1 document',
  tag: 'operations',
  auth: 'none',
  response: Type.Object(
    {
      openapi: Type.String(),
      info: Type.Object({}, { additionalProperties: true }),
      paths: Type.Object({}, { additionalProperties: true }),
    },
    { additionalProperties: true },
  ),
  handler: async () => {
    document ??= buildOpenApiDocument(allRoutes())
    return { body: document }
  },
})
