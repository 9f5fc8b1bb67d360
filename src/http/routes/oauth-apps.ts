// OAuth apps (docs/api.md section 4a), workspace admins only: register (a confidential app's client
// secret is answered this once), list, change, delete; the members connected to an app, and
// revoking the app for the whole workspace.
import Type from 'typebox'
import { createApp, deleteApp, getApp, listApps, listConnections, revokeAppForWorkspace, updateApp } from '../../oauth/apps.ts'
import { KNOWN_SCOPES } from '../../oauth/scopes.ts'
import { Uuid } from '../../uuid.ts'
import { defineRoutes, patchAndPut } from '../route.ts'

const Time = Type.String({ format: 'date-time' })
const AppSchema = Type.Object({
  id: Uuid,
  name: Type.String(),
  client_id: Type.String({ description: 'public; crmapp_ followed by 22 characters' }),
  confidential: Type.Boolean({ description: 'true: authenticates with its client secret; false: a public (native or browser) app' }),
  client_secret_last4: Type.Union([Type.String(), Type.Null()]),
  redirect_uris: Type.Array(Type.String()),
  created_at: Time,
  created_by: Type.Union([Uuid, Type.Null()]),
})
const CreatedAppSchema = Type.Object({
  ...AppSchema.properties,
  client_secret: Type.Optional(Type.String({ description: 'crmsec_...: confidential apps only, shown this once' })),
})
const Name = Type.String({ minLength: 1, maxLength: 100, pattern: '\\S' })
const RedirectUris = Type.Array(Type.String({ minLength: 1, maxLength: 2000 }), {
  minItems: 1,
  maxItems: 10,
  description: 'exact match; https, or http://127.0.0.1 / http://[::1] with any port for native apps',
})
const CreateBody = Type.Object(
  { name: Name, redirect_uris: RedirectUris, confidential: Type.Optional(Type.Boolean({ default: true })) },
  { additionalProperties: false },
)
const UpdateBody = Type.Object({ name: Type.Optional(Name), redirect_uris: Type.Optional(RedirectUris) }, { additionalProperties: false })
const ConnectionSchema = Type.Object({
  id: Uuid,
  user: Type.Object({ id: Uuid, email: Type.String(), name: Type.String() }),
  scopes: Type.Array(Type.Union(KNOWN_SCOPES.map((scope) => Type.Literal(scope)))),
  created_at: Time,
  last_issued_at: Time,
  expires_at: Time,
})
const tag = 'oauth apps'

export default defineRoutes(
  {
    method: 'GET',
    path: '/api/oauth-apps',
    summary: "The workspace's OAuth apps (admins)",
    tag,
    auth: 'required',
    credentials: 'scope',
    scope: 'workspace:admin',
    response: Type.Object({ data: Type.Array(AppSchema), next_cursor: Type.Null() }),
    errors: [401, 403],
    handler: async ({ db, caller }) => ({ body: { data: await listApps(db, caller), next_cursor: null } }),
  },
  {
    method: 'POST',
    path: '/api/oauth-apps',
    summary: 'Register an OAuth app (admins); a confidential app gets its client secret in this answer only',
    tag,
    auth: 'required',
    // A scoped token only narrows access (docs/decisions.md): the database refuses it too.
    credentials: 'unscoped',
    scope: 'workspace:admin',
    body: CreateBody,
    status: 201,
    response: Type.Object({ data: CreatedAppSchema }),
    errors: [401, 403, 422],
    example: { request: { name: 'Mail merge', redirect_uris: ['https://mailmerge.example/oauth/callback'], confidential: true } },
    handler: async ({ db, caller, body }) => {
      const app = await createApp(db, caller, body)
      return { status: 201, body: { data: app }, headers: { Location: `/api/oauth-apps/${app.id}` } }
    },
  },
  {
    method: 'GET',
    path: '/api/oauth-apps/:id',
    summary: 'One OAuth app (admins)',
    tag,
    auth: 'required',
    credentials: 'scope',
    scope: 'workspace:admin',
    response: Type.Object({ data: AppSchema }),
    errors: [401, 403, 404],
    handler: async ({ db, caller, params }) => ({ body: { data: await getApp(db, caller, params.id) } }),
  },
  patchAndPut({
    path: '/api/oauth-apps/:id',
    summary: "Change an OAuth app's name or redirect URIs (admins)",
    tag,
    auth: 'required',
    credentials: 'scope',
    scope: 'workspace:admin',
    body: UpdateBody,
    response: Type.Object({ data: AppSchema }),
    errors: [401, 403, 404, 422],
    handler: async ({ db, caller, params, body }) => ({ body: { data: await updateApp(db, caller, params.id, body) } }),
  }),
  {
    method: 'DELETE',
    path: '/api/oauth-apps/:id',
    summary: 'Delete an OAuth app and every token issued to it (admins)',
    tag,
    auth: 'required',
    credentials: 'scope',
    scope: 'workspace:admin',
    status: 204,
    errors: [401, 403, 404],
    handler: async ({ db, caller, params }) => {
      await deleteApp(db, caller, params.id)
      return { status: 204 }
    },
  },
  {
    method: 'GET',
    path: '/api/oauth-apps/:id/connections',
    summary: 'The members connected to an app: one entry per live authorization (admins)',
    tag,
    auth: 'required',
    credentials: 'scope',
    scope: 'workspace:admin',
    response: Type.Object({ data: Type.Array(ConnectionSchema), next_cursor: Type.Null() }),
    errors: [401, 403, 404],
    handler: async ({ db, caller, params }) => ({ body: { data: await listConnections(db, caller, params.id), next_cursor: null } }),
  },
  {
    method: 'DELETE',
    path: '/api/oauth-apps/:id/connections',
    summary: "Revoke the app for the whole workspace: every member's authorization and token stops at once (admins)",
    tag,
    auth: 'required',
    credentials: 'scope',
    scope: 'workspace:admin',
    status: 204,
    errors: [401, 403, 404],
    handler: async ({ db, caller, params }) => {
      await revokeAppForWorkspace(db, caller, params.id)
      return { status: 204 }
    },
  },
)
