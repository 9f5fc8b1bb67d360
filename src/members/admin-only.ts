// Who the workspace-administration functions act for, and the one gate they share. The database
// enforces the same rule (admin-only write policies on memberships, roles, teams, invitations);
// this gate answers 403 up front, because an UPDATE or DELETE that RLS filters away silently
// matches no row and would otherwise read as 404.
import type { Caller } from '../auth/caller.ts'
import { ForbiddenError } from '../errors.ts'
import { UUID_PATTERN } from '../uuid.ts'

/** What the domain functions need of the caller (the API's Caller and the UI's session both fit). */
export type Actor = Pick<Caller, 'userId' | 'workspaceId' | 'isAdmin'>

export function requireAdmin(actor: Actor): void {
  if (!actor.isAdmin) throw new ForbiddenError('Only workspace admins may do this')
}

export function isUuid(value: string): boolean {
  return UUID_PATTERN.test(value)
}
