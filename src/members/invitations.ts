// Invitations (API.md section 3): an admin invites an email with a role and teams; the invitee
// accepts with the single-use secret from accept_url, either as a new user (password and name) or
// as an existing user proving their email with a bearer token. Only the secret's SHA-256 is stored.
import { randomBytes } from 'node:crypto'
import Type, { type Static } from 'typebox'
import { hashPassword, passwordProblem } from '../auth/passwords.ts'
import { issueToken, type TokenBody } from '../auth/sign-in.ts'
import { hashToken, TOKEN_PATTERN } from '../auth/tokens.ts'
import type { Config } from '../config.ts'
import { type CommonQueryMethods, type DatabasePool, sql } from '../db/pool.ts'
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
const InvitationToAccept = rowType(
  Type.Object({
    workspace_id: Type.String(),
    id: Type.String(),
    email: Type.String(),
    role_id: Type.String(),
    accepted: Type.Boolean(),
    expired: Type.Boolean(),
    slug: Type.String(),
  }),
)
const TokenUser = rowType(Type.Object({ failure: NullableString, user_id: NullableString }))
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

/**
 * Accepts an invitation. With `bearerToken` the holder of that token (whose email must be the
 * invited one) joins; without it a new user is created from `password` and `name`. Runs as the
 * owner role in one transaction: the invitee is nobody in the workspace yet, so no policy could
 * let them in. The seat trigger answers 422 seat_limit_reached when the workspace is full.
 */
export async function acceptInvitation(
  pool: DatabasePool,
  config: Config,
  input: AcceptInput,
  bearerToken: string | null,
): Promise<TokenBody> {
  let passwordHash: string | null = null
  if (bearerToken === null) {
    const missing: FieldProblem[] = (['password', 'name'] as const)
      .filter((name) => input[name] === undefined)
      .map((name) => ({
        pointer: `/${name}`,
        code: 'required',
        message: 'is required (or accept as a signed-in user with Authorization: Bearer)',
      }))
    if (missing.length) throw new ValidationError(`${missing[0].pointer.slice(1)} is required`, missing)
    // Hashing is slow on purpose: done before the transaction so no connection waits on it.
    passwordHash = await hashPassword(input.password as string)
  } else if (!TOKEN_PATTERN.test(bearerToken)) {
    throw new AuthenticationError('token_invalid', 'The token is not valid')
  }

  return pool.transaction(async (db) => {
    const invitation = await db.maybeOne(sql.type(InvitationToAccept)`
      select i.workspace_id, i.id, i.email, i.role_id, i.accepted_at is not null as accepted, i.expires_at <= now() as expired, w.slug
      from crm.invitations i join crm.workspaces w on w.id = i.workspace_id
      where i.token_hash = ${sql.binary(hashToken(input.token))}
      for update of i
    `)
    if (!invitation) throw invalidInvitation('is not a valid invitation')
    if (invitation.accepted) throw invalidInvitation('was already used')
    if (invitation.expired) throw invalidInvitation('has expired; ask for a new invitation')

    let userId: string
    if (bearerToken !== null) {
      const proof = await db.one(sql.type(TokenUser)`select failure, user_id from crm.token_user(${sql.binary(hashToken(bearerToken))})`)
      if (proof.failure || proof.user_id === null)
        throw new AuthenticationError(proof.failure ?? 'token_invalid', 'The bearer token cannot be used')
      const email = await db.oneFirst(sql.unsafe`select email from crm.users where id = ${proof.user_id}`)
      if (email !== invitation.email) throw new ForbiddenError('This invitation was sent to another email address')
      userId = proof.user_id
    } else {
      const problem = passwordProblem(input.password as string, invitation.email)
      if (problem) throw new ValidationError(`password ${problem}`, [{ pointer: '/password', code: 'invalid', message: problem }])
      const existing = await db.maybeOneFirst(sql.unsafe`select id from crm.users where email = ${invitation.email}`)
      if (existing !== null) {
        throw new DuplicateError(
          `${invitation.email} already has an account: accept with its bearer token (Authorization: Bearer) instead of a password`,
        )
      }
      userId = await db.oneFirst(sql.type(IdRow)`
        insert into crm.users (email, name, password_hash) values (${invitation.email}, ${(input.name as string).trim()}, ${passwordHash}) returning id
      `)
    }

    const already = await db.maybeOneFirst(
      sql.unsafe`select 1 from crm.memberships where workspace_id = ${invitation.workspace_id} and user_id = ${userId}`,
    )
    if (already !== null) throw new DuplicateError('You are already a member of this workspace')
    await db.query(
      sql.unsafe`insert into crm.memberships (workspace_id, user_id, role_id) values (${invitation.workspace_id}, ${userId}, ${invitation.role_id})`,
    )
    await db.query(sql.unsafe`
      insert into crm.team_members (workspace_id, team_id, user_id)
      select workspace_id, team_id, ${userId} from crm.invitation_teams where workspace_id = ${invitation.workspace_id} and invitation_id = ${invitation.id}
    `)
    await db.query(
      sql.unsafe`update crm.invitations set accepted_at = now(), accepted_by = ${userId} where workspace_id = ${invitation.workspace_id} and id = ${invitation.id}`,
    )
    // The workspace just joined becomes the default for requests without X-Tenant-Slug.
    await db.query(sql.unsafe`update crm.users set last_workspace_id = ${invitation.workspace_id} where id = ${userId}`)
    return issueToken(db, config, userId, 'token', `invitation to ${invitation.slug}`)
  })
}
