// Roles and their grants (docs/api.md sections 3 and 4). Admins manage custom roles; built-in roles are
// read-only (422); a role in use is kept (409 role_in_use). Non-admins read only their own role.
import Type from 'typebox'
import { createRole, deleteRole, GRANT_PATTERN, getRole, listRoles, updateRole } from '../../members/roles.ts'
import { Uuid } from '../../uuid.ts'
import { defineRoutes, patchAndPut } from '../route.ts'

const RoleSchema = Type.Object({
  id: Uuid,
  name: Type.String(),
  is_admin: Type.Boolean(),
  is_builtin: Type.Boolean(),
  grants: Type.Array(Type.String()),
  member_count: Type.Integer(),
  created_at: Type.String({ format: 'date-time' }),
})

const fields = {
  name: Type.String({ maxLength: 63, pattern: '^[a-z][a-z0-9_]{0,62}$', description: 'lower-case letters, digits and _' }),
  is_admin: Type.Boolean({ description: 'admins manage members, roles, teams, invitations and webhooks' }),
  grants: Type.Array(Type.String({ maxLength: 21, pattern: GRANT_PATTERN }), {
    maxItems: 18,
    description: 'resource:action:scope, e.g. deals:view:own',
  }),
}
const CreateBody = Type.Object(
  { name: fields.name, is_admin: Type.Optional(fields.is_admin), grants: Type.Optional(fields.grants) },
  { additionalProperties: false },
)
const UpdateBody = Type.Object(
  { name: Type.Optional(fields.name), is_admin: Type.Optional(fields.is_admin), grants: Type.Optional(fields.grants) },
  { additionalProperties: false },
)

const one = Type.Object({ data: RoleSchema })
const tag = 'workspace administration'

export default defineRoutes(
  {
    method: 'GET',
    path: '/api/roles',
    summary: 'Roles of this workspace with their grants (non-admins: only their own)',
    tag,
    auth: 'required',
    scope: 'workspace:admin',
    response: Type.Object({ data: Type.Array(RoleSchema), next_cursor: Type.Null() }),
    errors: [401],
    handler: async ({ db, caller }) => ({ body: { data: await listRoles(db, caller), next_cursor: null } }),
  },
  {
    method: 'POST',
    path: '/api/roles',
    summary: 'Create a custom role (admins)',
    tag,
    auth: 'required',
    scope: 'workspace:admin',
    body: CreateBody,
    status: 201,
    response: one,
    errors: [401, 403, 409, 422],
    example: { request: { name: 'integration', grants: ['deals:view:own', 'deals:update:own'] } },
    handler: async ({ db, caller, body }) => {
      const role = await createRole(db, caller, body)
      return { status: 201, body: { data: role }, headers: { Location: `/api/roles/${role.id}` } }
    },
  },
  {
    method: 'GET',
    path: '/api/roles/:id',
    summary: 'One role with its grants',
    tag,
    auth: 'required',
    scope: 'workspace:admin',
    response: one,
    errors: [401, 404],
    handler: async ({ db, caller, params }) => ({ body: { data: await getRole(db, caller, params.id) } }),
  },
  patchAndPut({
    path: '/api/roles/:id',
    summary: 'Change a custom role: name, is_admin, grants (replaced as a whole); applies on every holder’s next request',
    tag,
    auth: 'required',
    scope: 'workspace:admin',
    body: UpdateBody,
    response: one,
    errors: [401, 403, 404, 409, 422],
    handler: async ({ db, caller, params, body }) => ({ body: { data: await updateRole(db, caller, params.id, body) } }),
  }),
  {
    method: 'DELETE',
    path: '/api/roles/:id',
    summary: 'Delete a custom role that no member or pending invitation holds',
    tag,
    auth: 'required',
    scope: 'workspace:admin',
    status: 204,
    errors: [401, 403, 404, 409, 422],
    handler: async ({ db, caller, params }) => {
      await deleteRole(db, caller, params.id)
      return { status: 204 }
    },
  },
)
