// Invitations (docs/api.md section 3): admins invite, list and withdraw; the invitee accepts.
import Type from 'typebox'
import { bearerCredential } from '../../auth/authenticate.ts'
import { invitationMail } from '../../mail/invitation-mail.ts'
import { createMailer } from '../../mail/mailer.ts'
import { acceptInvitation, createInvitation, deleteInvitation, listInvitations } from '../../members/invitations.ts'
import { Uuid } from '../../uuid.ts'
import { defineRoutes } from '../route.ts'
import { TokenBodySchema } from './auth.ts'
import { EmailSchema, PersonNameSchema } from './signup.ts'

const Time = Type.String({ format: 'date-time' })

const InvitationSchema = Type.Object({
  id: Uuid,
  email: Type.String(),
  role: Type.String(),
  teams: Type.Array(Type.String()),
  status: Type.Union([Type.Literal('pending'), Type.Literal('expired')]),
  invited_by: Type.Union([Uuid, Type.Null()]),
  created_at: Time,
  expires_at: Time,
})

const InvitationBody = Type.Object(
  {
    email: EmailSchema,
    role: Type.String({ minLength: 1, maxLength: 100, description: 'role name (or id)' }),
    teams: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 100 }), { maxItems: 100, description: 'team names (or ids)' })),
  },
  { additionalProperties: false },
)

const AcceptBody = Type.Object(
  {
    token: Type.String({ minLength: 1, maxLength: 200, description: 'the secret from accept_url' }),
    password: Type.Optional(Type.String({ minLength: 10, maxLength: 1024, description: 'new users only' })),
    name: Type.Optional(PersonNameSchema),
  },
  { additionalProperties: false },
)

export default defineRoutes(
  {
    method: 'POST',
    path: '/api/invitations',
    summary: 'Invite an email to this workspace with a role and teams (admins); mailed when SMTP_URL is set',
    tag: 'workspace administration',
    auth: 'required',
    // A scoped token only narrows access (docs/decisions.md): the database refuses it too.
    credentials: 'unscoped',
    scope: 'workspace:admin',
    body: InvitationBody,
    status: 201,
    response: Type.Object({ data: Type.Intersect([InvitationSchema, Type.Object({ accept_url: Type.String() })]) }),
    errors: [401, 403, 409, 422],
    example: { request: { email: 'grace@example.com', role: 'member', teams: ['east'] } },
    handler: async ({ db, caller, body, res, services }) => {
      const { workspace_name: _w, inviter_name: _i, ...invitation } = await createInvitation(db, caller, body, services.baseUrl)
      const mailer = createMailer(services.config)
      if (mailer) {
        const mail = invitationMail({ ...invitation, workspace_name: _w, inviter_name: _i })
        // 'finish' with 201 means the transaction committed and the admin has the answer.
        res.once('finish', () => {
          if (res.statusCode !== 201) return
          mailer
            .send(mail)
            .catch((error: Error) => services.logger.warn('invitation mail failed', { invitation_id: invitation.id, error: error.message }))
        })
      }
      return { status: 201, body: { data: invitation } }
    },
  },
  {
    method: 'GET',
    path: '/api/invitations',
    summary: 'Invitations not accepted yet, newest first (admins)',
    tag: 'workspace administration',
    auth: 'required',
    scope: 'workspace:admin',
    response: Type.Object({ data: Type.Array(InvitationSchema), next_cursor: Type.Null() }),
    errors: [401, 403],
    handler: async ({ db, caller }) => ({ body: { data: await listInvitations(db, caller), next_cursor: null } }),
  },
  {
    method: 'DELETE',
    path: '/api/invitations/:id',
    summary: 'Withdraw an invitation (its link stops working)',
    tag: 'workspace administration',
    auth: 'required',
    scope: 'workspace:admin',
    status: 204,
    errors: [401, 403, 404],
    handler: async ({ db, caller, params }) => {
      await deleteInvitation(db, caller, params.id)
      return { status: 204 }
    },
  },
  {
    method: 'POST',
    path: '/api/invitations/accept',
    summary:
      "Accept an invitation: as a new user with password and name, or as an existing user with their unscoped personal token (a scoped token or an app's token: 403); the token answered expires no later than the bearer",
    tag: 'workspace administration',
    auth: 'none',
    credentials: 'unscoped',
    limitedPerAddress: true,
    body: AcceptBody,
    response: TokenBodySchema,
    errors: [401, 403, 409, 422],
    example: { request: { token: 'inv_…', password: 'correct horse battery', name: 'Grace Hopper' } },
    handler: async ({ services, body, req }) => ({
      body: await acceptInvitation(services.pool, services.config, body, bearerCredential(req)?.token ?? null),
    }),
  },
)
