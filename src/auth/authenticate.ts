// Per-request authentication: one SQL call (crm.authenticate) that checks the token and the user,
// chooses the workspace, counts the rate limit, and sets the proven request context; the same
// statement switches the transaction to crm_api, so everything after it obeys row-level security.
import type { IncomingMessage } from 'node:http'
import type { Config } from '../config.ts'
import { sql } from '../db/pool.ts'
import type { Authenticator } from '../http/app.ts'
import { ApiError, problems } from '../http/problem.ts'
import type { Caller } from '../http/route.ts'
import { hashToken, TOKEN_PATTERN } from './tokens.ts'

const SLUG_PATTERN = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/

const REFUSALS: Record<string, string> = {
  token_invalid: 'The token is not valid',
  token_revoked: 'The token was revoked',
  token_expired: 'The token has expired',
  user_suspended: 'The user is suspended',
  api_access_disabled: 'API access is turned off for this user',
}

type AuthRow = {
  failure: string | null
  user_id: string
  workspace_id: string
  workspace_slug: string
  token_id: string
  token_kind: 'token' | 'session'
  is_admin: boolean
  rate_count: number
  rate_reset_seconds: number
}

export type Credential = { token: string; via: 'api' | 'ui' }

/** The bearer token of a request; the UI adds its session cookie as another source. */
export function bearerCredential(req: IncomingMessage): Credential | null {
  const header = req.headers.authorization
  if (!header) return null
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header)
  if (!match) throw problems.unauthenticated('token_invalid', 'Send Authorization: Bearer <token>')
  return { token: match[1], via: 'api' }
}

export function createAuthenticator(config: Config, credentialOf: (req: IncomingMessage) => Credential | null = bearerCredential): Authenticator {
  return async (db, req) => {
    const credential = credentialOf(req)
    if (!credential) throw problems.unauthenticated('token_missing', 'Send Authorization: Bearer <token>')
    if (!TOKEN_PATTERN.test(credential.token)) throw problems.unauthenticated('token_invalid', REFUSALS.token_invalid)
    const slugHeader = req.headers['x-tenant-slug']
    const slug = typeof slugHeader === 'string' && slugHeader !== '' ? slugHeader.toLowerCase() : null
    if (slug !== null && !SLUG_PATTERN.test(slug)) throw problems.workspaceNotFound()

    const limit = config.rateLimitPerMinute
    const row = (await db.one(sql.unsafe`
      select a.*, set_config('role', 'crm_api', true) as role
      from crm.authenticate(${sql.binary(hashToken(credential.token))}, ${slug}, ${credential.via}, ${limit}) a
    `)) as AuthRow
    const rateLimit = { limit, remaining: Math.max(0, limit - (row.rate_count ?? 0)), resetSeconds: row.rate_reset_seconds }
    if (row.failure === 'rate_limited') {
      throw new ApiError(429, 'rate_limited', 'Too many requests', `More than ${limit} requests in this minute`, {
        headers: { 'Retry-After': String(rateLimit.resetSeconds), 'RateLimit-Limit': String(limit), 'RateLimit-Remaining': '0', 'RateLimit-Reset': String(rateLimit.resetSeconds) },
      })
    }
    if (row.failure === 'workspace_not_found') throw problems.workspaceNotFound()
    if (row.failure) throw problems.unauthenticated(row.failure, REFUSALS[row.failure] ?? 'Authentication failed')
    const caller: Caller = {
      userId: row.user_id,
      workspaceId: row.workspace_id,
      workspaceSlug: row.workspace_slug,
      tokenId: row.token_id,
      tokenKind: row.token_kind,
      isAdmin: row.is_admin,
      via: credential.via,
      rateLimit,
    }
    return caller
  }
}
