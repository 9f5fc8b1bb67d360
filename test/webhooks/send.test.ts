import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import { createServer as createTlsServer } from 'node:https'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createSecureContext, type SecureContext } from 'node:tls'
import t from 'tap'
import { parseCidrList } from '../../src/cidr.ts'
import type { AddressPolicy } from '../../src/webhooks/address-guard.ts'
import { closeWebhookConnections, EXCERPT_BYTES, sendSignedWebhook } from '../../src/webhooks/send.ts'
import { verifySignature } from '../../src/webhooks/signature.ts'

const SECRET = 'whsec_test-secret'
const DELIVERY_ID = '0190a6f4-0000-7000-8000-000000000001'

type Received = { method: string; url: string; headers: IncomingMessage['headers']; body: Buffer; remotePort: number }

async function listen(server: Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return (server.address() as AddressInfo).port
}

const received: Received[] = []
const receiver = createServer(async (req: IncomingMessage, res: ServerResponse) => {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk)
  received.push({
    method: req.method!,
    url: req.url!,
    headers: req.headers,
    body: Buffer.concat(chunks),
    remotePort: req.socket.remotePort!,
  })
  switch (new URL(req.url!, 'http://receiver').pathname) {
    case '/ok':
      res.writeHead(200, { 'content-type': 'text/plain' }).end('thanks')
      return
    case '/no-content':
      res.writeHead(204).end()
      return
    case '/fail':
      res.writeHead(500).end('x'.repeat(EXCERPT_BYTES) + 'this part is cut off')
      return
    case '/huge':
      res.writeHead(200)
      res.end(Buffer.alloc(1024 * 1024, 'y'))
      return
    case '/split-character':
      // "é" is two bytes; the excerpt boundary falls between them.
      res.writeHead(502).end(Buffer.concat([Buffer.alloc(EXCERPT_BYTES - 1, 'a'), Buffer.from('é and more')]))
      return
    case '/nul':
      res.writeHead(400).end(Buffer.from('bad\u0000input', 'utf8'))
      return
    case '/redirect':
      res.writeHead(302, { location: '/redirect-target' }).end('moved')
      return
    case '/redirect-no-location':
      res.writeHead(307).end()
      return
    case '/hang':
      return
    case '/cut-off':
      // Headers and part of the body, then the connection is gone.
      res.writeHead(200, { 'content-length': '100' })
      res.write('partial', () => res.destroy())
      return
    case '/slow-body':
      res.writeHead(200, { 'content-length': '100' })
      res.write('partial')
      return
    default:
      res.writeHead(404).end('not here')
  }
})

let port = 0
let closedPort = 0
const resolverCalls: string[] = []
const policy: AddressPolicy = {
  allowHttp: true,
  allowedCidrs: parseCidrList('127.0.0.0/8'),
  resolve: async (host) => {
    resolverCalls.push(host)
    if (host === 'receiver.test' || /^r\d+\.test$/.test(host)) return ['127.0.0.1']
    if (host === 'slow-dns.test') return new Promise(() => {})
    throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' })
  },
}

t.before(async () => {
  port = await listen(receiver)
  const probe = createServer()
  closedPort = await listen(probe)
  await new Promise((resolve) => probe.close(resolve))
})
t.teardown(async () => {
  await closeWebhookConnections()
  receiver.closeAllConnections()
  await new Promise((resolve) => receiver.close(resolve))
})

const send = (path: string, options: { timeoutMs?: number; host?: string; body?: string | Buffer } = {}) =>
  sendSignedWebhook({
    url: `http://${options.host ?? '127.0.0.1'}:${path.startsWith('/') ? port : closedPort}${path.startsWith('/') ? path : '/' + path}`,
    policy,
    id: DELIVERY_ID,
    secrets: [SECRET],
    body: options.body ?? '{"event":"ping"}',
    headers: { 'x-service-event': 'ping' },
    timeoutMs: options.timeoutMs,
  })

t.test('2xx is a success, signed over the exact body bytes', async (t) => {
  received.length = 0
  const attempt = await send('/ok', { body: Buffer.from('{"name":"Zo\\u00eb"}') })
  t.match(attempt, { status: 200, error: null, bodyExcerpt: 'thanks', detail: null })
  t.type(attempt.durationMs, 'number')
  t.ok(attempt.durationMs >= 0)
  const [request] = received
  t.equal(request.method, 'POST')
  t.equal(request.headers['content-type'], 'application/json')
  t.equal(request.headers['x-service-event'], 'ping')
  t.equal(request.body.toString(), '{"name":"Zo\\u00eb"}')
  t.ok(verifySignature(String(request.headers['x-service-signature']), request.body, SECRET), 'the receiver can verify the signature')

  t.match(await send('/no-content'), { status: 204, error: null, bodyExcerpt: '' })
})

t.test('the connection goes to the checked address, with the original name in Host', async (t) => {
  received.length = 0
  resolverCalls.length = 0
  const attempt = await send('/ok?subscription=1', { host: 'receiver.test' })
  t.match(attempt, { status: 200, error: null })
  t.equal(received[0].headers.host, `receiver.test:${port}`)
  t.equal(received[0].url, '/ok?subscription=1')
  t.same(
    resolverCalls,
    ['receiver.test'],
    'resolved once, by the guard: receiver.test exists in no real DNS, so the connect used the pinned address',
  )
})

t.test('a host name is resolved and checked again at every attempt', async (t) => {
  resolverCalls.length = 0
  t.match(await send('/ok', { host: 'receiver.test' }), { status: 200 })
  t.match(await send('/ok', { host: 'receiver.test' }), { status: 200 })
  t.same(resolverCalls, ['receiver.test', 'receiver.test'])
})

t.test('keep-alive connections are reused across deliveries', async (t) => {
  received.length = 0
  for (let i = 0; i < 10; i++) await send('/ok')
  // undici may open a second socket when the next request arrives just before the first socket
  // is marked free again; what matters is that sockets are not one per delivery.
  t.ok(new Set(received.map((request) => request.remotePort)).size <= 2)
})

t.test('non-2xx answers are http_status with a 2 KiB excerpt', async (t) => {
  const attempt = await send('/fail')
  t.match(attempt, { status: 500, error: 'http_status', detail: 'HTTP 500' })
  t.equal(attempt.bodyExcerpt, 'x'.repeat(EXCERPT_BYTES))

  const split = await send('/split-character')
  t.equal(split.bodyExcerpt, 'a'.repeat(EXCERPT_BYTES - 1), 'a character cut at the boundary is dropped, not garbled')

  t.match(await send('/nul'), { status: 400, error: 'http_status', bodyExcerpt: 'bad\ufffdinput' })
  t.match(await send('/missing'), { status: 404, error: 'http_status', bodyExcerpt: 'not here' })
})

t.test('a huge body is cut off after the excerpt and the rest is not kept', async (t) => {
  const attempt = await send('/huge')
  t.match(attempt, { status: 200, error: null })
  t.equal(attempt.bodyExcerpt, 'y'.repeat(EXCERPT_BYTES))
  t.match(await send('/ok'), { status: 200, error: null }, 'the next delivery still works')
})

t.test('redirects are not followed', async (t) => {
  received.length = 0
  const attempt = await send('/redirect')
  t.match(attempt, { status: 302, error: 'redirect', bodyExcerpt: 'moved', detail: /redirect to \/redirect-target was not followed/ })
  t.same(
    received.map((request) => request.url),
    ['/redirect'],
  )
  t.match(await send('/redirect-no-location'), { status: 307, error: 'redirect', detail: /no Location header/ })
})

t.test('timeouts', async (t) => {
  const hanging = await send('/hang', { timeoutMs: 150 })
  t.match(hanging, { status: null, error: 'timeout', bodyExcerpt: null, detail: /within 150 ms/ })
  t.ok(hanging.durationMs >= 140 && hanging.durationMs < 2000, `took ${hanging.durationMs} ms`)

  const slowBody = await send('/slow-body', { timeoutMs: 150 })
  t.match(slowBody, { status: 200, error: 'timeout', bodyExcerpt: 'partial' }, 'headers alone are not an answer')

  const slowDns = await send('/ok', { host: 'slow-dns.test', timeoutMs: 100 })
  t.match(slowDns, { status: null, error: 'timeout' }, 'a resolver that never answers counts against the deadline')
})

t.test('an answer cut off before its body is complete is not a success', async (t) => {
  const attempt = await send('/cut-off')
  t.match(attempt, { status: 200, error: 'connection_refused', bodyExcerpt: 'partial' })
  t.match(await send('/ok'), { status: 200, error: null }, 'the next delivery still works')
})

t.test('a closed port is connection_refused', async (t) => {
  const attempt = await send('closed')
  t.match(attempt, { status: null, error: 'connection_refused', bodyExcerpt: null, detail: /ECONNREFUSED/ })
})

t.test('the guard runs again before dialling', async (t) => {
  received.length = 0
  t.match(await send('/ok', { host: 'unknown.test' }), { status: null, error: 'dns_failed', detail: /could not be resolved \(ENOTFOUND\)/ })
  t.match(await send('/ok', { host: '10.0.0.1' }), { status: null, error: 'address_refused', detail: 'address 10.0.0.1 is private' })
  const strict = await sendSignedWebhook({
    url: `http://127.0.0.1:${port}/ok`,
    policy: { allowHttp: true, allowedCidrs: [] },
    id: DELIVERY_ID,
    secrets: [SECRET],
    body: '{}',
  })
  t.match(strict, { error: 'address_refused', detail: 'address 127.0.0.1 is loopback' })
  t.same(received, [], 'nothing was sent')
})

t.test('many distinct targets do not grow the connection cache without bound', async (t) => {
  const attempts = await Promise.all(
    Array.from({ length: 300 }, (_, index) =>
      sendSignedWebhook({ url: `http://r${index}.test:${closedPort}/`, policy, id: DELIVERY_ID, secrets: [SECRET], body: '{}' }),
    ),
  )
  t.ok(attempts.every((attempt) => attempt.error === 'connection_refused'))
  t.match(await send('/ok'), { status: 200 }, 'delivery still works after evictions')
})

// The certificate is made locally with the openssl CLI; without it the TLS test is skipped.
function selfSignedCertificate(commonName: string): { key: Buffer; cert: Buffer } | null {
  const directory = mkdtempSync(join(tmpdir(), 'webhook-tls-'))
  try {
    const keyPath = join(directory, 'key.pem')
    const certPath = join(directory, 'cert.pem')
    execFileSync(
      'openssl',
      ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', `/CN=${commonName}`, '-keyout', keyPath, '-out', certPath],
      { stdio: 'ignore' },
    )
    return { key: readFileSync(keyPath), cert: readFileSync(certPath) }
  } catch {
    return null
  } finally {
    rmSync(directory, { recursive: true, force: true })
  }
}

const credentials = selfSignedCertificate('receiver.test')

t.test(
  'an untrusted certificate is tls_error, and SNI carries the original host name',
  { skip: credentials === null && 'openssl is not available' },
  async (t) => {
    const serverNames: string[] = []
    const context = createSecureContext(credentials!)
    const SNICallback = (serverName: string, done: (error: Error | null, context: SecureContext) => void) => {
      serverNames.push(serverName)
      done(null, context)
    }
    const tlsServer = createTlsServer({ ...credentials, SNICallback }, (_req, res) => res.end('ok'))
    const tlsPort = await listen(tlsServer)
    t.teardown(() => new Promise((resolve) => tlsServer.close(resolve)))

    const attempt = await sendSignedWebhook({
      url: `https://receiver.test:${tlsPort}/`,
      policy,
      id: DELIVERY_ID,
      secrets: [SECRET],
      body: '{}',
    })
    t.match(attempt, { status: null, error: 'tls_error', detail: /self-signed|SELF_SIGNED/i })
    t.same(serverNames, ['receiver.test'], 'the ClientHello named receiver.test')

    const plainOverTls = await sendSignedWebhook({
      url: `https://127.0.0.1:${port}/ok`,
      policy,
      id: DELIVERY_ID,
      secrets: [SECRET],
      body: '{}',
    })
    t.match(plainOverTls, { status: null, error: 'tls_error' }, 'https to a plain-http port')
  },
)
