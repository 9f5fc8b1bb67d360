// Token scopes (docs/api.md section 4a): the names a token may carry, what each allows in plain words,
// and the scope each route needs. The database decides what a scope allows (crm.scopes_cover,
// crm.is_admin_for in sql/definitions/20_tenancy_and_access.sql); this list is the same as crm.known_scopes()
// (test/auth/token-scopes.test.ts compares them).
import type { RecordType } from '../records/fields.ts'

export const TOKEN_SCOPES = [
  'contacts:read',
  'contacts:write',
  'companies:read',
  'companies:write',
  'deals:read',
  'deals:write',
  'webhooks:manage',
  'workspace:admin',
  'offline_access',
] as const

export type TokenScope = (typeof TOKEN_SCOPES)[number]

/** What each scope lets a token do, for forms and consent screens ("within your role" is implied). */
export const SCOPE_DESCRIPTIONS: Record<TokenScope, string> = {
  'contacts:read': 'See and export contacts and their associations',
  'contacts:write': 'Create, change, delete and import contacts (and see them)',
  'companies:read': 'See and export companies and their associations',
  'companies:write': 'Create, change, delete and import companies (and see them)',
  'deals:read': 'See and export deals, their stages and associations',
  'deals:write': 'Create, change, delete and import deals (and see them)',
  // A subscription's URL can be changed and its deliveries sent again or recovered, so this scope
  // reads every record its events carry, whatever the other scopes (docs/decisions.md).
  'webhooks:manage':
    'Manage webhook subscriptions and their deliveries, which carry every contact, company and deal change: read all of those records as they change (admins)',
  'workspace:admin': 'Manage members, roles, teams, invitations and OAuth apps (admins)',
  offline_access: 'Stay connected: receive a refresh token, so the app keeps access until you disconnect it',
}

/** The scopes a personal token may carry (offline_access means a refresh token: OAuth only). */
export const PERSONAL_TOKEN_SCOPES = TOKEN_SCOPES.filter((scope) => scope !== 'offline_access')

/**
 * The scope a route needs: one name, or a list of which any one will do (search across types), or
 * 'none' for what every token may do (its own identity, workspaces and tokens).
 */
export type RouteScope = TokenScope | readonly TokenScope[] | 'none'

/** The read scope of a record type: view, search, associations and export. */
export function readScope(type: Pick<RecordType, 'path'>): TokenScope {
  return `${type.path}:read` as TokenScope
}

/** The write scope of a record type: create, update, delete and import (reading too). */
export function writeScope(type: Pick<RecordType, 'path'>): TokenScope {
  return `${type.path}:write` as TokenScope
}

/** The scopes that satisfy a route's need (a write scope satisfies its type's read need). */
export function satisfyingScopes(needed: RouteScope): TokenScope[] {
  if (needed === 'none') return []
  const names = typeof needed === 'string' ? [needed] : [...needed]
  return names.flatMap((name) => (name.endsWith(':read') ? [name, name.replace(/:read$/, ':write') as TokenScope] : [name]))
}

/** Whether a token's scopes (null: unscoped) let it call a route that needs `needed`. */
export function scopesAllow(scopes: readonly string[] | null, needed: RouteScope): boolean {
  if (scopes === null || needed === 'none') return true
  return satisfyingScopes(needed).some((scope) => scopes.includes(scope))
}

/** The `scope` attribute of an insufficient_scope challenge: the names the route accepts, space-separated. */
export function scopeAttribute(needed: RouteScope): string {
  if (needed === 'none') return ''
  return (typeof needed === 'string' ? [needed] : [...needed]).join(' ')
}
