// Every route of the service, by area. A new area adds its file here.
import type { RouteDefinition } from '../route.ts'
import health from './health.ts'
import auth from './auth.ts'
import records from './records.ts'
import associations from './associations.ts'
import search from './search.ts'
import dealStages from './deal-stages.ts'
import openapi from './openapi.ts'
import imports from './imports.ts'
import exports from './exports.ts'
import webhookSubscriptions from './webhook-subscriptions.ts'
import workspaceAdministration from './members.ts'

export function allRoutes(): RouteDefinition[] {
  return [...health, ...auth, ...records, ...associations, ...search, ...dealStages, ...webhookSubscriptions, ...imports, ...exports, ...workspaceAdministration, ...openapi]
}
