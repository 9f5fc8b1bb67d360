// The token and revocation endpoints (RFC 6749 sections 3.2, 4.1.3 and 6; RFC 7636 section 4.6;
// RFC 7009): what they read from a form post, and the SQL functions that decide
// (sql/definitions/70_oauth.sql). Client authentication, codes, PKCE, rotation and reuse detection are
// decided in the database, in one statement per request; this file parses, hashes and answers.
import { createHash, randomBytes } from 'node:crypto'
import Type from 'typebox'
import { newToken } from '../auth/tokens.ts'
import { type DatabasePool, sql } from '../db/pool.ts'
import { NullableString, rowType } from '../db/typed-rows.ts'
import { OAuthError } from '../errors.ts'
import { parseScope } from './scopes.ts'

/** docs/api.md section 4a: access tokens live one hour (crm.oauth_access_token_lifetime()). */
export const ACCESS_TOKEN_SECONDS = 3600

export const REFRESH_TOKEN_PATTERN = /^crmrt_[A-Za-z0-9_-]{43}$/

/** What the client sent: the form's parameters and its Authorization header. */
export type TokenRequest = { form: URLSearchParams; authorization: string | undefined }

export type TokenResponse = {
  access_token: string
  token_type: 'Bearer'
  expires_in: number
  refresh_token?: string
  scope: string
}

type Client = { clientId: string; secretHash: Buffer | null }

const sha256 = (text: string) => createHash('sha256').update(text).digest()

/** RFC 6749 section 3.2: no parameter more than once. Returns the single value, or null. */
function single(form: URLSearchParams, name: string): string | null {
  const values = form.getAll(name)
  if (values.length > 1) throw new OAuthError('invalid_request', `${name} is sent more than once`)
  return values.length === 1 && values[0] !== '' ? values[0] : null
}

/** application/x-www-form-urlencoded decoding of one part of a Basic credential (RFC 6749 section 2.3.1). */
function formDecoded(text: string): string {
  try {
    return decodeURIComponent(text.replaceAll('+', ' '))
  } catch {
    throw new OAuthError('invalid_client', 'the Basic credentials are not form-encoded', {})
  }
}

/**
 * The client and its secret: client_secret_basic (Authorization: Basic), client_secret_post
 * (client_id and client_secret in the form), or a public client's bare client_id. One method only.
 */
function clientOf(request: TokenRequest): Client {
  const formId = single(request.form, 'client_id')
  const formSecret = single(request.form, 'client_secret')
  const header = request.authorization
  if (header && /^basic\s/i.test(header)) {
    if (formSecret !== null) throw new OAuthError('invalid_request', 'use one client authentication method, not two')
    const decoded = Buffer.from(header.replace(/^basic\s+/i, '').trim(), 'base64').toString('utf8')
    const colon = decoded.indexOf(':')
    if (colon < 0) throw new OAuthError('invalid_client', 'the Basic credentials are malformed')
    const clientId = formDecoded(decoded.slice(0, colon))
    const secret = formDecoded(decoded.slice(colon + 1))
    if (formId !== null && formId !== clientId) throw new OAuthError('invalid_request', 'client_id differs from the Basic credentials')
    return { clientId, secretHash: sha256(secret) }
  }
  if (formId === null)
    throw new OAuthError('invalid_client', 'client authentication is missing: send client_id (and the secret of a confidential client)')
  return { clientId: formId, secretHash: formSecret === null ? null : sha256(formSecret) }
}

/**
 * The client id of a request that presents a secret (client_secret_basic or client_secret_post),
 * or null: a public client, or credentials too malformed to name a client (the endpoint refuses
 * those itself).
 */
export function clientSendingSecret(request: TokenRequest): string | null {
  try {
    const { clientId, secretHash } = clientOf(request)
    return secretHash === null ? null : clientId
  } catch {
    return null
  }
}

const GrantRow = rowType(
  Type.Object({
    error: NullableString,
    error_description: NullableString,
    scopes: Type.Union([Type.Array(Type.String()), Type.Null()]),
    access_expires_at: Type.Union([Type.String(), Type.Null()]),
    refresh_issued: Type.Union([Type.Boolean(), Type.Null()]),
  }),
)

function answer(
  row: { error: string | null; error_description: string | null; scopes: string[] | null; refresh_issued: boolean | null },
  accessToken: string,
  refreshToken: string,
): TokenResponse {
  // The database checks the client first: any other refusal is of a client it authenticated.
  if (row.error !== null)
    throw new OAuthError(row.error, row.error_description ?? row.error, { clientAuthenticated: row.error !== 'invalid_client' })
  return {
    access_token: accessToken,
    token_type: 'Bearer',
    expires_in: ACCESS_TOKEN_SECONDS,
    ...(row.refresh_issued ? { refresh_token: refreshToken } : {}),
    scope: (row.scopes ?? []).join(' '),
  }
}

function newRefreshToken(): string {
  return `crmrt_${randomBytes(32).toString('base64url')}`
}

/** POST /oauth/token: grant_type authorization_code or refresh_token. */
export async function issueTokens(pool: DatabasePool, request: TokenRequest): Promise<TokenResponse> {
  const grantType = single(request.form, 'grant_type')
  if (grantType === null) throw new OAuthError('invalid_request', 'grant_type is required')
  if (grantType !== 'authorization_code' && grantType !== 'refresh_token')
    throw new OAuthError('unsupported_grant_type', 'grant_type must be authorization_code or refresh_token')
  const client = clientOf(request)
  const accessToken = newToken()
  const refreshToken = newRefreshToken()

  if (grantType === 'authorization_code') {
    const code = single(request.form, 'code')
    const redirectUri = single(request.form, 'redirect_uri')
    const verifier = single(request.form, 'code_verifier')
    if (code === null) throw new OAuthError('invalid_request', 'code is required')
    if (redirectUri === null) throw new OAuthError('invalid_request', 'redirect_uri is required')
    // RFC 7636 section 4.1: 43 to 128 unreserved characters. Every code has a challenge, so a
    // request without a verifier is malformed (and does not use the code up).
    if (verifier === null) throw new OAuthError('invalid_request', 'code_verifier is required (PKCE)')
    if (!/^[A-Za-z0-9._~-]{43,128}$/.test(verifier))
      throw new OAuthError('invalid_request', 'code_verifier must be 43 to 128 unreserved characters')
    const row = await pool.one(sql.type(GrantRow)`
      select error, error_description, scopes, access_expires_at, refresh_issued
        from crm.oauth_exchange_code(${client.clientId}, ${client.secretHash && sql.binary(client.secretHash)}, ${sql.binary(sha256(code))},
                                     ${redirectUri}, ${verifier}, ${sql.binary(sha256(accessToken))}, ${sql.binary(sha256(refreshToken))})`)
    return answer(row, accessToken, refreshToken)
  }

  const presented = single(request.form, 'refresh_token')
  if (presented === null) throw new OAuthError('invalid_request', 'refresh_token is required')
  const scopeText = single(request.form, 'scope')
  const scopes = scopeText === null ? null : parseScope(scopeText)
  if (scopeText !== null && scopes === null) throw new OAuthError('invalid_scope', 'scope names an unknown scope or repeats one')
  const row = await pool.one(sql.type(GrantRow)`
    select error, error_description, scopes, access_expires_at, refresh_issued
      from crm.oauth_refresh(${client.clientId}, ${client.secretHash && sql.binary(client.secretHash)}, ${sql.binary(sha256(presented))},
                             ${scopes && sql.array(scopes, 'text')}, ${sql.binary(sha256(accessToken))}, ${sql.binary(sha256(refreshToken))})`)
  return answer(row, accessToken, refreshToken)
}

const RevokeRow = rowType(Type.Object({ error: NullableString }))

/** POST /oauth/revoke (RFC 7009): revokes the grant of a token the client holds; unknown tokens change nothing. */
export async function revokeToken(pool: DatabasePool, request: TokenRequest): Promise<void> {
  const token = single(request.form, 'token')
  single(request.form, 'token_type_hint')
  const client = clientOf(request)
  if (token === null) throw new OAuthError('invalid_request', 'token is required')
  const row = await pool.one(sql.type(RevokeRow)`
    select crm.oauth_revoke(${client.clientId}, ${client.secretHash && sql.binary(client.secretHash)}, ${sql.binary(sha256(token))}) as error`)
  if (row.error !== null) throw new OAuthError(row.error, 'unknown client, or wrong client authentication')
}
