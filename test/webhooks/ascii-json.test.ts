import t from 'tap'
import { asciiJson, escapeNonAscii } from '../../src/webhooks/ascii-json.ts'
import { deliveryBody } from '../../src/webhooks/delivery-body.ts'

t.test('every non-ASCII character becomes a lower-case \\u escape', async (t) => {
  t.equal(asciiJson({ name: 'Zoë' }), '{"name":"Zo\\u00eb"}')
  t.equal(asciiJson('€ 日本'), '"\\u20ac \\u65e5\\u672c"')
  t.equal(asciiJson({ clé: 1 }), '{"cl\\u00e9":1}', 'keys too')
  t.equal(asciiJson('\u0080\u00ff\uffff'), '"\\u0080\\u00ff\\uffff"', 'range edges')
  t.equal(asciiJson('plain ~\u007f'), '"plain ~\u007f"', 'ASCII including DEL stays as it is')
})

t.test('characters beyond U+FFFF are written as surrogate pairs', async (t) => {
  t.equal(asciiJson('😀'), '"\\ud83d\\ude00"')
  t.equal(asciiJson({ reaction: 'ok 👍🏽' }), '{"reaction":"ok \\ud83d\\udc4d\\ud83c\\udffd"}')
  t.equal(asciiJson('\ud800'), '"\\ud800"', 'a lone surrogate stays an escape')
})

t.test('the output is pure ASCII and parses back to the same value', async (t) => {
  const value = { text: 'Grüße, 你好, مرحبا, 😀🎉', list: [1, 'ä', null, true, { nested: 'ß' }], quote: '"\\\n\t', n: 1.5 }
  const json = asciiJson(value)
  t.match(json, /^[\x00-\x7f]*$/)
  t.ok(Buffer.from(json, 'utf8').every((byte) => byte < 0x80))
  t.same(JSON.parse(json), value)
  t.equal(asciiJson({ a: [1, 2] }), JSON.stringify({ a: [1, 2] }), 'ASCII input matches JSON.stringify')
})

t.test('values JSON cannot represent are refused', async (t) => {
  t.throws(() => asciiJson(undefined), TypeError)
  t.throws(() => asciiJson(() => 1), TypeError)
})

t.test('JSON text written elsewhere gets the same escapes; ASCII text comes back as it is', async (t) => {
  const ascii = '{"a": "plain", "b": [1, 2]}'
  t.equal(escapeNonAscii(ascii), ascii)
  t.equal(escapeNonAscii('{"name": "Zoë 😀"}'), '{"name": "Zo\\u00eb \\ud83d\\ude00"}')
})

t.test('a delivery body: head, the moment of the attempt, tail, as pure ASCII bytes', async (t) => {
  const deliveredAt = new Date('2026-11-22T03:00:21.123Z')
  const parts = { body_head: '{"id":"e1","delivered_at":"', body_tail: '","data": {"object": {"name": "Zoë"}}}' }
  const body = deliveryBody(parts, deliveredAt)
  t.ok(
    body.every((byte) => byte < 0x80),
    'pure ASCII',
  )
  t.equal(body.toString('latin1'), '{"id":"e1","delivered_at":"2026-11-22T03:00:21.123Z","data": {"object": {"name": "Zo\\u00eb"}}}')
  t.same(JSON.parse(body.toString('utf8')), { id: 'e1', delivered_at: '2026-11-22T03:00:21.123Z', data: { object: { name: 'Zoë' } } })
  const plain = deliveryBody({ body_head: '{"delivered_at":"', body_tail: '"}' }, deliveredAt)
  t.equal(plain.toString(), '{"delivered_at":"2026-11-22T03:00:21.123Z"}')
})
