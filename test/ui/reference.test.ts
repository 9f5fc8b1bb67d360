// /docs renders the API reference from this origin only, and every problem `type` URI
// (/problems/<code>) is a page saying what the code means and what to do.
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { PROBLEM_CODES } from '../../src/http/problem-codes.ts'
import { startTestServer } from '../helpers/server.ts'
import { openBrowser } from './browser.ts'

const root = new URL('../../', import.meta.url).pathname

/** Every .ts file under a folder. */
function sources(folder: string): string[] {
  return readdirSync(join(root, folder), { recursive: true, encoding: 'utf8' })
    .filter((name) => name.endsWith('.ts'))
    .map((name) => readFileSync(join(root, folder, name), 'utf8'))
}

/**
 * The codes the service can answer with: the contract's table (docs/api.md section 2) and every
 * code an error class of src/ is made with (`super('code'`, `code = 'code'`, a code passed last).
 */
function emittedCodes(): Set<string> {
  const api = readFileSync(join(root, 'docs/api.md'), 'utf8')
  const table = api.slice(api.indexOf('\n## 2.'), api.indexOf('\n## 3.'))
  const codes = new Set<string>(['internal_error'])
  for (const line of table.split('\n').filter((row) => /^\| \d{3} \|/.test(row))) {
    for (const [, code] of line.split('|')[2].matchAll(/`([a-z_0-9]+)`/g)) codes.add(code)
  }
  for (const text of sources('src')) {
    for (const [, code] of text.matchAll(/super\('([a-z][a-z0-9_]+)'/g)) codes.add(code)
    for (const [, code] of text.matchAll(/\bcode = '([a-z][a-z0-9_]+)'/g)) codes.add(code)
    for (const [, code] of text.matchAll(
      /new (?:NotFound|Forbidden|Conflict|RateLimited|Validation)Error\([^()]*?, '([a-z][a-z0-9_]+)'\)/g,
    )) {
      codes.add(code)
    }
  }
  return codes
}

t.test('every code the service emits has a page at its type URI', async (t) => {
  const server = await startTestServer(t)
  const codes = emittedCodes()
  t.ok(codes.size >= 30, `${codes.size} codes`)
  for (const code of codes) {
    const entry = PROBLEM_CODES[code]
    t.ok(entry, `${code} is in src/http/problem-codes.ts`)
    const page = await server.request('GET', `/problems/${code}`)
    t.equal(page.status, 200, `/problems/${code}`)
    t.match(page.headers.get('content-type'), /^text\/html/)
    if (entry) t.ok(page.text.includes(entry.means.replace(/'/g, '&#39;').replace(/"/g, '&quot;')), `${code}: what it means`)
  }
  t.equal((await server.request('GET', '/problems/no_such_code')).status, 404)
  t.equal((await server.request('GET', '/problems/constructor')).status, 404, 'no prototype key is a code')

  const refused = await server.request('GET', '/api/contacts')
  t.equal(refused.body.type, '/problems/token_missing')
  const page = await server.request('GET', refused.body.type)
  t.equal(page.status, 200, "a real answer's type resolves")
  t.match(page.text, /Authorization: Bearer/)
})

t.test('/docs and its bundle come from this origin, under a policy that allows no other', async (t) => {
  const server = await startTestServer(t)
  const docs = await server.request('GET', '/docs')
  t.equal(docs.status, 200)
  const policy = docs.headers.get('content-security-policy') ?? ''
  t.match(policy, /script-src 'self';/)
  t.match(policy, /connect-src 'self';/)
  t.notMatch(policy, /script-src[^;]*unsafe/, 'no inline or evaluated script')
  const scripts = [...docs.text.matchAll(/<script src="([^"]+)"/g)].map((match) => match[1])
  t.same(scripts, ['/docs/assets/standalone.js', '/docs/start.js'])
  for (const script of scripts) {
    const answer = await server.request('GET', script)
    t.equal(answer.status, 200, script)
    t.match(answer.headers.get('content-type'), /^text\/javascript/)
  }
  for (const path of [
    '/docs/assets/..%2Fpackage.json',
    '/docs/assets/../../package.json',
    '/docs/assets/chunks/x.js.map',
    '/docs/assets/nope.js',
  ]) {
    t.equal((await server.request('GET', path)).status, 404, path)
  }
})

t.test('the reference renders in a browser and asks nothing of another origin', async (t) => {
  const browser = await openBrowser(t)
  if (!browser) return
  const server = await startTestServer(t)
  const origins = new Set<string>()
  const refused: string[] = []
  browser.page.on('request', (request) => origins.add(new URL(request.url()).origin))
  browser.page.on('console', (message) => {
    if (/Content Security Policy/i.test(message.text())) refused.push(message.text())
  })
  // A 4 MB bundle on a shared machine: the document's description, rendered, is waited for, not load.
  await browser.page.goto(`${server.url}/docs`, { waitUntil: 'commit' })
  await browser.page.getByText('Multi-tenant CRM').first().waitFor({ timeout: 120_000 })
  t.same([...origins], [server.url], 'every request went to the service')
  t.same(refused, [], 'nothing the page does is refused by its policy')
  await browser.screenshot('api-reference')
})
