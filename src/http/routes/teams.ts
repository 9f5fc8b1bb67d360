// Teams (docs/api.md section 3): admins create, rename and delete; membership is set per member with
// PATCH /api/members/{user_id}. Non-admins read only the teams they belong to.
import Type from 'typebox'
import { createTeam, deleteTeam, getTeam, listTeams, updateTeam } from '../../members/teams.ts'
import { Uuid } from '../../uuid.ts'
import { defineRoutes, patchAndPut } from '../route.ts'

const TeamSchema = Type.Object({
  id: Uuid,
  name: Type.String(),
  members: Type.Array(Uuid, { description: 'user_ids' }),
  created_at: Type.String({ format: 'date-time' }),
})
const Name = Type.String({ minLength: 1, maxLength: 100, pattern: '\\S' })
const CreateBody = Type.Object({ name: Name }, { additionalProperties: false })
const UpdateBody = Type.Object({ name: Type.Optional(Name) }, { additionalProperties: false })
const one = Type.Object({ data: TeamSchema })
const tag = 'workspace administration'

export default defineRoutes(
  {
    method: 'GET',
    path: '/api/teams',
    summary: 'Teams of this workspace (non-admins: the teams they belong to)',
    tag,
    auth: 'required',
    scope: 'workspace:admin',
    response: Type.Object({ data: Type.Array(TeamSchema), next_cursor: Type.Null() }),
    errors: [401],
    handler: async ({ db, caller }) => ({ body: { data: await listTeams(db, caller), next_cursor: null } }),
  },
  {
    method: 'POST',
    path: '/api/teams',
    summary: 'Create a team (admins)',
    tag,
    auth: 'required',
    scope: 'workspace:admin',
    body: CreateBody,
    status: 201,
    response: one,
    errors: [401, 403, 409, 422],
    example: { request: { name: 'East' } },
    handler: async ({ db, caller, body }) => {
      const team = await createTeam(db, caller, body)
      return { status: 201, body: { data: team }, headers: { Location: `/api/teams/${team.id}` } }
    },
  },
  {
    method: 'GET',
    path: '/api/teams/:id',
    summary: 'One team with its members',
    tag,
    auth: 'required',
    scope: 'workspace:admin',
    response: one,
    errors: [401, 404],
    handler: async ({ db, caller, params }) => ({ body: { data: await getTeam(db, caller, params.id) } }),
  },
  patchAndPut({
    path: '/api/teams/:id',
    summary: 'Rename a team (admins)',
    tag,
    auth: 'required',
    scope: 'workspace:admin',
    body: UpdateBody,
    response: one,
    errors: [401, 403, 404, 409, 422],
    handler: async ({ db, caller, params, body }) => ({ body: { data: await updateTeam(db, caller, params.id, body) } }),
  }),
  {
    method: 'DELETE',
    path: '/api/teams/:id',
    summary: 'Delete a team (its members leave it; records keep their owners)',
    tag,
    auth: 'required',
    scope: 'workspace:admin',
    status: 204,
    errors: [401, 403, 404],
    handler: async ({ db, caller, params }) => {
      await deleteTeam(db, caller, params.id)
      return { status: 204 }
    },
  },
)
