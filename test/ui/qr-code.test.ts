// The QR encoder: sizes by length at level M, and, where zbarimg (zbar-tools) is installed, an
// independent decoder reads back every text, across versions 1 to 40 and multi-byte UTF-8.
import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { encodeQr, qrSvg } from '../../src/ui/qr-code.ts'

t.test('the smallest version that holds the text (byte mode, level M)', async (t) => {
  // Level M byte capacities: v1 14, v2 26, v10 213, v40 2331.
  t.equal(encodeQr('x'.repeat(14)).version, 1)
  t.equal(encodeQr('x'.repeat(15)).version, 2)
  t.equal(encodeQr('x'.repeat(213)).version, 10)
  t.equal(encodeQr('x'.repeat(214)).version, 11)
  t.equal(encodeQr('x'.repeat(2331)).version, 40)
  t.throws(() => encodeQr('x'.repeat(2332)), /too long/)
  const code = encodeQr('hello')
  t.equal(code.size, 21)
  // Finder pattern corners are dark, their separators light.
  for (const [x, y] of [[0, 0], [20, 0], [0, 20]]) t.ok(code.dark(x, y), `finder at ${x},${y}`)
  t.notOk(code.dark(7, 7))
  t.ok(code.dark(8, code.size - 8), 'the dark module')
})

t.test('the SVG has a quiet zone, a label and no markup from the text', async (t) => {
  const svg = qrSvg('otpauth://totp/CRM:a%40b.c?secret=ABC&issuer=CRM', 'QR code <for> "you"')
  t.match(svg, /^<svg xmlns="http:\/\/www\.w3\.org\/2000\/svg" class="qr" viewBox="0 0 41 41"/, "version 3 (29 modules) plus 4 on each side")
  t.match(svg, /aria-label="QR code &#60;for&#62; &#34;you&#34;"/)
  t.notMatch(svg, /otpauth/, 'the text itself is not in the markup')
})

const zbar = spawnSync('zbarimg', ['--version']).status === 0
t.test('zbarimg decodes what the encoder writes', { skip: zbar ? false : 'zbarimg is not installed (apt-get install zbar-tools)' }, async (t) => {
  const directory = mkdtempSync(join(tmpdir(), 'crm-qr-'))
  t.teardown(() => rmSync(directory, { recursive: true, force: true }))
  const texts = [
    'a',
    'x'.repeat(14),
    'otpauth://totp/CRM:ada%40example.com?secret=JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP&issuer=CRM',
    'Grüße, ✓ and 😀 ' + 'abc'.repeat(50),
    'y'.repeat(214),
    'z'.repeat(700),
    'w'.repeat(2000),
  ]
  for (const text of texts) {
    const code = encodeQr(text)
    const scale = 3
    const border = 4
    const dimension = (code.size + border * 2) * scale
    const rows: string[] = []
    for (let py = 0; py < dimension; py++) {
      let row = ''
      for (let px = 0; px < dimension; px++) {
        const x = Math.floor(px / scale) - border
        const y = Math.floor(py / scale) - border
        row += x >= 0 && y >= 0 && x < code.size && y < code.size && code.dark(x, y) ? '1' : '0'
      }
      rows.push(row)
    }
    const file = join(directory, `v${code.version}.pbm`)
    writeFileSync(file, `P1\n${dimension} ${dimension}\n${rows.join('\n')}\n`)
    const decoded = spawnSync('zbarimg', ['--quiet', '--raw', '-Sbinary', file], { encoding: 'buffer' })
    t.equal(decoded.stdout.toString('utf8').replace(/\n$/, ''), text, `version ${code.version} (${Buffer.byteLength(text)} bytes)`)
  }
})
