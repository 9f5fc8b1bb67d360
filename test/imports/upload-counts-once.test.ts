// An upload counts once against the rate limit. It authenticates twice (a short transaction before
// its body is received, then the import's own), and the second reuses the first's caller without
// counting it again: RateLimit-Remaining moves by exactly one across an upload, whether the upload
// is the token's first request (crm.authenticate counts it) or a cached identity's (the process
// counts it).
import t from 'tap'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { upload } from './helpers.ts'

const server = await startTestServer(t, { env: { RATE_LIMIT_PER_MINUTE: '1000' } })
const tenant = await createTenant(server.databaseUrl, { slug: 'counted', members: { 'ada@counted.test': 'admin' } })
const ada = tenant.members['ada@counted.test']

const remaining = (response: { headers: Headers }) => Number(response.headers.get('ratelimit-remaining'))

/**
 * The remaining quota after a GET with `ada.token`, an upload with the token `uploadToken` answers,
 * and a GET with ada.token again; the rate limit counts per user, whatever the token. All in one
 * rate-limit window: a sequence that crossed into the next minute (the quota rose) is run again.
 */
async function quotas(uploadToken: () => Promise<string>): Promise<number[]> {
  for (;;) {
    const bearer = await uploadToken()
    const seen = [remaining(await server.request('GET', '/api/me', { token: ada.token }))]
    const uploaded = await upload(server, bearer, 'contacts', 'first_name,email\nAda,ada@example.com\n')
    if (uploaded.status !== 201) throw new Error(`upload answered ${uploaded.status}: ${uploaded.text}`)
    seen.push(remaining(uploaded))
    seen.push(remaining(await server.request('GET', '/api/me', { token: ada.token })))
    if (seen[1] < seen[0] && seen[2] < seen[1]) return seen
  }
}

t.test("a cached identity's upload moves the remaining quota by one", async (t) => {
  const [before, afterUpload, afterGet] = await quotas(async () => ada.token)
  t.equal(before - afterUpload, 1, 'the upload counted once')
  t.equal(afterUpload - afterGet, 1, 'and the next request once')
})

t.test("a token's first request, an upload, counts once", async (t) => {
  const [before, afterUpload, afterGet] = await quotas(() => withOwner(server.databaseUrl, (client) => mintToken(client, ada.id)))
  t.equal(before - afterUpload, 1, 'the upload counted once')
  t.equal(afterUpload - afterGet, 1, 'and the next request once')
})
