// The scopes of API.md section 4a, in the order the documentation lists them (the same list as
// crm.known_scopes() in sql/000010_token_scopes.sql), each with what the consent page says about it.

export const SCOPE_WORDS: Record<string, string> = {
  'contacts:read': 'See your contacts (and export them, where your role allows)',
  'contacts:write': 'See, create, change, delete and import your contacts',
  'companies:read': 'See your companies (and export them, where your role allows)',
  'companies:write': 'See, create, change, delete and import your companies',
  'deals:read': 'See your deals (and export them, where your role allows)',
  'deals:write': 'See, create, change, delete and import your deals',
  'webhooks:manage': 'Manage the workspace’s webhook subscriptions (admins only)',
  'workspace:admin': 'Manage members, roles, teams and invitations (admins only)',
  offline_access: 'Stay connected when you are away (a refresh token)',
}

export const KNOWN_SCOPES = Object.keys(SCOPE_WORDS)

/**
 * A space-separated `scope` parameter (RFC 6749 section 3.3) as a list in the documented order, or
 * null when it is empty, names an unknown scope, or repeats one.
 */
export function parseScope(text: string | null | undefined): string[] | null {
  if (text === null || text === undefined) return null
  const names = text.split(' ').filter((name) => name !== '')
  if (names.length === 0 || names.length > KNOWN_SCOPES.length) return null
  if (new Set(names).size !== names.length || names.some((name) => !Object.hasOwn(SCOPE_WORDS, name))) return null
  return KNOWN_SCOPES.filter((name) => names.includes(name))
}
