// Invitations (docs/api.md section 3): an admin invites an email with a role and teams; the invitee
// accepts with the single-use secret from accept_url, either as a new user (password and name) or
// as an existing user proving their email with a bearer token. Only the secret's SHA-256 is stored.
import { randomBytes } from 'node:crypto'
import Type, { type Static } from 'typebox'
import { hashPassword, passwordProblem } from '../auth/passwords.ts'
import { IssuedRow, newIssuedToken, type TokenBody, tokenBody } from '../auth/sign-in.ts'
import { hashToken, TOKEN_PATTERN } from '../auth/tokens.ts'
import type { Config } from '../config.ts'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { IdRow, NullableString, rowType } from '../db/typed-rows.ts'
import { AuthenticationError, DuplicateError, type FieldProblem, ForbiddenError, NotFoundError, ValidationError } from '../errors.ts'
import { type Actor, isUuid, requireAdmin } from './admin-only.ts'
import { resolveRole, resolveTeams } from './references.ts'

export const INVITATION_TTL_DAYS = 7

const InvitationRow = Type.Object({
  id: Type.String(),
  email: Type.String(),
  role: Type.String(),
  teams: Type.Array(Type.String()),
  status: Type.Union([Type.Literal('pending'), Type.Literal('expired')]),
  invited_by: NullableString,
  created_at: Type.String(),
  expires_at: Type.String(),
})
export type Invitation = Static<typeof InvitationRow>
const INVITATION = rowType(InvitationRow)
const NamesRow = rowType(Type.Object({ workspace_name: Type.String(), inviter_name: Type.String() }))
/** The answer to a new invitation: the only time the secret (inside accept_url) is shown. */
export type NewInvitation = Invitation & { accept_url: string; workspace_name: string; inviter_name: string }

const invitationColumns = sql.fragment`
  i.id, i.email, r.name as role,
  coalesce((select json_agg(t.name order by t.name) from crm.invitation_teams it
            join crm.teams t on t.workspace_id = it.workspace_id and t.id = it.team_id
            where it.workspace_id = i.workspace_id and it.invitation_id = i.id), '[]'::json) as teams,
  case when i.expires_at > now() then 'pending' else 'expired' end as status,
  i.invited_by, i.created_at, i.expires_at`

const invitationSource = sql.fragment`crm.invitations i join crm.roles r on r.workspace_id = i.workspace_id and r.id = i.role_id`

/** Invitations not accepted yet, newest first; expired ones stay listed (status expired) until withdrawn or pruned. */
export async function listInvitations(db: CommonQueryMethods, actor: Actor): Promise<readonly Invitation[]> {
  requireAdmin(actor)
  return db.any(sql.type(INVITATION)`
    select ${invitationColumns} from ${invitationSource}
    where i.workspace_id = ${actor.workspaceId} and i.accepted_at is null
    order by i.created_at desc, i.id desc
  `)
}

export async function getInvitation(db: CommonQueryMethods, actor: Actor, id: string): Promise<Invitation> {
  requireAdmin(actor)
  const invitation = isUuid(id)
    ? await db.maybeOne(
        sql.type(
          INVITATION,
        )`select ${invitationColumns} from ${invitationSource} where i.workspace_id = ${actor.workspaceId} and i.accepted_at is null and i.id = ${id}`,
      )
    : null
  if (!invitation) throw new NotFoundError('No such invitation')
  return invitation
}

export function acceptUrl(baseUrl: string, secret: string): string {
  return `${baseUrl.replace(/\/+$/, '')}/invitations/accept?token=${encodeURIComponent(secret)}`
}

export type InvitationInput = { email: string; role: string; teams?: string[] }

/** Inviting an address again replaces its pending invitation (the old link stops working). */
export async function createInvitation(
  db: CommonQueryMethods,
  actor: Actor,
  input: InvitationInput,
  baseUrl: string,
): Promise<NewInvitation> {
  requireAdmin(actor)
  const email = input.email.trim().toLowerCase()
  const member = await db.maybeOneFirst(sql.unsafe`
    select 1 from crm.memberships m join crm.users u on u.id = m.user_id where m.workspace_id = ${actor.workspaceId} and u.email = ${email}
  `)
  if (member !== null)
    throw new DuplicateError(`${email} is already a member of this workspace`, [
      { pointer: '/email', code: 'duplicate', message: 'is already a member of this workspace' },
    ])
  const role = await resolveRole(db, actor.workspaceId, input.role)
  const teamIds = await resolveTeams(db, actor.workspaceId, input.teams ?? [])
  await db.query(
    sql.unsafe`delete from crm.invitations where workspace_id = ${actor.workspaceId} and email = ${email} and accepted_at is null`,
  )

  const secret = `inv_${randomBytes(32).toString('base64url')}`
  const id = await db.oneFirst(sql.type(IdRow)`
    insert into crm.invitations (workspace_id, email, role_id, token_hash, invited_by, expires_at)
    values (${actor.workspaceId}, ${email}, ${role.id}, ${sql.binary(hashToken(secret))}, ${actor.userId}, now() + make_interval(days => ${INVITATION_TTL_DAYS}))
    returning id
  `)
  await db.query(sql.unsafe`
    insert into crm.invitation_teams (workspace_id, invitation_id, team_id)
    select ${actor.workspaceId}, ${id}, team_id from unnest(${sql.array(teamIds, 'uuid')}) as team_id
  `)
  const names = await db.one(sql.type(NamesRow)`
    select w.name as workspace_name, u.name as inviter_name from crm.workspaces w, crm.users u where w.id = ${actor.workspaceId} and u.id = ${actor.userId}
  `)
  return { ...(await getInvitation(db, actor, id)), accept_url: acceptUrl(baseUrl, secret), ...names }
}

export async function deleteInvitation(db: CommonQueryMethods, actor: Actor, id: string): Promise<void> {
  await getInvitation(db, actor, id)
  await db.query(sql.unsafe`delete from crm.invitations where workspace_id = ${actor.workspaceId} and id = ${id}`)
}

export type AcceptInput = { token: string; password?: string; name?: string }

const invalidInvitation = (message: string) => new ValidationError(`token ${message}`, [{ pointer: '/token', code: 'invalid', message }])

const InvitationPreviewFields = Type.Object({
  email: Type.String(),
  workspace_name: Type.String(),
  slug: Type.String(),
  role: Type.String(),
  accepted: Type.Boolean(),
  expired: Type.Boolean(),
  has_account: Type.Boolean(),
})
const InvitationPreviewRow = rowType(InvitationPreviewFields)
export type InvitationPreview = Static<typeof InvitationPreviewFields>

/** The invitation a secret names (who is invited where, and its state), or null: only to whoever holds the secret. */
export async function previewInvitation(db: CommonQueryMethods, secret: string): Promise<InvitationPreview | null> {
  return db.maybeOne(sql.type(InvitationPreviewRow)`
    select email, workspace_name, slug, role, accepted, expired, has_account from crm.invitation_preview(${sql.binary(hashToken(secret))})
  `)
}

/**
 * Accepts an invitation. With `bearerToken` the holder of that token (whose email must be the
 * invited one, and the token unscoped and personal: a part of a user's authority never yields a
 * whole one) joins; the token issued expires no later than the bearer, and the user's last used
 * workspace stays. Without it a new user is created from `password` and `name`. There is no
 * caller yet: it runs as the runtime role, through crm.accept_invitation alone, in one statement.
 * The seat trigger answers 422 seat_limit_reached when the workspace is full.
 */
export async function acceptInvitation(
  db: CommonQueryMethods,
  config: Config,
  input: AcceptInput,
  bearerToken: string | null,
): Promise<TokenBody> {
  let passwordHash: string | null = null
  let invitedEmail = ''
  if (bearerToken === null) {
    const missing: FieldProblem[] = (['password', 'name'] as const)
      .filter((name) => input[name] === undefined)
      .map((name) => ({
        pointer: `/${name}`,
        code: 'required',
        message: 'is required (or accept as a signed-in user with Authorization: Bearer)',
      }))
    if (missing.length) throw new ValidationError(`${missing[0].pointer.slice(1)} is required`, missing)
    // The password's rules name the invited email: read it first (the acceptance checks it all again).
    const invitation = await previewInvitation(db, input.token)
    if (!invitation) throw invalidInvitation('is not a valid invitation')
    if (invitation.accepted) throw invalidInvitation('was already used')
    if (invitation.expired) throw invalidInvitation('has expired; ask for a new invitation')
    invitedEmail = invitation.email
    const problem = passwordProblem(input.password as string, invitation.email)
    if (problem) throw new ValidationError(`password ${problem}`, [{ pointer: '/password', code: 'invalid', message: problem }])
    // Hashing is slow on purpose: done before the statement, so no connection waits on it.
    passwordHash = await hashPassword(input.password as string)
  } else if (!TOKEN_PATTERN.test(bearerToken)) {
    throw new AuthenticationError('token_invalid', 'The token is not valid')
  }

  const issued = newIssuedToken()
  const result = await db.one(sql.type(IssuedRow)`
    select failure, id, expires_at
      from crm.accept_invitation(${sql.binary(hashToken(input.token))}, ${bearerToken === null ? null : sql.binary(hashToken(bearerToken))},
                                 ${bearerToken === null ? (input.name as string).trim() : null}, ${passwordHash},
                                 ${sql.binary(issued.hash)}, make_interval(days => ${config.tokenTtlDays}))
  `)
  switch (result.failure) {
    case null:
      return tokenBody(issued.token, result)
    case 'invitation_invalid':
      throw invalidInvitation('is not a valid invitation')
    case 'invitation_used':
      throw invalidInvitation('was already used')
    case 'invitation_expired':
      throw invalidInvitation('has expired; ask for a new invitation')
    case 'token_not_allowed':
      throw new ForbiddenError(
        "Accepting an invitation with a bearer token needs an unscoped personal token: a scoped token or an app's token cannot join a workspace",
      )
    case 'wrong_email':
      throw new ForbiddenError('This invitation was sent to another email address')
    case 'already_member':
      throw new DuplicateError('You are already a member of this workspace')
    case 'account_exists':
      throw new DuplicateError(
        `${invitedEmail} already has an account: accept with its bearer token (Authorization: Bearer) instead of a password`,
      )
    default:
      throw new AuthenticationError(result.failure, 'The bearer token cannot be used')
  }
}
