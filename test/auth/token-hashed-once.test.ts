// A request's token is hashed once, however many times the process looks at it: a cached token's
// write asks whether the credential is known (before its body is read) and then authenticates,
// and both need the token's hash.
import type { IncomingMessage } from 'node:http'
import t from 'tap'
import type { CachedIdentity } from '../../src/auth/identity-cache.ts'
import { IdentityCache } from '../../src/auth/identity-cache.ts'
import * as tokens from '../../src/auth/tokens.ts'
import type { Config } from '../../src/config.ts'
import type { DatabaseTransactionConnection } from '../../src/db/pool.ts'

t.test('a cached token is hashed once for the known-credential check and the authentication together', async (t) => {
  let hashes = 0
  // Only tokens.ts is replaced; the modules that load pg (CommonJS, which the mock loader would load
  // again) are handed in as they are.
  const authentication = await t.mockImport<typeof import('../../src/auth/authenticate.ts')>('../../src/auth/authenticate.ts', {
    '../../src/db/pool.ts': await import('../../src/db/pool.ts'),
    '../../src/db/runtime-role.ts': await import('../../src/db/runtime-role.ts'),
    '../../src/db/typed-rows.ts': await import('../../src/db/typed-rows.ts'),
    '../../src/auth/rate-limit.ts': await import('../../src/auth/rate-limit.ts'),
    '../../src/auth/identity-cache.ts': await import('../../src/auth/identity-cache.ts'),
    '../../src/auth/tokens.ts': {
      ...tokens,
      hashToken: (token: string) => {
        hashes++
        return tokens.hashToken(token)
      },
    },
  })
  const token = tokens.newToken()
  const identity: CachedIdentity = {
    caller: {
      userId: 'u',
      workspaceId: 'w',
      workspaceSlug: 'acme',
      tokenId: 't',
      tokenKind: 'token',
      isAdmin: false,
      scopes: null,
      oauthAppId: null,
    },
    accessVersion: '1',
  }
  const identities = new IdentityCache()
  identities.set(IdentityCache.keyOf(tokens.hashToken(token), null, 'api'), identity)
  const quota = { limit: 100, remaining: 99, resetSeconds: 60 }
  const state = { identities, rateLimit: { admit: async () => quota, admitCounted: async () => quota, release: () => {} } }
  const config = { rateLimitPerMinute: 100, statementTimeoutMs: 1000 } as Config
  const db = { one: async () => ({ failure: null, user_id: 'u' }) } as unknown as DatabaseTransactionConnection

  const known = authentication.createKnownCredentialCheck(config, authentication.bearerCredential, state)
  const authenticate = authentication.createAuthenticator(config, authentication.bearerCredential, state)
  const req = { headers: { authorization: `Bearer ${token}` } } as unknown as IncomingMessage
  hashes = 0
  t.ok(known(req), 'the credential is known')
  const caller = await authenticate(db, req, 'request-1')
  t.equal(caller.userId, 'u', 'the cached identity was resumed')
  t.equal(hashes, 1, 'one hash for the request')

  // Another request with the same token is hashed again: the hash belongs to its request.
  const next = { headers: { authorization: `Bearer ${token}` } } as unknown as IncomingMessage
  await authenticate(db, next, 'request-2')
  t.equal(hashes, 2)
})
