// Members of a workspace (docs/api.md section 3): list with seat usage, change role and teams, suspend,
// unsuspend, remove. The rules live in SQL: admin-only write policies, the seat trigger (unsuspend
// needs a free seat) and the last-admin trigger (422) of 000002. Non-admins read only themselves.
import Type, { type Static } from 'typebox'
import { databaseErrorOf } from '../db/database-errors.ts'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { NullableString, rowType } from '../db/typed-rows.ts'
import { ConflictError, InvalidParameterError, NotFoundError } from '../errors.ts'
import { type Actor, isUuid, requireAdmin } from './admin-only.ts'
import { resolveRole, resolveTeams } from './references.ts'

const MemberRow = Type.Object({
  user_id: Type.String(),
  email: Type.String(),
  name: Type.String(),
  role: Type.String(),
  teams: Type.Array(Type.String()),
  suspended_at: NullableString,
  joined_at: Type.String(),
})
const SeatsRow = Type.Object({ used: Type.Integer(), limit: Type.Union([Type.Integer(), Type.Null()]) })
export type Member = Static<typeof MemberRow>
export type Seats = Static<typeof SeatsRow>
const MEMBER = rowType(MemberRow)
const SEATS = rowType(SeatsRow)

const memberColumns = sql.fragment`
  m.user_id, u.email, u.name, r.name as role,
  coalesce((select json_agg(t.name order by t.name) from crm.team_members tm
            join crm.teams t on t.workspace_id = tm.workspace_id and t.id = tm.team_id
            where tm.workspace_id = m.workspace_id and tm.user_id = m.user_id), '[]'::json) as teams,
  m.suspended_at, m.joined_at`

const memberSource = sql.fragment`
  crm.memberships m
  join crm.users u on u.id = m.user_id
  join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id`

const visibleToActor = (actor: Actor) => sql.fragment`
  m.workspace_id = ${actor.workspaceId} and ((select crm.is_admin()) or m.user_id = (select crm.current_user_id()))`

export async function listMembers(db: CommonQueryMethods, actor: Actor): Promise<{ data: readonly Member[]; seats: Seats }> {
  const data = await db.any(
    sql.type(MEMBER)`select ${memberColumns} from ${memberSource} where ${visibleToActor(actor)} order by m.joined_at, m.user_id`,
  )
  return { data, seats: await seatUsage(db, actor) }
}

/** Active (not suspended) members against the workspace's limit; integration users count like anyone. */
export async function seatUsage(db: CommonQueryMethods, actor: Actor): Promise<Seats> {
  return db.one(sql.type(SEATS)`
    select (select count(*) from crm.memberships where workspace_id = w.id and suspended_at is null) as used, w.seat_limit as limit
    from crm.workspaces w where w.id = ${actor.workspaceId}
  `)
}

export async function getMember(db: CommonQueryMethods, actor: Actor, userId: string): Promise<Member> {
  const member = isUuid(userId)
    ? await db.maybeOne(
        sql.type(MEMBER)`select ${memberColumns} from ${memberSource} where ${visibleToActor(actor)} and m.user_id = ${userId}`,
      )
    : null
  if (!member) throw new NotFoundError('No such member')
  return member
}

export type MemberChange = { role?: string; teams?: string[] }

/** Role and teams in one go; `teams` replaces the member's set. The new role applies on the member's next request. */
export async function updateMember(db: CommonQueryMethods, actor: Actor, userId: string, change: MemberChange): Promise<Member> {
  requireAdmin(actor)
  await getMember(db, actor, userId)
  if (change.role !== undefined) {
    const role = await resolveRole(db, actor.workspaceId, change.role)
    await db.query(
      sql.unsafe`update crm.memberships set role_id = ${role.id} where workspace_id = ${actor.workspaceId} and user_id = ${userId}`,
    )
  }
  if (change.teams !== undefined) await setTeams(db, actor.workspaceId, userId, await resolveTeams(db, actor.workspaceId, change.teams))
  return getMember(db, actor, userId)
}

export async function setTeams(db: CommonQueryMethods, workspaceId: string, userId: string, teamIds: string[]): Promise<void> {
  await db.query(sql.unsafe`
    delete from crm.team_members
    where workspace_id = ${workspaceId} and user_id = ${userId} and team_id <> all (${sql.array(teamIds, 'uuid')})
  `)
  // Only the teams the member is not in yet are inserted: a scoped credential may keep or shrink the
  // set, and the database refuses any insert it makes (crm.tg_team_members__only_narrow_when_scoped).
  await db.query(sql.unsafe`
    insert into crm.team_members (workspace_id, team_id, user_id)
    select ${workspaceId}, t.team_id, ${userId} from unnest(${sql.array(teamIds, 'uuid')}) as t (team_id)
    where not exists (select from crm.team_members tm
                      where tm.workspace_id = ${workspaceId} and tm.team_id = t.team_id and tm.user_id = ${userId})
    on conflict do nothing
  `)
}

/** Suspension stops the member's tokens and sessions in this workspace at once (crm.authenticate reads it). */
export async function setSuspended(db: CommonQueryMethods, actor: Actor, userId: string, suspended: boolean): Promise<Member> {
  requireAdmin(actor)
  await getMember(db, actor, userId)
  await db.query(sql.unsafe`
    update crm.memberships set suspended_at = ${suspended ? sql.fragment`coalesce(suspended_at, now())` : sql.fragment`null`}
    where workspace_id = ${actor.workspaceId} and user_id = ${userId}
  `)
  return getMember(db, actor, userId)
}

/**
 * Removes a member. Records they own would be orphaned, so either `reassignTo` (another member)
 * takes them over first, in the same transaction, or the removal is refused with 409
 * member_owns_records (suspension is the way to stop someone without touching their records).
 */
export async function removeMember(db: CommonQueryMethods, actor: Actor, userId: string, reassignTo?: string): Promise<void> {
  requireAdmin(actor)
  await getMember(db, actor, userId)
  if (reassignTo !== undefined) {
    if (reassignTo === userId || !isUuid(reassignTo))
      throw new InvalidParameterError('reassign_to must name another member of this workspace')
    const heir = await db.maybeOneFirst(
      sql.unsafe`select 1 from crm.memberships where workspace_id = ${actor.workspaceId} and user_id = ${reassignTo}`,
    )
    if (heir === null) throw new InvalidParameterError('reassign_to must name another member of this workspace')
    for (const table of [sql.identifier(['crm', 'contacts']), sql.identifier(['crm', 'companies']), sql.identifier(['crm', 'deals'])]) {
      await db.query(
        sql.unsafe`update ${table} set owner_id = ${reassignTo} where workspace_id = ${actor.workspaceId} and owner_id = ${userId}`,
      )
    }
  }
  try {
    await db.query(sql.unsafe`delete from crm.memberships where workspace_id = ${actor.workspaceId} and user_id = ${userId}`)
  } catch (error) {
    const fields = databaseErrorOf(error)
    if (fields?.code === '23503' && /_owner_fkey$/.test(fields.constraint ?? '')) {
      throw new ConflictError(
        'member_owns_records',
        'This member still owns records: pass ?reassign_to=<user_id> to hand them over, or suspend the member instead',
      )
    }
    throw error
  }
}
