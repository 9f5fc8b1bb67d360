// The QR code the two-factor screen draws: the SVG's markup, and, where zbarimg (zbar-tools) is
// installed, an independent decoder reading the drawn modules back, from one module to version 40.
import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { qrSvg } from '../../src/ui/qr-code.ts'

/** The dark modules of the SVG's path, as a grid of the viewBox's size (quiet zone included). */
function drawnModules(svg: string): boolean[][] {
  const size = Number(/viewBox="0 0 (\d+) \1"/.exec(svg)?.[1])
  const grid = Array.from({ length: size }, () => new Array<boolean>(size).fill(false))
  for (const [, x, y] of svg.matchAll(/M(\d+) (\d+)h1v1h-1z/g)) grid[Number(y)][Number(x)] = true
  return grid
}

t.test('the SVG has a quiet zone, a label and no markup from the text', async (t) => {
  const svg = qrSvg('otpauth://totp/CRM:a%40b.c?secret=ABC&issuer=CRM', 'QR code <for> "you"')
  t.match(
    svg,
    /^<svg xmlns="http:\/\/www\.w3\.org\/2000\/svg" class="qr" viewBox="0 0 41 41" width="205" height="205" role="img"/,
    'version 3 (29 modules) plus 4 on each side',
  )
  t.match(svg, /aria-label="QR code &#60;for&#62; &#34;you&#34;"/)
  t.notMatch(svg, /otpauth/, 'the text itself is not in the markup')
  const modules = drawnModules(svg)
  t.notOk(modules.slice(0, 4).flat().some(Boolean), 'the top quiet zone is light')
  t.notOk(
    modules.some((row) => row.slice(0, 4).some(Boolean)),
    'the left quiet zone is light',
  )
  for (const [x, y] of [
    [4, 4],
    [36, 4],
    [4, 36],
  ])
    t.ok(modules[y][x], `a finder pattern's corner at ${x},${y}`)
})

t.test('the version grows with the text (error correction level M)', async (t) => {
  const sizeOf = (text: string) => drawnModules(qrSvg(text, 'QR')).length - 8
  // Level M byte capacities: version 1 holds 14 bytes, version 40 holds 2331.
  t.equal(sizeOf('x'.repeat(14)), 21, 'version 1')
  t.equal(sizeOf('x'.repeat(15)), 25, 'version 2')
  t.equal(sizeOf('x'.repeat(2331)), 177, 'version 40')
  t.throws(() => qrSvg('x'.repeat(2332), 'QR'), /too long/)
})

const zbar = spawnSync('zbarimg', ['--version']).status === 0
t.test('zbarimg decodes the drawn QR code', { skip: zbar ? false : 'zbarimg is not installed (apt-get install zbar-tools)' }, async (t) => {
  const directory = mkdtempSync(join(tmpdir(), 'crm-qr-'))
  t.teardown(() => rmSync(directory, { recursive: true, force: true }))
  const texts = [
    'a',
    'otpauth://totp/CRM:ada%40example.com?secret=JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP&issuer=CRM',
    'otpauth://totp/CRM:%C3%A9lodie%2Bcrm%40example.com?secret=JBSWY3DPEHPK3PXP&issuer=CRM',
    `Grüße, ✓ and 😀 ${'abc'.repeat(50)}`,
    'z'.repeat(700),
    'w'.repeat(2000),
  ]
  for (const [index, text] of texts.entries()) {
    const modules = drawnModules(qrSvg(text, 'QR'))
    const scale = 3
    const pixels = modules.length * scale
    const rows: string[] = []
    for (let py = 0; py < pixels; py++) {
      let row = ''
      for (let px = 0; px < pixels; px++) row += modules[Math.floor(py / scale)][Math.floor(px / scale)] ? '1' : '0'
      rows.push(row)
    }
    const file = join(directory, `code-${index}.pbm`)
    writeFileSync(file, `P1\n${pixels} ${pixels}\n${rows.join('\n')}\n`)
    const decoded = spawnSync('zbarimg', ['--quiet', '--raw', '-Sbinary', file], { encoding: 'buffer' })
    t.equal(decoded.stdout.toString('utf8').replace(/\n$/, ''), text, `${modules.length - 8} modules (${Buffer.byteLength(text)} bytes)`)
  }
})
