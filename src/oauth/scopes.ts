// The OAuth side of the scopes of docs/api.md section 4a: the names and their plain words are
// src/auth/scopes.ts's (the same list as crm.known_scopes()); this reads an RFC 6749 `scope` parameter.
import { SCOPE_DESCRIPTIONS, TOKEN_SCOPES } from '../auth/scopes.ts'

export const KNOWN_SCOPES: readonly string[] = TOKEN_SCOPES

/** What the consent page and the app pages say about a scope (the name itself for one unknown here). */
export function scopeWords(name: string): string {
  return (SCOPE_DESCRIPTIONS as Record<string, string>)[name] ?? name
}

/**
 * A space-separated `scope` parameter (RFC 6749 section 3.3) as a list in the documented order, or
 * null when it is empty, names an unknown scope, or repeats one.
 */
export function parseScope(text: string | null | undefined): string[] | null {
  if (text === null || text === undefined) return null
  const names = text.split(' ').filter((name) => name !== '')
  if (names.length === 0 || names.length > KNOWN_SCOPES.length) return null
  if (new Set(names).size !== names.length || names.some((name) => !KNOWN_SCOPES.includes(name))) return null
  return KNOWN_SCOPES.filter((name) => names.includes(name))
}
