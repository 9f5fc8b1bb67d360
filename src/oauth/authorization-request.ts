// The authorization request (RFC 6749 section 4.1.1, RFC 7636 section 4.3) as the consent page
// reads it, from the query of GET /oauth/authorize or from the consent form that repeats it.
// What may be answered by a redirect and what may not: an unknown client or a redirect URI that
// is not the app's own gets an error page (a redirect would send the browser somewhere nobody
// vouched for); every other problem goes back to the app's redirect URI (section 4.1.2.1).
import { parseScope } from './scopes.ts'

export type AuthorizationRequest = {
  clientId: string
  redirectUri: string
  scopes: string[]
  state: string | null
  codeChallenge: string
}

/** Where to send the browser back, with what: RFC 6749 sections 4.1.2 and 4.1.2.1, RFC 9207. */
export function redirectBack(redirectUri: string, parameters: Record<string, string | null>, issuer: string): string {
  const url = new URL(redirectUri)
  for (const [name, value] of Object.entries(parameters)) if (value !== null) url.searchParams.append(name, value)
  url.searchParams.append('iss', issuer)
  return url.toString()
}

type Parameters = { get: (name: string) => string | null; count: (name: string) => number }

export function parametersOf(search: URLSearchParams): Parameters {
  return { get: (name) => search.get(name), count: (name) => search.getAll(name).length }
}

/** client_id and redirect_uri, each once, or null (an error page, never a redirect). */
export function clientOfRequest(parameters: Parameters): { clientId: string; redirectUri: string } | null {
  const clientId = parameters.get('client_id')
  const redirectUri = parameters.get('redirect_uri')
  if (parameters.count('client_id') !== 1 || parameters.count('redirect_uri') !== 1 || !clientId || !redirectUri) return null
  if (clientId.length > 100 || redirectUri.length > 2000) return null
  return { clientId, redirectUri }
}

export type Checked = { ok: true; request: AuthorizationRequest } | { ok: false; error: string; description: string; state: string | null }

/** The rest of the request, once client and redirect URI are known to be the app's. */
export function checkRequest(parameters: Parameters, client: { clientId: string; redirectUri: string }): Checked {
  const state = parameters.get('state')
  const refuse = (error: string, description: string): Checked => ({ ok: false, error, description, state: state?.slice(0, 2000) ?? null })
  for (const name of ['response_type', 'scope', 'state', 'code_challenge', 'code_challenge_method']) {
    if (parameters.count(name) > 1) return refuse('invalid_request', `${name} is sent more than once`)
  }
  if (state !== null && state.length > 2000) return refuse('invalid_request', 'state is longer than 2000 characters')
  const responseType = parameters.get('response_type')
  if (responseType !== 'code') return refuse('unsupported_response_type', 'response_type must be code')
  const challenge = parameters.get('code_challenge')
  if (!challenge) return refuse('invalid_request', 'code_challenge is required: PKCE with S256 (RFC 7636)')
  if (parameters.get('code_challenge_method') !== 'S256') return refuse('invalid_request', 'code_challenge_method must be S256')
  if (!/^[A-Za-z0-9_-]{43}$/.test(challenge)) return refuse('invalid_request', 'code_challenge must be BASE64URL(SHA256(code_verifier))')
  const scopes = parseScope(parameters.get('scope'))
  if (!scopes) return refuse('invalid_scope', 'scope must name one or more known scopes, separated by spaces')
  return { ok: true, request: { ...client, scopes, state, codeChallenge: challenge } }
}
