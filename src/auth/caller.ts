// Who is calling: what a request's authentication answers (src/auth/authenticate.ts), what the
// identity cache keeps of it, and what handlers read.
import type { RateQuota } from './rate-limit.ts'

/** Who is calling, as decided by crm.authenticate in the request transaction. */
export type Caller = {
  userId: string
  workspaceId: string
  workspaceSlug: string
  tokenId: string
  tokenKind: 'token' | 'session' | 'oauth'
  /** The role's admin flag (admin routes also need the scope of their area when the token is scoped). */
  isAdmin: boolean
  /** The token's scopes, or null for a token that acts with the whole role (docs/api.md section 4a). */
  scopes: string[] | null
  /** The OAuth app an access token (kind oauth) was issued to, else null. */
  oauthAppId: string | null
  via: 'api' | 'ui'
  rateLimit: RateQuota
  /**
   * Where this request was counted against the rate limit: by crm.authenticate in the request's
   * transaction (a rollback takes the count with it, so the request is counted again outside), or
   * by this process (rate-limit.ts), which no rollback undoes.
   */
  countedIn: 'database' | 'process'
}
