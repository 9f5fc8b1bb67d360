// The authorization server's metadata (RFC 8414), served at /.well-known/oauth-authorization-server.
// The issuer is the service's base URL (PUBLIC_BASE_URL), the same value the authorization response
// carries as `iss` (RFC 9207), so a client can tell this server's responses from another's.
import { KNOWN_SCOPES } from './scopes.ts'

export function authorizationServerMetadata(issuer: string): Record<string, unknown> {
  return {
    issuer,
    authorization_endpoint: `${issuer}/oauth/authorize`,
    token_endpoint: `${issuer}/oauth/token`,
    revocation_endpoint: `${issuer}/oauth/revoke`,
    scopes_supported: KNOWN_SCOPES,
    response_types_supported: ['code'],
    response_modes_supported: ['query'],
    grant_types_supported: ['authorization_code', 'refresh_token'],
    token_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post', 'none'],
    revocation_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post', 'none'],
    code_challenge_methods_supported: ['S256'],
    authorization_response_iss_parameter_supported: true,
    service_documentation: `${issuer}/api/openapi.json`,
  }
}
