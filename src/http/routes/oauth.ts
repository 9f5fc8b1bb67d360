// The OAuth 2.0 endpoints an app calls directly (docs/api.md section 4a): the token endpoint, the
// revocation endpoint (RFC 7009) and the metadata document (RFC 8414). The authorization endpoint
// is a page a person sees (src/ui/pages/authorize.ts). Errors of the token and revocation
// endpoints are RFC 6749 section 5.2 JSON, not problem details: OAuth clients read `error`.
import type { IncomingMessage } from 'node:http'
import Type from 'typebox'
import { OAuthError } from '../../errors.ts'
import { authorizationServerMetadata } from '../../oauth/metadata.ts'
import { KNOWN_SCOPES } from '../../oauth/scopes.ts'
import { clientSendingSecret, issueTokens, revokeToken, type TokenRequest } from '../../oauth/token-endpoint.ts'
import { mediaType } from '../body.ts'
import { fieldWithNul, receiveForm } from '../form-body.ts'
import { defineRoutes, type RouteResult, type Services } from '../route.ts'

const NO_STORE = { 'Cache-Control': 'no-store', Pragma: 'no-cache' }

export const OAuthErrorSchema = Type.Object({
  error: Type.Union(
    ['invalid_request', 'invalid_client', 'invalid_grant', 'unauthorized_client', 'unsupported_grant_type', 'invalid_scope'].map((code) =>
      Type.Literal(code),
    ),
  ),
  error_description: Type.Optional(Type.String()),
})

const TokenForm = Type.Object({
  grant_type: Type.Union([Type.Literal('authorization_code'), Type.Literal('refresh_token')]),
  code: Type.Optional(Type.String({ description: 'authorization_code: the code from the redirect' })),
  redirect_uri: Type.Optional(Type.String({ description: 'authorization_code: the redirect_uri of the authorization request' })),
  code_verifier: Type.Optional(
    Type.String({ description: 'authorization_code: the PKCE verifier (RFC 7636)', minLength: 43, maxLength: 128 }),
  ),
  refresh_token: Type.Optional(Type.String({ description: 'refresh_token: the latest refresh token (each works once)' })),
  scope: Type.Optional(Type.String({ description: 'refresh_token: a narrower space-separated scope for the new access token' })),
  client_id: Type.Optional(Type.String({ description: 'client_secret_post and public clients' })),
  client_secret: Type.Optional(Type.String({ description: 'client_secret_post' })),
})
const TokenResponseSchema = Type.Object({
  access_token: Type.String({ description: 'crm_...: a bearer token of kind oauth for /api' }),
  token_type: Type.Literal('Bearer'),
  expires_in: Type.Literal(3600),
  refresh_token: Type.Optional(Type.String({ description: 'crmrt_...: only with offline_access; works once' })),
  scope: Type.String(),
})
const RevokeForm = Type.Object({
  token: Type.String({ description: 'an access token or a refresh token this client holds' }),
  token_type_hint: Type.Optional(Type.String()),
  client_id: Type.Optional(Type.String()),
  client_secret: Type.Optional(Type.String()),
})

/** The form post of an OAuth client, and its Authorization header (client_secret_basic). */
async function tokenRequest(req: IncomingMessage, services: Services): Promise<TokenRequest> {
  if (mediaType(req) !== 'application/x-www-form-urlencoded')
    throw new OAuthError('invalid_request', 'send the parameters as application/x-www-form-urlencoded')
  const form = await receiveForm(req, services)
  if (fieldWithNul(form) !== undefined) throw new OAuthError('invalid_request', 'a parameter contains a NUL character')
  return { form, authorization: req.headers.authorization }
}

/**
 * The count a token or revocation request is held to. A confidential client that sends its
 * secret counts as that client (OAUTH_CLIENT_RATE_LIMIT_PER_MINUTE) once the database has checked
 * the secret: one client refreshing for many users from one address is one client, not one
 * address. Anything else, a public client or none, counts against its address like sign-in; so
 * does a secret that fails (or a request refused before its client was checked), and an address
 * with UNAUTHENTICATED_RATE_LIMIT_PER_MINUTE such failures this minute is refused before the
 * database is asked, so rotating made-up secrets buys a guesser nothing.
 */
async function limitedPerClient(
  req: IncomingMessage,
  services: Services,
  answer: (request: TokenRequest) => Promise<RouteResult>,
): Promise<RouteResult> {
  let request: TokenRequest
  try {
    request = await tokenRequest(req, services)
  } catch (error) {
    services.addressRateLimit(req)
    throw error
  }
  const clientId = clientSendingSecret(request)
  if (clientId === null) {
    services.addressRateLimit(req)
    return answer(request)
  }
  const limit = services.oauthClientRateLimit
  limit.admit(req, clientId)
  try {
    const result = await answer(request)
    limit.counted(clientId)
    return result
  } catch (error) {
    if (error instanceof OAuthError && error.clientAuthenticated) limit.counted(clientId)
    else if (error instanceof OAuthError) limit.failed(req)
    throw error
  }
}

/** RFC 6749 section 5.2: 400 with `error`, or 401 and a Basic challenge for a client that failed to authenticate. */
async function answeringOAuthErrors(run: () => Promise<RouteResult>): Promise<RouteResult> {
  try {
    return await run()
  } catch (error) {
    if (!(error instanceof OAuthError)) throw error
    const client = error.code === 'invalid_client'
    return {
      status: client ? 401 : 400,
      body: { error: error.code, error_description: error.message },
      headers: { ...NO_STORE, ...(client ? { 'WWW-Authenticate': 'Basic realm="crm"' } : {}) },
    }
  }
}

const tag = 'oauth'

export default defineRoutes(
  {
    method: 'POST',
    path: '/oauth/token',
    summary: 'Exchange an authorization code (with its PKCE verifier) or a refresh token for an access token (RFC 6749)',
    tag,
    auth: 'none',
    credentials: 'anonymous',
    formBody: TokenForm,
    response: TokenResponseSchema,
    errorBody: OAuthErrorSchema,
    errors: [400, 401, 429],
    handler: ({ req, services }) =>
      answeringOAuthErrors(() =>
        limitedPerClient(req, services, async (request) => ({ body: await issueTokens(services.pool, request), headers: NO_STORE })),
      ),
  },
  {
    method: 'POST',
    path: '/oauth/revoke',
    summary: 'Revoke an access or refresh token, and with it the grant it belongs to (RFC 7009)',
    tag,
    auth: 'none',
    credentials: 'anonymous',
    formBody: RevokeForm,
    errorBody: OAuthErrorSchema,
    errors: [400, 401, 429],
    handler: ({ req, services }) =>
      answeringOAuthErrors(() =>
        limitedPerClient(req, services, async (request) => {
          await revokeToken(services.pool, request)
          return { status: 200, body: {}, headers: NO_STORE }
        }),
      ),
  },
  {
    method: 'GET',
    path: '/.well-known/oauth-authorization-server',
    summary: 'The authorization server metadata (RFC 8414)',
    tag,
    auth: 'none',
    response: Type.Object(
      {
        issuer: Type.String(),
        authorization_endpoint: Type.String(),
        token_endpoint: Type.String(),
        revocation_endpoint: Type.String(),
        scopes_supported: Type.Array(Type.Union(KNOWN_SCOPES.map((scope) => Type.Literal(scope)))),
        code_challenge_methods_supported: Type.Array(Type.Literal('S256')),
      },
      { additionalProperties: true },
    ),
    handler: async ({ services }) => ({
      body: authorizationServerMetadata(services.baseUrl),
      headers: { 'Cache-Control': 'public, max-age=300' },
    }),
  },
)
