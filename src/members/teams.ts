// Teams (docs/api.md section 3): admins create, rename and delete them; members join them through
// PATCH /api/members/{user_id}. Non-admins read only the teams they belong to.
import Type, { type Static } from 'typebox'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { IdRow, rowType } from '../db/typed-rows.ts'
import { NotFoundError } from '../errors.ts'
import { type Actor, isUuid, requireAdmin } from './admin-only.ts'

const TeamRow = Type.Object({ id: Type.String(), name: Type.String(), members: Type.Array(Type.String()), created_at: Type.String() })
export type Team = Static<typeof TeamRow>
const TEAM = rowType(TeamRow)

const teamColumns = sql.fragment`
  t.id, t.name,
  coalesce((select json_agg(tm.user_id order by tm.user_id) from crm.team_members tm
            where tm.workspace_id = t.workspace_id and tm.team_id = t.id), '[]'::json) as members,
  t.created_at`

const visibleToActor = (actor: Actor) => sql.fragment`
  t.workspace_id = ${actor.workspaceId}
  and ((select crm.is_admin())
       or exists (select 1 from crm.team_members mine
                  where mine.workspace_id = t.workspace_id and mine.team_id = t.id and mine.user_id = (select crm.current_user_id())))`

export async function listTeams(db: CommonQueryMethods, actor: Actor): Promise<readonly Team[]> {
  return db.any(sql.type(TEAM)`select ${teamColumns} from crm.teams t where ${visibleToActor(actor)} order by lower(t.name), t.name, t.id`)
}

export async function getTeam(db: CommonQueryMethods, actor: Actor, id: string): Promise<Team> {
  const team = isUuid(id)
    ? await db.maybeOne(sql.type(TEAM)`select ${teamColumns} from crm.teams t where ${visibleToActor(actor)} and t.id = ${id}`)
    : null
  if (!team) throw new NotFoundError('No such team')
  return team
}

export async function createTeam(db: CommonQueryMethods, actor: Actor, input: { name: string }): Promise<Team> {
  requireAdmin(actor)
  const id = await db.oneFirst(
    sql.type(IdRow)`insert into crm.teams (workspace_id, name) values (${actor.workspaceId}, ${input.name.trim()}) returning id`,
  )
  return getTeam(db, actor, id)
}

export async function updateTeam(db: CommonQueryMethods, actor: Actor, id: string, input: { name?: string }): Promise<Team> {
  requireAdmin(actor)
  await getTeam(db, actor, id)
  if (input.name !== undefined)
    await db.query(sql.unsafe`update crm.teams set name = ${input.name.trim()} where workspace_id = ${actor.workspaceId} and id = ${id}`)
  return getTeam(db, actor, id)
}

/** Members leave the team with it (cascade); their records keep their owners. */
export async function deleteTeam(db: CommonQueryMethods, actor: Actor, id: string): Promise<void> {
  requireAdmin(actor)
  await getTeam(db, actor, id)
  await db.query(sql.unsafe`delete from crm.teams where workspace_id = ${actor.workspaceId} and id = ${id}`)
}
