// Members of the caller's workspace (docs/api.md section 3). Admins only, except that anyone reads
// their own membership: for a non-admin the list holds just them.
import Type from 'typebox'
import { InvalidParameterError } from '../../errors.ts'
import { getMember, listMembers, removeMember, setSuspended, updateMember } from '../../members/members.ts'
import { Uuid } from '../../uuid.ts'
import { defineRoutes, patchAndPut } from '../route.ts'
import invitations from './invitations.ts'
import roles from './roles.ts'
import signup from './signup.ts'
import teams from './teams.ts'

const Time = Type.String({ format: 'date-time' })

const MemberSchema = Type.Object({
  user_id: Uuid,
  email: Type.String(),
  name: Type.String(),
  role: Type.String({ description: 'role name' }),
  teams: Type.Array(Type.String(), { description: 'team names' }),
  suspended_at: Type.Union([Time, Type.Null()]),
  joined_at: Time,
})

const MemberChangeBody = Type.Object(
  {
    role: Type.Optional(Type.String({ minLength: 1, maxLength: 100, description: 'role name (or id)' })),
    teams: Type.Optional(
      Type.Array(Type.String({ minLength: 1, maxLength: 100 }), { maxItems: 100, description: 'team names (or ids); replaces the set' }),
    ),
  },
  { additionalProperties: false },
)

const one = Type.Object({ data: MemberSchema })

const members = defineRoutes(
  {
    method: 'GET',
    path: '/api/members',
    summary: 'Members of this workspace with seat usage (non-admins see only themselves)',
    tag: 'workspace administration',
    auth: 'required',
    scope: 'workspace:admin',
    response: Type.Object({
      data: Type.Array(MemberSchema),
      seats: Type.Object({ used: Type.Integer(), limit: Type.Union([Type.Integer(), Type.Null()]) }),
      next_cursor: Type.Null(),
    }),
    errors: [401],
    handler: async ({ db, caller }) => ({ body: { ...(await listMembers(db, caller)), next_cursor: null } }),
  },
  {
    method: 'GET',
    path: '/api/members/:user_id',
    summary: 'One member (non-admins: only themselves)',
    tag: 'workspace administration',
    auth: 'required',
    scope: 'workspace:admin',
    response: one,
    errors: [401, 404],
    handler: async ({ db, caller, params }) => ({ body: { data: await getMember(db, caller, params.user_id) } }),
  },
  patchAndPut({
    path: '/api/members/:user_id',
    summary: "Change a member's role and teams (admins; takes effect on the member's next request)",
    tag: 'workspace administration',
    auth: 'required',
    scope: 'workspace:admin',
    body: MemberChangeBody,
    response: one,
    errors: [401, 403, 404, 422],
    example: { request: { role: 'read_only', teams: ['east'] } },
    handler: async ({ db, caller, params, body }) => ({ body: { data: await updateMember(db, caller, params.user_id, body) } }),
  }),
  {
    method: 'POST',
    path: '/api/members/:user_id/suspend',
    summary: 'Suspend a member: their tokens and sessions stop in this workspace at once (admins)',
    tag: 'workspace administration',
    auth: 'required',
    scope: 'workspace:admin',
    response: one,
    errors: [401, 403, 404, 422],
    handler: async ({ db, caller, params }) => ({ body: { data: await setSuspended(db, caller, params.user_id, true) } }),
  },
  {
    method: 'POST',
    path: '/api/members/:user_id/unsuspend',
    summary: 'Lift a suspension; needs a free seat (admins)',
    tag: 'workspace administration',
    auth: 'required',
    scope: 'workspace:admin',
    response: one,
    errors: [401, 403, 404, 422],
    handler: async ({ db, caller, params }) => ({ body: { data: await setSuspended(db, caller, params.user_id, false) } }),
  },
  {
    method: 'DELETE',
    path: '/api/members/:user_id',
    summary: 'Remove a member from this workspace (admins); their records go to reassign_to, else 409 while they own any',
    tag: 'workspace administration',
    auth: 'required',
    scope: 'workspace:admin',
    status: 204,
    queryParameters: {
      reassign_to: {
        description: 'user_id of the member who takes over the removed member’s contacts, companies and deals',
        schema: { type: 'string', format: 'uuid' },
      },
    },
    errors: [400, 401, 403, 404, 409, 422],
    handler: async ({ db, caller, params, query }) => {
      const reassignTo = query.reassign_to
      if (Array.isArray(reassignTo)) throw new InvalidParameterError('reassign_to may be given once')
      await removeMember(db, caller, params.user_id, reassignTo)
      return { status: 204 }
    },
  },
)

/** Workspace administration, registered together (src/http/routes/index.ts imports only this file). */
export default [...signup, ...invitations, ...members, ...roles, ...teams]
