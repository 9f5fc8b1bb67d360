// Links the service sends are built from PUBLIC_BASE_URL, never from the request's Host; in
// production the service refuses to start without it.
import { request as httpRequest } from 'node:http'
import t from 'tap'
import { ConfigError, loadConfig } from '../../src/config.ts'
import { crm } from '../helpers/cli.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer, type TestServer } from '../helpers/server.ts'

/** POST /api/invitations with a Host header of the client's choosing (fetch cannot set Host). */
function invite(server: TestServer, token: string, email: string, host: string): Promise<{ status: number; body: any }> {
  const body = JSON.stringify({ email, role: 'member' })
  const url = new URL(server.url)
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: url.hostname,
        port: url.port,
        path: '/api/invitations',
        method: 'POST',
        headers: { host, authorization: `Bearer ${token}`, 'content-type': 'application/json', 'x-forwarded-proto': 'https' },
      },
      (res) => {
        let text = ''
        res.on('data', (chunk) => (text += chunk))
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) }))
      },
    )
    req.on('error', reject)
    req.end(body)
  })
}

t.test('without PUBLIC_BASE_URL the accept link points at the listening address, not at the Host', async (t) => {
  const server = await startTestServer(t)
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@links.test': 'admin' } })
  const created = await invite(server, tenant.members['admin@links.test'].token, 'one@links.test', 'evil.example')
  t.equal(created.status, 201)
  t.match(created.body.data.accept_url, new RegExp(`^${server.url.replaceAll('.', '\\.')}/invitations/accept\\?token=`))
})

t.test('with PUBLIC_BASE_URL the accept link uses it whatever the Host says', async (t) => {
  const server = await startTestServer(t, { env: { PUBLIC_BASE_URL: 'https://crm.example.com' } })
  const tenant = await createTenant(server.databaseUrl, { members: { 'admin@links.test': 'admin' } })
  const created = await invite(server, tenant.members['admin@links.test'].token, 'two@links.test', 'evil.example')
  t.equal(created.status, 201)
  t.match(created.body.data.accept_url, /^https:\/\/crm\.example\.com\/invitations\/accept\?token=/)
})

t.test('NODE_ENV=production without PUBLIC_BASE_URL refuses to start, in one line', async (t) => {
  const error = t.throws(() =>
    loadConfig({ NODE_ENV: 'production', APP_SECRET: 'x'.repeat(40) }, { dataDir: t.testdir() }),
  ) as unknown as ConfigError
  t.type(error, ConfigError)
  t.match(error.problems, [/^PUBLIC_BASE_URL: required when NODE_ENV=production/])
  t.equal(error.problems.length, 1)
  const serve = crm('postgres://nobody@127.0.0.1:1/none', ['serve', '--no-worker'], {
    NODE_ENV: 'production',
    PORT: '0',
    CRM_DATA_DIR: t.testdir(),
  })
  t.not(serve.status, 0, 'a non-zero exit')
  const lines = serve.stderr.trim().split('\n')
  t.equal(lines.length, 1, serve.stderr)
  t.match(lines[0], /PUBLIC_BASE_URL: required when NODE_ENV=production/)
})
