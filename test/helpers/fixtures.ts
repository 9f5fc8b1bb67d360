// Workspaces, users, memberships and tokens made directly in SQL as the owner role, so record and
// webhook tests start from a known tenant without going through sign-in.
import pg from 'pg'
import { hashToken, newToken } from '../../src/auth/tokens.ts'
import { rememberSecret } from './secrets.ts'

type Teardown = { teardown: (fn: () => unknown) => void }

export type Member = { id: string; email: string; token: string; role: string }
export type Tenant = { id: string; slug: string; members: Record<string, Member> }

/** A cheap fixed scrypt hash of "correct horse battery" (N=1024, for test speed). */
export const TEST_PASSWORD = 'correct horse battery'
rememberSecret(TEST_PASSWORD)

export async function withOwner<T>(url: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return await fn(client)
  } finally {
    await client.end()
  }
}

/**
 * Creates a workspace (trial 14 days unless told) with members by role name, e.g.
 * `{ 'admin@acme.test': 'admin', 'bob@acme.test': 'member' }`, each with an API token.
 * Teams: `{ sales: ['bob@acme.test', ...] }`.
 */
export async function createTenant(
  url: string,
  options: {
    slug?: string
    plan?: 'free' | 'pro'
    trialDays?: number
    seats?: number | null
    members: Record<string, string>
    teams?: Record<string, string[]>
  },
): Promise<Tenant> {
  return withOwner(url, async (client) => {
    const slug = options.slug ?? `ws-${Math.random().toString(36).slice(2, 10)}`
    const {
      rows: [workspace],
    } = await client.query(
      `insert into crm.workspaces (slug, name, plan, trial_ends_at, seat_limit) values ($1, $2, $3, now() + make_interval(days => $4), $5) returning id`,
      [slug, slug, options.plan ?? 'free', options.trialDays ?? 14, options.seats ?? null],
    )
    const members: Record<string, Member> = {}
    for (const [email, role] of Object.entries(options.members)) {
      const member = await addMember(client, workspace.id, email, role)
      members[email] = member
    }
    for (const [team, emails] of Object.entries(options.teams ?? {})) {
      const {
        rows: [row],
      } = await client.query('insert into crm.teams (workspace_id, name) values ($1, $2) returning id', [workspace.id, team])
      for (const email of emails) {
        await client.query('insert into crm.team_members (workspace_id, team_id, user_id) values ($1, $2, $3)', [
          workspace.id,
          row.id,
          members[email].id,
        ])
      }
    }
    return { id: workspace.id, slug, members }
  })
}

export async function addMember(client: pg.Client, workspaceId: string, email: string, role: string): Promise<Member> {
  const {
    rows: [user],
  } = await client.query(
    `insert into crm.users (email, name) values (lower($1), $1) on conflict (email) do update set name = excluded.name returning id`,
    [email],
  )
  await client.query(
    `insert into crm.memberships (workspace_id, user_id, role_id)
     select $1, $2, id from crm.roles where workspace_id = $1 and name = $3`,
    [workspaceId, user.id, role],
  )
  const token = await mintToken(client, user.id)
  return { id: user.id, email: email.toLowerCase(), token, role }
}

export async function mintToken(
  client: pg.Client,
  userId: string,
  options: {
    kind?: 'token' | 'session' | 'oauth'
    ttl?: string
    /** The token's scopes (docs/api.md section 4a); unscoped when left out. */
    scopes?: string[]
    /** For kind oauth: the workspace the token is bound to and the app it was issued to. */
    workspaceId?: string
    oauthAppId?: string
  } = {},
): Promise<string> {
  const token = newToken()
  rememberSecret(token)
  // An OAuth access token belongs to a grant (sql/definitions/70_oauth.sql): one is made for it.
  await client.query(
    `with oauth_grant as (
       insert into crm.oauth_grants (workspace_id, app_id, user_id, scopes, expires_at)
       select $6, $7, $1, $5, now() + $4::interval where $2::text = 'oauth'
       returning id)
     insert into crm.tokens (user_id, kind, name, token_hash, expires_at, scopes, workspace_id, oauth_app_id, oauth_grant_id)
     values ($1, $2, 'test', $3, now() + $4::interval, $5, $6, $7, (select id from oauth_grant))`,
    [
      userId,
      options.kind ?? 'token',
      hashToken(token),
      options.ttl ?? '1 day',
      options.scopes ?? null,
      options.workspaceId ?? null,
      options.oauthAppId ?? null,
    ],
  )
  return token
}

export type { Teardown }
