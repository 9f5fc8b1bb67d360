// An upload counts once against the rate limit. It authenticates twice (a short transaction before
// its body is received, then the import's own), and the second reuses the first's caller without
// counting it again: RateLimit-Remaining moves by exactly one across an upload, whether the upload
// is the token's first request (crm.authenticate counts it) or a cached identity's (the process
// counts it).
import { mkdtempSync, readdirSync } from 'node:fs'
import { request as httpRequest } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { UPLOAD_DIRECTORY_PREFIX } from '../../src/http/body.ts'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { upload } from './helpers.ts'

// The server runs in this process: its temporary files go to a directory of this test alone.
const uploadsRoot = mkdtempSync(join(tmpdir(), 'upload-counts-once-'))
process.env.TMPDIR = uploadsRoot
t.teardown(() => {
  delete process.env.TMPDIR
})
const uploadDirectories = () => readdirSync(uploadsRoot).filter((name) => name.startsWith(UPLOAD_DIRECTORY_PREFIX))

async function until(condition: () => boolean, what: string): Promise<void> {
  const started = Date.now()
  while (!condition()) {
    if (Date.now() - started > 30_000) throw new Error(`still waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

const server = await startTestServer(t, { env: { RATE_LIMIT_PER_MINUTE: '1000' } })
const tenant = await createTenant(server.databaseUrl, { slug: 'counted', members: { 'ada@counted.test': 'admin' } })
const ada = tenant.members['ada@counted.test']

const remaining = (response: { headers: Headers }) => Number(response.headers.get('ratelimit-remaining'))

/** An upload whose last bytes are sent on `finish`; answers its status and RateLimit-Remaining. */
function heldUpload(bearer: string) {
  const boundary = 'heldboundary'
  const body = Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.csv"\r\nContent-Type: text/csv\r\n\r\nfirst_name,email\nAda,ada@example.com\n\r\n--${boundary}--\r\n`,
  )
  const req = httpRequest(`${server.url}/api/contacts/import/upload`, {
    method: 'POST',
    agent: false,
    headers: {
      authorization: `Bearer ${bearer}`,
      'content-type': `multipart/form-data; boundary=${boundary}`,
      'content-length': String(body.length),
    },
  })
  const answer = new Promise<{ status: number }>((resolve, reject) => {
    req.on('response', (response) => {
      response.resume()
      response.on('end', () => resolve({ status: response.statusCode ?? 0 }))
    })
    req.on('error', reject)
  })
  req.write(body.subarray(0, 20))
  return {
    finish: () => {
      req.end(body.subarray(20))
      return answer
    },
  }
}

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

t.test('an upload whose cached identity goes stale while its body arrives counts once', async (t) => {
  // The body is held back until the first transaction has authenticated and committed (its
  // temporary directory exists), then the membership's access version moves: the import's
  // transaction finds the cached identity stale and authenticates in full.
  for (;;) {
    const before = remaining(await server.request('GET', '/api/me', { token: ada.token }))
    const held = heldUpload(ada.token)
    await until(() => uploadDirectories().length === 1, 'the upload to be received')
    await withOwner(server.databaseUrl, (client) =>
      client.query('update crm.memberships set access_version = 0 where workspace_id = $1 and user_id = $2', [tenant.id, ada.id]),
    )
    const uploaded = await held.finish()
    t.equal(uploaded.status, 201)
    const after = remaining(await server.request('GET', '/api/me', { token: ada.token }))
    if (after >= before) continue // the minute ended meanwhile
    t.equal(before - after, 2, 'the upload and the GET after it, one each')
    return
  }
})
