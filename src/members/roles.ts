// Custom roles and their grants (docs/api.md sections 3 and 4). Built-in roles are read-only (a trigger
// in 000002 refuses changes); a role held by a member or a pending invitation is not deleted (409,
// trigger in 000004). Non-admins read only their own role; other roles read as absent.
import Type, { type Static } from 'typebox'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { IdRow, rowType } from '../db/typed-rows.ts'
import { NotFoundError, ValidationError } from '../errors.ts'
import { type Actor, isUuid, requireAdmin } from './admin-only.ts'

export const GRANT_PATTERN = '^(contacts|companies|deals):(view|create|update|delete|import|export):(own|team|all)$'

const RoleRow = Type.Object({
  id: Type.String(),
  name: Type.String(),
  is_admin: Type.Boolean(),
  is_builtin: Type.Boolean(),
  grants: Type.Array(Type.String()),
  member_count: Type.Integer(),
  created_at: Type.String(),
})
export type Role = Static<typeof RoleRow>
const ROLE = rowType(RoleRow)

const roleColumns = sql.fragment`
  r.id, r.name, r.is_admin, r.is_builtin,
  coalesce((select json_agg(g.resource || ':' || g.action || ':' || g.scope order by g.resource, g.action)
            from crm.role_grants g where g.workspace_id = r.workspace_id and g.role_id = r.id), '[]'::json) as grants,
  (select count(*) from crm.memberships m where m.workspace_id = r.workspace_id and m.role_id = r.id) as member_count,
  r.created_at`

/** Admins see every role; anyone else only the role they hold. */
const visibleToActor = (actor: Actor) => sql.fragment`
  r.workspace_id = ${actor.workspaceId}
  and ((select crm.is_admin())
       or r.id = (select m.role_id from crm.memberships m where m.workspace_id = ${actor.workspaceId} and m.user_id = (select crm.current_user_id())))`

export async function listRoles(db: CommonQueryMethods, actor: Actor): Promise<readonly Role[]> {
  return db.any(
    sql.type(ROLE)`select ${roleColumns} from crm.roles r where ${visibleToActor(actor)} order by r.is_builtin desc, r.created_at, r.name`,
  )
}

export async function getRole(db: CommonQueryMethods, actor: Actor, id: string): Promise<Role> {
  const role = isUuid(id)
    ? await db.maybeOne(sql.type(ROLE)`select ${roleColumns} from crm.roles r where ${visibleToActor(actor)} and r.id = ${id}`)
    : null
  if (!role) throw new NotFoundError('No such role')
  return role
}

/** One scope per resource and action: a second one for the same pair is refused rather than silently chosen. */
function parseGrants(grants: string[]): { resource: string; action: string; scope: string }[] {
  const seen = new Map<string, number>()
  return grants.map((grant, index) => {
    const [resource, action, scope] = grant.split(':')
    const key = `${resource}:${action}`
    if (seen.has(key)) {
      throw new ValidationError(`grants/${index} repeats ${key} (a role holds one scope per resource and action)`, [
        { pointer: `/grants/${index}`, code: 'duplicate', message: `repeats ${key}; a role holds one scope per resource and action` },
      ])
    }
    seen.set(key, index)
    return { resource, action, scope }
  })
}

/**
 * Makes a role's grants the given set by removing, changing and adding only what differs: a scoped
 * credential may narrow a role (remove a grant, lower its scope) through the same request, while
 * the database refuses every grant it would add or widen (crm.tg_role_grants__only_narrow_when_scoped).
 */
async function replaceGrants(db: CommonQueryMethods, workspaceId: string, roleId: string, grants: string[]): Promise<void> {
  const rows = parseGrants(grants)
  const wanted = sql.fragment`unnest(${sql.array(
    rows.map((row) => row.resource),
    'text',
  )}::text[], ${sql.array(
    rows.map((row) => row.action),
    'text',
  )}::text[], ${sql.array(
    rows.map((row) => row.scope),
    'text',
  )}::text[]) as w (resource, action, scope)`
  await db.query(sql.unsafe`
    delete from crm.role_grants g
    where g.workspace_id = ${workspaceId} and g.role_id = ${roleId}
      and not exists (select from ${wanted} where w.resource = g.resource and w.action = g.action)
  `)
  if (rows.length === 0) return
  await db.query(sql.unsafe`
    update crm.role_grants g set scope = w.scope from ${wanted}
    where g.workspace_id = ${workspaceId} and g.role_id = ${roleId} and g.resource = w.resource and g.action = w.action
      and g.scope <> w.scope
  `)
  await db.query(sql.unsafe`
    insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
    select ${workspaceId}, ${roleId}, w.resource, w.action, w.scope from ${wanted}
    where not exists (select from crm.role_grants g
                      where g.workspace_id = ${workspaceId} and g.role_id = ${roleId} and g.resource = w.resource and g.action = w.action)
  `)
}

export type RoleInput = { name: string; is_admin?: boolean; grants?: string[] }

export async function createRole(db: CommonQueryMethods, actor: Actor, input: RoleInput): Promise<Role> {
  requireAdmin(actor)
  const grants = input.grants ?? []
  parseGrants(grants)
  const id = await db.oneFirst(sql.type(IdRow)`
    insert into crm.roles (workspace_id, name, is_admin) values (${actor.workspaceId}, ${input.name}, ${input.is_admin ?? false}) returning id
  `)
  await replaceGrants(db, actor.workspaceId, id, grants)
  return getRole(db, actor, id)
}

export async function updateRole(db: CommonQueryMethods, actor: Actor, id: string, input: Partial<RoleInput>): Promise<Role> {
  requireAdmin(actor)
  const role = await getRole(db, actor, id)
  if (role.is_builtin) throw new ValidationError(`built-in role ${role.name} cannot be changed; create a custom role instead`)
  if (input.grants) parseGrants(input.grants)
  if (input.name !== undefined || input.is_admin !== undefined) {
    await db.query(sql.unsafe`
      update crm.roles set name = ${input.name ?? role.name}, is_admin = ${input.is_admin ?? role.is_admin}
      where workspace_id = ${actor.workspaceId} and id = ${id}
    `)
  }
  if (input.grants) await replaceGrants(db, actor.workspaceId, id, input.grants)
  return getRole(db, actor, id)
}

export async function deleteRole(db: CommonQueryMethods, actor: Actor, id: string): Promise<void> {
  requireAdmin(actor)
  await getRole(db, actor, id)
  await db.query(sql.unsafe`delete from crm.roles where workspace_id = ${actor.workspaceId} and id = ${id}`)
}
