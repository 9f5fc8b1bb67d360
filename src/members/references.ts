// Roles and teams named in a request body, by name or by id (a role name can never look like a
// UUID; a team is matched by id first, then by name), resolved in the caller's workspace.
import Type from 'typebox'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { IdRow, rowType } from '../db/typed-rows.ts'
import { ValidationError } from '../errors.ts'
import { isUuid } from './admin-only.ts'

const RoleReference = rowType(Type.Object({ id: Type.String(), name: Type.String() }))

export async function resolveRole(
  db: CommonQueryMethods,
  workspaceId: string,
  ref: string,
  pointer = '/role',
): Promise<{ id: string; name: string }> {
  const role = await db.maybeOne(sql.type(RoleReference)`
    select id, name from crm.roles
    where workspace_id = ${workspaceId} and ${isUuid(ref) ? sql.fragment`id = ${ref}` : sql.fragment`name = ${ref}`}
  `)
  if (!role)
    throw new ValidationError(`${pointer.slice(1)} names no role of this workspace`, [
      { pointer, code: 'not_found', message: 'names no role of this workspace' },
    ])
  return role
}

export async function resolveTeams(db: CommonQueryMethods, workspaceId: string, refs: string[], pointer = '/teams'): Promise<string[]> {
  const ids: string[] = []
  for (const [index, ref] of refs.entries()) {
    const id = await db.maybeOneFirst(sql.type(IdRow)`
      select id from crm.teams
      where workspace_id = ${workspaceId} and (${isUuid(ref) ? sql.fragment`id = ${ref}` : sql.fragment`false`} or name = ${ref})
      order by ${isUuid(ref) ? sql.fragment`id = ${ref} desc` : sql.fragment`id`}
      limit 1
    `)
    if (!id)
      throw new ValidationError(`${pointer.slice(1)}/${index} names no team of this workspace`, [
        { pointer: `${pointer}/${index}`, code: 'not_found', message: 'names no team of this workspace' },
      ])
    if (!ids.includes(id)) ids.push(id)
  }
  return ids
}
