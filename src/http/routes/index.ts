// Every route of the service, by area. A new area adds its file here.
import type { RouteDefinition } from '../route.ts'
import associations from './associations.ts'
import auth from './auth.ts'
import dealStages from './deal-stages.ts'
import exports from './exports.ts'
import health from './health.ts'
import imports from './imports.ts'
import workspaceAdministration from './members.ts'
import oauth from './oauth.ts'
import oauthApps from './oauth-apps.ts'
import openapi from './openapi.ts'
import records from './records.ts'
import search from './search.ts'
import webhookSubscriptions from './webhook-subscriptions.ts'

export function allRoutes(): RouteDefinition[] {
  return [
    ...health,
    ...auth,
    ...records,
    ...associations,
    ...search,
    ...dealStages,
    ...webhookSubscriptions,
    ...imports,
    ...exports,
    ...workspaceAdministration,
    ...oauthApps,
    ...oauth,
    ...openapi,
  ]
}
