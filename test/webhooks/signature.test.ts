import { createHmac } from 'node:crypto'
import fc from 'fast-check'
import t from 'tap'
import {
  computeSignature,
  newWebhookSecret,
  signatureHeader,
  standardSignatureHeader,
  standardWebhooksKey,
  verifySignature,
  webhookSigningKey,
} from '../../src/webhooks/signature.ts'
import { everyVerifierAccepts, standardWebhooksVerify, stripeVerifyHeader } from './verifiers.ts'

t.test('known-answer vector from the API spec', async (t) => {
  const expected = '1b3d69df55f1e52f05224ba94a5162abeb17ef52cd7f4948c390f810d6a87e98'
  t.equal(computeSignature('secret', 1636936200, 'hello !'), expected)
  t.equal(computeSignature(webhookSigningKey('secret'), 1636936200, Buffer.from('hello !')), expected)
  t.equal(signatureHeader(['secret'], 1636936200, 'hello !'), `t=1636936200,v1=${expected}`)
})

t.test('new secrets are whsec_ plus 32 random bytes in standard base64, used whole as the X-Service-Signature key', async (t) => {
  const secret = newWebhookSecret()
  t.match(secret, /^whsec_[A-Za-z0-9+/]{43}=$/)
  t.equal(Buffer.from(secret.slice(6), 'base64').length, 32)
  t.not(newWebhookSecret(), secret)
  const byHand = createHmac('sha256', Buffer.from(secret, 'utf8')).update('1.{}').digest('hex')
  t.equal(computeSignature(secret, 1, '{}'), byHand)
})

t.test('during rotation the header carries the new signature first, then the old one', async (t) => {
  const header = signatureHeader(['new-secret', webhookSigningKey('old-secret')], 1700000000, '{"a":1}')
  const [timestamp, newer, older, ...rest] = header.split(',')
  t.equal(timestamp, 't=1700000000')
  t.equal(newer, `v1=${computeSignature('new-secret', 1700000000, '{"a":1}')}`)
  t.equal(older, `v1=${computeSignature('old-secret', 1700000000, '{"a":1}')}`)
  t.same(rest, [])
  t.ok(verifySignature(header, '{"a":1}', 'old-secret', { nowSeconds: 1700000000 }), 'a receiver still on the old secret accepts')
  t.ok(verifySignature(header, '{"a":1}', 'new-secret', { nowSeconds: 1700000000 }), 'a receiver on the new secret accepts')
})

t.test('signatureHeader rejects calls that could only produce a useless header', async (t) => {
  t.throws(() => signatureHeader([], 1, 'x'), /at least one secret/)
  t.throws(() => signatureHeader(['s'], 1.5, 'x'), /whole unix seconds/)
  t.throws(() => signatureHeader(['s'], -1, 'x'), /whole unix seconds/)
})

t.test('verifySignature', async (t) => {
  const body = Buffer.from('{"event":"contact.created"}')
  const now = 1_800_000_000
  const header = signatureHeader(['whsec_abc'], now, body)

  t.ok(verifySignature(header, body, 'whsec_abc', { nowSeconds: now }))
  t.ok(verifySignature(header, body.toString(), webhookSigningKey('whsec_abc'), { nowSeconds: now }))
  t.ok(verifySignature(header, body, ['other', 'whsec_abc'], { nowSeconds: now }), 'any of several secrets')
  t.ok(verifySignature(header, body, 'whsec_abc', { nowSeconds: now + 300 }), 'exactly at the 300 s tolerance')
  t.ok(verifySignature(header, body, 'whsec_abc', { nowSeconds: now - 300 }), 'clock skew the other way')
  t.notOk(verifySignature(header, body, 'whsec_abc', { nowSeconds: now + 301 }), 'too old')
  t.notOk(verifySignature(header, body, 'whsec_abc', { nowSeconds: now - 301 }), 'too far in the future')
  t.ok(verifySignature(header, body, 'whsec_abc', { nowSeconds: now + 1000, toleranceSeconds: 1000 }), 'custom tolerance')
  t.notOk(verifySignature(header, body, 'whsec_abd', { nowSeconds: now }), 'wrong secret')
  t.notOk(verifySignature(header, Buffer.from('{"event":"contact.created"} '), 'whsec_abc', { nowSeconds: now }), 'changed body')
  t.notOk(verifySignature(header.replace(`t=${now}`, `t=${now + 1}`), body, 'whsec_abc', { nowSeconds: now }), 'changed timestamp')
  t.notOk(verifySignature(`v1=${computeSignature('whsec_abc', now, body)}`, body, 'whsec_abc', { nowSeconds: now }), 'no timestamp')
  t.notOk(verifySignature(`t=${now}`, body, 'whsec_abc', { nowSeconds: now }), 'no signature')
  t.notOk(verifySignature(`t=${now},v1=abcd`, body, 'whsec_abc', { nowSeconds: now }), 'short signature is ignored')
  t.notOk(verifySignature('', body, 'whsec_abc', { nowSeconds: now }), 'empty header')
  t.ok(verifySignature(`${header}, v0=whatever`, body, 'whsec_abc', { nowSeconds: now }), 'unknown schemes and spaces are ignored')

  const fresh = signatureHeader(['whsec_abc'], Math.floor(Date.now() / 1000), body)
  t.ok(verifySignature(fresh, body, 'whsec_abc'), 'defaults to the current clock')
})

/** Both headers of one request, as the worker sends them. */
function signedRequest(secrets: string[], id: string, timestamp: number, body: string) {
  const raw = Buffer.from(body)
  return {
    raw,
    headers: {
      'x-service-signature': signatureHeader(secrets, timestamp, raw),
      'webhook-id': id,
      'webhook-timestamp': String(timestamp),
      'webhook-signature': standardSignatureHeader(secrets, id, timestamp, raw),
    },
  }
}

t.test('one secret keys both schemes: Stripe, standardwebhooks and svix verify every body, id and rotation', async () => {
  const now = Math.floor(Date.now() / 1000)
  fc.assert(
    fc.property(
      fc.uint8Array({ minLength: 32, maxLength: 32 }),
      fc.uint8Array({ minLength: 32, maxLength: 32 }),
      fc.uuid(),
      fc.json({ maxDepth: 2 }),
      (newKey, oldKey, id, body) => {
        const current = `whsec_${Buffer.from(newKey).toString('base64')}`
        const previous = `whsec_${Buffer.from(oldKey).toString('base64')}`
        const everyLibrary = { stripe: true, standardwebhooks: true, svix: true }
        const alone = signedRequest([current], id, now, body)
        const rotating = signedRequest([current, previous], id, now, body)
        return (
          JSON.stringify(everyVerifierAccepts(alone, current)) === JSON.stringify(everyLibrary) &&
          JSON.stringify(everyVerifierAccepts(rotating, current)) === JSON.stringify(everyLibrary) &&
          JSON.stringify(everyVerifierAccepts(rotating, previous)) === JSON.stringify(everyLibrary) &&
          (Buffer.compare(newKey, oldKey) === 0 || !standardWebhooksVerify(alone.raw, alone.headers, previous))
        )
      },
    ),
    { numRuns: 200 },
  )
})

t.test(
  'a secret issued in base64url before the rule keeps its X-Service-Signature, and keys webhook-signature with the same bytes',
  async (t) => {
    const bytes = Buffer.from('fb'.repeat(32), 'hex') // encodes with - and _ in base64url
    const legacy = `whsec_${bytes.toString('base64url')}`
    t.match(legacy, /[-_]/)
    const request = signedRequest([legacy], 'msg_1', Math.floor(Date.now() / 1000), '{"a":1}')
    t.ok(stripeVerifyHeader(request.raw, request.headers['x-service-signature'], legacy), 'Stripe with the secret as it was shown')
    t.equal(
      request.headers['x-service-signature'].split('v1=')[1],
      createHmac('sha256', legacy).update(`${request.headers['webhook-timestamp']}.{"a":1}`).digest('hex'),
      'keyed with the whole string, as before',
    )
    t.same(standardWebhooksKey(legacy).export(), bytes, 'the Standard Webhooks key is the 32 bytes it encodes')
    t.ok(
      standardWebhooksVerify(request.raw, request.headers, `whsec_${bytes.toString('base64')}`),
      'standardwebhooks verifies it with the same bytes written in standard base64',
    )
    t.throws(() => standardWebhooksKey('whsec_'), /base64 key bytes/)
  },
)
