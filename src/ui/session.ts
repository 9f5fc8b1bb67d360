// The browser session: the cookie holds a session token (kind session in crm.tokens), so it is
// checked, rate-limited, suspended and revoked by crm.authenticate exactly like an API token.
// Forms carry a CSRF token: an HMAC of the session token's hash (or, before sign-in, of a random
// pre-session cookie) keyed by a key derived from APP_SECRET.
//
// Over https (directly, or through a trusted proxy that says so) every cookie is Secure and its
// name carries a prefix the browser enforces: `__Host-` (Secure, Path=/, no Domain: only this host
// can set it, so a sibling subdomain or a plain-http page cannot plant a session or a pre-session
// for the CSRF token), `__Secure-` for the one cookie scoped to a path. Only the prefixed name is
// read then. Over plain http (make run on localhost) browsers refuse both prefixes, so the names
// are plain there.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Credential } from '../auth/authenticate.ts'
import { deriveKey, open, seal } from '../auth/secret-box.ts'
import { hashToken, TOKEN_PATTERN } from '../auth/tokens.ts'
import { clientOf } from '../http/client-address.ts'

export const SESSION_COOKIE = 'crm_session'
export const WORKSPACE_COOKIE = 'crm_workspace'
export const PRE_SESSION_COOKIE = 'crm_pre_session'
export const CHALLENGE_COOKIE = 'crm_challenge'

export function readCookies(req: IncomingMessage): Map<string, string> {
  const cookies = new Map<string, string>()
  for (const part of (req.headers.cookie ?? '').split(';')) {
    const at = part.indexOf('=')
    if (at <= 0) continue
    const name = part.slice(0, at).trim()
    if (cookies.has(name)) continue // the first (most specific path) wins, as browsers send it
    try {
      cookies.set(name, decodeURIComponent(part.slice(at + 1).trim()))
    } catch {
      // a malformed value is treated as absent
    }
  }
  return cookies
}

/** https directly, or behind a trusted proxy (TRUST_PROXY) that says so. */
export function isSecureRequest(req: IncomingMessage): boolean {
  return clientOf(req).secure
}

type CookieOptions = { maxAgeSeconds?: number; path?: string }

/** The name a cookie goes by on this request: prefixed over https, plain over http. */
export function cookieName(req: IncomingMessage, name: string, path = '/'): string {
  if (!isSecureRequest(req)) return name
  return `${path === '/' ? '__Host-' : '__Secure-'}${name}`
}

/** A cookie of the request by its unprefixed name (`path`: the one it was set for). */
export function readCookie(req: IncomingMessage, name: string, path = '/'): string | undefined {
  return readCookies(req).get(cookieName(req, name, path))
}

export function setCookie(req: IncomingMessage, res: ServerResponse, name: string, value: string, options: CookieOptions = {}): void {
  const path = options.path ?? '/'
  const parts = [`${cookieName(req, name, path)}=${encodeURIComponent(value)}`, `Path=${path}`, 'HttpOnly', 'SameSite=Lax']
  if (options.maxAgeSeconds !== undefined) parts.push(`Max-Age=${Math.max(0, Math.floor(options.maxAgeSeconds))}`)
  if (isSecureRequest(req)) parts.push('Secure')
  const previous = res.getHeader('Set-Cookie')
  const list = Array.isArray(previous) ? previous : typeof previous === 'string' ? [previous] : []
  res.setHeader('Set-Cookie', [...list, parts.join('; ')])
}

export function clearCookie(req: IncomingMessage, res: ServerResponse, name: string, path = '/'): void {
  setCookie(req, res, name, '', { maxAgeSeconds: 0, path })
}

/** The credentialOf for createAuthenticator: the session cookie, as a UI credential. */
export function sessionCredential(req: IncomingMessage): Credential | null {
  const token = readCookie(req, SESSION_COOKIE)
  return token ? { token, via: 'ui' } : null
}

export function hasSessionCookie(req: IncomingMessage): boolean {
  const token = readCookie(req, SESSION_COOKIE)
  return token !== undefined && TOKEN_PATTERN.test(token)
}

function csrfKey(appSecret: string): Buffer {
  return deriveKey(appSecret, 'ui-csrf')
}

/** What a CSRF token is bound to: the session, else the pre-session cookie (sign-in forms). */
function csrfSubject(req: IncomingMessage): string | null {
  const session = readCookie(req, SESSION_COOKIE)
  if (session) return `session:${hashToken(session).toString('hex')}`
  const preSession = readCookie(req, PRE_SESSION_COOKIE)
  if (preSession && /^[A-Za-z0-9_-]{22,64}$/.test(preSession)) return `pre:${preSession}`
  return null
}

/** Makes sure a signed-out browser has a pre-session cookie to bind the sign-in form to. */
export function ensurePreSession(req: IncomingMessage, res: ServerResponse): void {
  if (csrfSubject(req) !== null) return
  const value = randomBytes(18).toString('base64url')
  setCookie(req, res, PRE_SESSION_COOKIE, value, { maxAgeSeconds: 3600 })
  // The form rendered in this same response must see it.
  req.headers.cookie = `${req.headers.cookie ? req.headers.cookie + '; ' : ''}${cookieName(req, PRE_SESSION_COOKIE)}=${value}`
}

export function csrfToken(appSecret: string, req: IncomingMessage): string {
  const subject = csrfSubject(req)
  if (subject === null) return ''
  return createHmac('sha256', csrfKey(appSecret)).update(subject).digest('base64url')
}

export function csrfValid(appSecret: string, req: IncomingMessage, given: string | undefined): boolean {
  const expected = csrfToken(appSecret, req)
  if (!expected || !given) return false
  const a = Buffer.from(expected)
  const b = Buffer.from(given)
  return a.length === b.length && timingSafeEqual(a, b)
}

// ---------------------------------------------------------------------------------------------
// Values shown once (a new webhook secret, token, client secret, recovery codes) travel from the
// form post to the page it redirects to in a sealed, short-lived cookie bound to the session, so
// the post can redirect (a reload never posts twice) and the value is gone after one display.
export const FLASH_COOKIE = 'crm_flash'
const FLASH_SECONDS = 60

function sessionHash(req: IncomingMessage): string {
  const session = readCookie(req, SESSION_COOKIE)
  return session ? hashToken(session).toString('hex') : ''
}

export function setFlash(appSecret: string, req: IncomingMessage, res: ServerResponse, kind: string, data: unknown): void {
  const payload = JSON.stringify({ kind, data, session: sessionHash(req), expires: Date.now() + FLASH_SECONDS * 1000 })
  setCookie(req, res, FLASH_COOKIE, seal(deriveKey(appSecret, 'ui-flash'), payload).toString('base64url'), { maxAgeSeconds: FLASH_SECONDS })
}

/** The flash of this kind for this session, once: the cookie is cleared as it is read. */
export function takeFlash<T>(appSecret: string, req: IncomingMessage, res: ServerResponse, kind: string): T | null {
  const sealed = readCookie(req, FLASH_COOKIE)
  if (!sealed) return null
  clearCookie(req, res, FLASH_COOKIE)
  try {
    const payload = JSON.parse(open(deriveKey(appSecret, 'ui-flash'), Buffer.from(sealed, 'base64url'))) as {
      kind: string
      data: T
      session: string
      expires: number
    }
    if (payload.kind !== kind || payload.session !== sessionHash(req) || payload.expires < Date.now()) return null
    return payload.data
  } catch {
    return null
  }
}
