// OAuth apps (docs/api.md section 4a): workspace admins register, list, change and delete them, see
// who connected each one, and revoke an app for the whole workspace. The database holds the same
// rules (the admin policy on crm.oauth_apps, the redirect URI check, the grants' policies); the
// checks here answer first, with a pointer at the offending field.
import { createHash, randomBytes } from 'node:crypto'
import Type, { type Static } from 'typebox'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { IdRow, NullableString, rowType } from '../db/typed-rows.ts'
import { type FieldProblem, NotFoundError, ValidationError } from '../errors.ts'
import { type Actor, isUuid, requireAdmin } from '../members/admin-only.ts'

const LOOPBACK = /^http:\/\/(127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?(\/\S*)?$/
const HTTPS = /^https:\/\/[^/?#@\s]+(\/\S*)?$/

/**
 * Why a redirect URI cannot be registered, in plain words, or null: the rule of
 * crm.oauth_redirect_uris_are_valid (sql/definitions/70_oauth.sql), checked first for a readable answer.
 */
export function redirectUriProblem(uri: string): string | null {
  if (uri.length > 2000) return 'is longer than 2000 characters'
  if (/\s/.test(uri)) return 'contains white space'
  if (uri.includes('#')) return 'must not contain a fragment (#)'
  let url: URL
  try {
    url = new URL(uri)
  } catch {
    return 'is not an absolute URL'
  }
  if (url.username || url.password || uri.includes('@')) return 'must not contain a user name or password'
  if (url.protocol === 'https:' && HTTPS.test(uri)) return null
  if (url.protocol === 'http:' && LOOPBACK.test(uri)) return null
  if (url.protocol === 'http:' && url.hostname === 'localhost') return 'must use http://127.0.0.1 or http://[::1] rather than localhost'
  return 'must use https (plain http only on 127.0.0.1 or [::1], for native apps)'
}

const OAuthAppSchema = Type.Object({
  id: Type.String(),
  name: Type.String(),
  client_id: Type.String(),
  confidential: Type.Boolean(),
  client_secret_last4: NullableString,
  redirect_uris: Type.Array(Type.String()),
  created_at: Type.String(),
  created_by: NullableString,
})
export type OAuthApp = Static<typeof OAuthAppSchema>
const OAUTH_APP = rowType(OAuthAppSchema)

const ConnectionSchema = Type.Object({
  id: Type.String(),
  user: Type.Object({ id: Type.String(), email: Type.String(), name: Type.String() }),
  scopes: Type.Array(Type.String()),
  created_at: Type.String(),
  last_issued_at: Type.String(),
  expires_at: Type.String(),
})
export type Connection = Static<typeof ConnectionSchema>
const CONNECTION = rowType(ConnectionSchema)

const appColumns = sql.fragment`a.id, a.name, a.client_id, a.confidential, a.client_secret_last4, a.redirect_uris, a.created_at, a.created_by`

export type NewApp = { name: string; redirect_uris: string[]; confidential?: boolean }
export type AppChange = { name?: string; redirect_uris?: string[] }

function checkRedirectUris(uris: string[]): string[] {
  const problems: FieldProblem[] = []
  for (const [index, uri] of uris.entries()) {
    const problem = redirectUriProblem(uri)
    if (problem) problems.push({ pointer: `/redirect_uris/${index}`, code: 'redirect_uri', message: problem })
  }
  if (problems.length > 0) throw new ValidationError(`redirect_uris/${problems[0].pointer.split('/')[2]} ${problems[0].message}`, problems)
  const distinct = [...new Set(uris)]
  if (distinct.length !== uris.length)
    throw new ValidationError('redirect_uris repeats a URI', [{ pointer: '/redirect_uris', code: 'unique', message: 'repeats a URI' }])
  return distinct
}

export async function listApps(db: CommonQueryMethods, actor: Actor): Promise<readonly OAuthApp[]> {
  requireAdmin(actor)
  return db.any(sql.type(OAUTH_APP)`select ${appColumns} from crm.oauth_apps a where a.workspace_id = ${actor.workspaceId} order by a.id`)
}

export async function getApp(db: CommonQueryMethods, actor: Actor, id: string): Promise<OAuthApp> {
  requireAdmin(actor)
  const app = isUuid(id)
    ? await db.maybeOne(
        sql.type(OAUTH_APP)`select ${appColumns} from crm.oauth_apps a where a.workspace_id = ${actor.workspaceId} and a.id = ${id}`,
      )
    : null
  if (!app) throw new NotFoundError('No such OAuth app')
  return app
}

/** Registers an app; a confidential one gets its client secret, returned this once (only its SHA-256 is kept). */
export async function createApp(db: CommonQueryMethods, actor: Actor, input: NewApp): Promise<OAuthApp & { client_secret?: string }> {
  requireAdmin(actor)
  const uris = checkRedirectUris(input.redirect_uris)
  const confidential = input.confidential ?? true
  const clientId = `crmapp_${randomBytes(16).toString('base64url')}`
  const secret = confidential ? `crmsec_${randomBytes(32).toString('base64url')}` : null
  const id = await db.oneFirst(sql.type(IdRow)`
    insert into crm.oauth_apps (name, client_id, confidential, client_secret_hash, client_secret_last4, redirect_uris)
    values (${input.name.trim()}, ${clientId}, ${confidential},
            ${secret && sql.binary(createHash('sha256').update(secret).digest())}, ${secret?.slice(-4) ?? null}, ${sql.array(uris, 'text')})
    returning id`)
  const app = await getApp(db, actor, id)
  return secret ? { ...app, client_secret: secret } : app
}

export async function updateApp(db: CommonQueryMethods, actor: Actor, id: string, input: AppChange): Promise<OAuthApp> {
  await getApp(db, actor, id)
  const uris = input.redirect_uris && checkRedirectUris(input.redirect_uris)
  await db.query(sql.unsafe`
    update crm.oauth_apps
       set name = coalesce(${input.name?.trim() ?? null}, name),
           redirect_uris = coalesce(${uris ? sql.array(uris, 'text') : null}::text[], redirect_uris)
     where workspace_id = ${actor.workspaceId} and id = ${id}`)
  return getApp(db, actor, id)
}

/** Deleting an app deletes its grants, codes, refresh tokens and access tokens (cascade). */
export async function deleteApp(db: CommonQueryMethods, actor: Actor, id: string): Promise<void> {
  await getApp(db, actor, id)
  await db.query(sql.unsafe`delete from crm.oauth_apps where workspace_id = ${actor.workspaceId} and id = ${id}`)
}

/** The members who connected the app and have not been cut off: one row per live grant. */
export async function listConnections(db: CommonQueryMethods, actor: Actor, appId: string): Promise<readonly Connection[]> {
  await getApp(db, actor, appId)
  return db.any(sql.type(CONNECTION)`
    select g.id, json_build_object('id', u.id, 'email', u.email, 'name', u.name) as user, g.scopes,
           g.created_at, g.last_issued_at, g.expires_at
      from crm.oauth_grants g join crm.users u on u.id = g.user_id
     where g.workspace_id = ${actor.workspaceId} and g.app_id = ${appId} and g.revoked_at is null and g.expires_at > now()
     order by g.created_at desc, g.id`)
}

/** Revokes every grant of the app in the workspace: every member's tokens for it stop at once. */
export async function revokeAppForWorkspace(db: CommonQueryMethods, actor: Actor, appId: string): Promise<void> {
  await getApp(db, actor, appId)
  await db.query(sql.unsafe`
    update crm.oauth_grants set revoked_at = now()
     where workspace_id = ${actor.workspaceId} and app_id = ${appId} and revoked_at is null`)
}
