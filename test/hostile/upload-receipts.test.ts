// Nothing is received for an unknown token: an upload's body is written to a temporary file only
// after its caller is authenticated and holds the workspace's upload slot; an unknown or revoked
// bearer gets 401 and no temporary file is ever created. Receipts are bounded per client address
// (429) and in total (503), and the temporary files together under UPLOAD_TEMP_BYTES (503), each
// refusal with Retry-After; what a finished upload held is given back.
import { type FSWatcher, mkdtempSync, readdirSync, watch } from 'node:fs'
import { request as httpRequest } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { UPLOAD_DIRECTORY_PREFIX } from '../../src/http/body.ts'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

// The server runs in this process: its temporary files go to a directory of this test alone.
const uploadsRoot = mkdtempSync(join(tmpdir(), 'upload-receipts-test-'))
process.env.TMPDIR = uploadsRoot
t.teardown(() => {
  delete process.env.TMPDIR
})

/** Every upload directory created under the root, in order, as inotify reports them. */
const created: string[] = []
const watcher: FSWatcher = watch(uploadsRoot, (_event, name) => {
  if (name?.startsWith(UPLOAD_DIRECTORY_PREFIX) && !created.includes(name)) created.push(name)
})
t.teardown(() => watcher.close())

const uploadDirectories = () => readdirSync(uploadsRoot).filter((name) => name.startsWith(UPLOAD_DIRECTORY_PREFIX))

async function until(condition: () => boolean, what: string): Promise<void> {
  const started = Date.now()
  while (!condition()) {
    if (Date.now() - started > 30_000) throw new Error(`still waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

const server = await startTestServer(t, {
  env: { TRUST_PROXY: '127.0.0.1/32,::1/128', UPLOADS_PER_ADDRESS: '1', UPLOADS_TOTAL: '2', UPLOAD_TEMP_BYTES: String(64 * 1024) },
})
const tenant = await createTenant(server.databaseUrl, {
  members: { 'ada@receipts.test': 'admin', 'rev@receipts.test': 'admin', 'reader@receipts.test': 'read_only' },
})
const token = tenant.members['ada@receipts.test'].token
const revokedToken = tenant.members['rev@receipts.test'].token
const readerToken = tenant.members['reader@receipts.test'].token

const BOUNDARY = 'receiptsboundary'
const head = Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.csv"\r\nContent-Type: text/csv\r\n\r\n`)
const tail = Buffer.from(`\r\n--${BOUNDARY}--\r\n`)
const multipart = (csv: Buffer) => Buffer.concat([head, csv, tail])
const csvOf = (bytes: number) => Buffer.from(`Email\n${'a@example.com\n'.repeat(Math.ceil(bytes / 14))}`)

type Answer = { status: number; headers: Record<string, string | string[] | undefined>; body: any }

/** The import wizard's browser: a session cookie and the CSRF token its upload form carries. */
const session = await withOwner(server.databaseUrl, (client) =>
  mintToken(client, tenant.members['ada@receipts.test'].id, { kind: 'session' }),
)
const wizard = { cookie: `crm_session=${session}`, csrf: '' }
wizard.csrf =
  /name="csrf" value="([^"]+)"/.exec(
    await (await fetch(`${server.url}/contacts/import`, { headers: { cookie: wizard.cookie } })).text(),
  )?.[1] ?? ''

/**
 * An upload sent over its own connection: `first` bytes of the body now, the rest on `finish`;
 * without `declared`, the body goes chunked (no Content-Length). `byWizard`: sent by the import
 * wizard's form (its page answers HTML) instead of to the API.
 */
function upload(options: { body: Buffer; first?: number; forwardedFor?: string; bearer?: string; declared?: boolean; byWizard?: boolean }) {
  const { body, first = body.length, forwardedFor = '198.51.100.1', bearer = token, declared = true, byWizard = false } = options
  const target = byWizard ? `/contacts/import?${new URLSearchParams({ csrf: wizard.csrf })}` : '/api/contacts/import/upload'
  const req = httpRequest(`${server.url}${target}`, {
    method: 'POST',
    headers: {
      ...(byWizard ? { cookie: wizard.cookie } : { authorization: `Bearer ${bearer}` }),
      'content-type': `multipart/form-data; boundary=${BOUNDARY}`,
      'x-forwarded-for': forwardedFor,
      ...(declared ? { 'content-length': String(body.length) } : {}),
    },
  })
  const answer = new Promise<Answer>((resolve, reject) => {
    req.on('response', (response) => {
      const chunks: Buffer[] = []
      response.on('data', (chunk: Buffer) => chunks.push(chunk))
      response.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8')
        const json = text && /json/.test(response.headers['content-type'] ?? '')
        resolve({ status: response.statusCode ?? 0, headers: response.headers, body: json ? JSON.parse(text) : text })
      })
    })
    // A refusal may close the connection while the rest of the body is still being written.
    req.on('error', (error) => (req.writableEnded ? undefined : reject(error)))
  })
  req.write(body.subarray(0, first))
  const finish = () => {
    req.end(body.subarray(first))
    return answer
  }
  if (first === body.length) req.end()
  return { answer, finish }
}

t.test(
  'an unknown or revoked bearer (401) or a role without the import grant (403) sends a 10 MiB upload, and no temporary file is created',
  async (t) => {
    t.equal((await server.request('DELETE', '/api/tokens', { token: revokedToken })).status, 204)
    const tenMiB = multipart(csvOf(10 * 1024 * 1024))
    for (const [bearer, status, code] of [
      [`crm_${'A'.repeat(43)}`, 401, 'token_invalid'],
      [revokedToken, 401, 'token_revoked'],
      [readerToken, 403, 'forbidden'],
    ] as const) {
      const refused = await upload({ body: tenMiB, bearer }).answer
      t.equal(refused.status, status, code)
      t.equal(refused.body.code, code)
    }
    // inotify reports in order: once an accepted upload's directory is seen, any directory made for
    // the refused ones would have been reported before it.
    const accepted = await upload({ body: multipart(csvOf(100)) }).answer
    t.equal(accepted.status, 201)
    await until(() => created.length > 0, "the accepted upload's directory")
    t.equal(created.length, 1, 'only the accepted upload had a temporary directory')
    t.same(uploadDirectories(), [], 'and it is gone')
  },
)

t.test('receipts are bounded per address (429) and in total (503), and given back', async (t) => {
  const body = multipart(csvOf(1000))
  const first = upload({ body, first: 100, forwardedFor: '203.0.113.1' })
  await until(() => uploadDirectories().length === 1, 'the first upload to be received')

  const sameAddress = await upload({ body, forwardedFor: '203.0.113.1' }).answer
  t.equal(sameAddress.status, 429)
  t.equal(sameAddress.body.code, 'rate_limited')
  t.ok(Number(sameAddress.headers['retry-after']) > 0, 'with Retry-After')

  const second = upload({ body, first: 100, forwardedFor: '203.0.113.2' })
  await until(() => uploadDirectories().length === 2, 'the second upload to be received')
  const third = await upload({ body, forwardedFor: '203.0.113.3' }).answer
  t.equal(third.status, 503, 'past the total')
  t.equal(third.body.code, 'unavailable')
  t.ok(Number(third.headers['retry-after']) > 0, 'with Retry-After')

  t.equal((await first.finish()).status, 201)
  t.equal((await second.finish()).status, 201)
  t.equal((await upload({ body, forwardedFor: '203.0.113.1' }).answer).status, 201, 'the address and the total have their receipts back')
})

t.test('temporary files are bounded together: a declared or an arriving body past the cap is 503', async (t) => {
  const tooBig = multipart(csvOf(80 * 1024))
  const declared = await upload({ body: tooBig }).answer
  t.equal(declared.status, 503, 'a declared length past the cap')
  t.match(declared.body.detail, /space for them/)
  const chunked = await upload({ body: tooBig, declared: false }).answer
  t.equal(chunked.status, 503, 'a chunked body that grows past the cap')
  await until(() => uploadDirectories().length === 0, 'the partial file to be removed')

  // Two bodies that fit one at a time but not together.
  const half = multipart(csvOf(40 * 1024))
  const holding = upload({ body: half, first: half.length - 10, forwardedFor: '203.0.113.4' })
  await until(() => uploadDirectories().length === 1, 'the first body to be received')
  const together = await upload({ body: half, forwardedFor: '203.0.113.5' }).answer
  t.equal(together.status, 503, 'the second does not fit beside the first')
  t.equal((await holding.finish()).status, 201)
  t.equal((await upload({ body: half, forwardedFor: '203.0.113.5' }).answer).status, 201, 'the bytes were given back')
})

t.test('an IPv6 client counts by its /64, as for the per-address rate limit', async (t) => {
  const body = multipart(csvOf(1000))
  const held = upload({ body, first: 100, forwardedFor: '2001:db8:1:2::1' })
  await until(() => uploadDirectories().length === 1, 'the held upload to be received')
  const neighbour = await upload({ body, forwardedFor: '2001:db8:1:2:ffff::9' }).answer
  t.equal(neighbour.status, 429, 'another address of the same /64 shares its bound')
  t.equal((await held.finish()).status, 201)
})

t.test("the import wizard's upload holds the API's upload receipts: one bound per address and one cap on the files for both", async (t) => {
  t.ok(wizard.csrf, 'the wizard page carries its CSRF token')
  const body = multipart(csvOf(1000))
  const wizardFirst = upload({ body, first: 100, forwardedFor: '203.0.113.7', byWizard: true })
  await until(() => uploadDirectories().length === 1, "the wizard's upload to be received")
  const apiBeside = await upload({ body, forwardedFor: '203.0.113.7' }).answer
  t.equal(apiBeside.status, 429, "an API upload from the address of the wizard's is past the address's bound")
  t.equal((await wizardFirst.finish()).status, 303, "the wizard's upload lands on its mapping")

  const apiFirst = upload({ body, first: 100, forwardedFor: '203.0.113.8' })
  await until(() => uploadDirectories().length === 1, "the API's upload to be received")
  const wizardBeside = await upload({ body, forwardedFor: '203.0.113.8', byWizard: true }).answer
  t.equal(wizardBeside.status, 429, 'a wizard upload beside an API upload of its address is past the bound')
  t.match(wizardBeside.body, /Too many requests/, 'said on an HTML page')
  t.equal((await apiFirst.finish()).status, 201)

  const tooBig = await upload({ body: multipart(csvOf(80 * 1024)), forwardedFor: '203.0.113.9', byWizard: true }).answer
  t.equal(tooBig.status, 503, "a wizard upload past the temporary files' cap")
  t.ok(Number(tooBig.headers['retry-after']) > 0, 'with Retry-After')
  t.match(tooBig.body, /space for them/)
  t.equal((await upload({ body, forwardedFor: '203.0.113.7', byWizard: true }).answer).status, 303, 'the receipts were given back')
  await until(() => uploadDirectories().length === 0, 'every temporary file to be removed')
})
