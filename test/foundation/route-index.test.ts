// The indexed route lookup (src/http/route-index.ts) finds exactly what polka's own lookup finds:
// the same handlers in the same order and the same parameters, for every route of the service and
// the UI, and for paths built to catch an index that leaves out a route it should have tried.
import polka from 'polka'
import t from 'tap'
import { indexRoutes, type Router } from '../../src/http/route-index.ts'
import { allRoutes } from '../../src/http/routes/index.ts'
import { registerPages } from '../../src/ui/routes.ts'

const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'PROPFIND']

function build(): ReturnType<typeof polka> {
  const app = polka()
  const definitions = allRoutes()
  app.use((_req: unknown, _res: unknown, next: () => void) => next())
  for (const definition of definitions) {
    app[definition.method.toLowerCase() as 'get'](definition.path, () => {})
  }
  registerPages(app, { config: {}, logger: {} } as never, definitions)
  // Shapes the service does not use today, so the index meets them if it ever does.
  app.get('/:slug/settings', () => {})
  app.get('/files/*', () => {})
  app.get('/api/reports/:id?', () => {})
  app.get('/api/plain.json', () => {})
  app.all('/api/deals/:id', () => {})
  app.get(/^\/api\/regex(?:\/(?<name>[^/]+))?\/?$/i, () => {})
  return app
}

t.test('the indexed lookup finds what polka finds, for every path tried', async (t) => {
  const indexed = build() as unknown as Router
  // polka's own lookup over the same routes, kept before the index replaces it.
  const plain = { routes: indexed.routes, find: indexed.find.bind(indexed) }
  indexRoutes(indexed)
  const id = '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'
  const paths = new Set<string>(['', '/', '//', '/api', '/api/', '//api/deals', '/api//deals', '/api/deals//x', '/api/plainXjson'])
  for (const route of plain.routes) {
    if (route.keys === false) continue
    const source = route.pattern.source
    const path = source
      .replace(/^\^/, '')
      .replace(/\\\/\?\$$|\(\?=\$\|\\\/\)$/, '')
      .replace(/\(\?:\\?\/\(\[\^\/\]\+\?\)\)\?/g, `/${id}`)
      .replace(/\(\?:\\?\/\(\.\*\)\)\?/g, '/a/b')
      .replace(/\(\[\^\/\]\+\?\)/g, id)
      .replace(/\(\.\*\)/g, 'a/b')
      .replaceAll('\\/', '/')
      .replaceAll('\\.', '.')
    for (const variant of [path, `${path}/`, path.toUpperCase(), `${path}/extra`, path.replace(/\/[^/]*$/, '/'), `${path}x`]) {
      paths.add(variant)
    }
  }
  // Letters that only match case-insensitively, or look like they might.
  paths.add('/API/DEALS/search')
  paths.add('/api/\u212Aeys') // KELVIN SIGN, lower-cases to k
  paths.add('/api/d\u0131als') // dotless i
  paths.add('/\u017Fecurity') // LATIN SMALL LETTER LONG S, upper-cases to S
  paths.add('/MEMBERS')
  paths.add('/members?')
  t.ok(paths.size > 300, `${paths.size} paths`)
  let compared = 0
  for (const path of paths) {
    for (const method of METHODS) {
      const expected = plain.find(method, path)
      const found = indexed.find(method, path)
      if (
        found.handlers.length !== expected.handlers.length ||
        found.handlers.some((handler, index) => handler !== expected.handlers[index])
      ) {
        t.fail(`${method} ${path}: other handlers`)
      }
      t.same(found.params, expected.params, `${method} ${path}: same parameters`, { diagnostic: false })
      compared++
    }
  }
  t.ok(compared > 2000, `${compared} lookups compared`)
})

t.test("a request under /api/ tries none of the UI's one-segment routes", async (t) => {
  const app = build() as unknown as Router
  indexRoutes(app)
  const tried: string[] = []
  for (const route of app.routes) {
    const { pattern } = route
    const exec = pattern.exec.bind(pattern)
    const test = pattern.test.bind(pattern)
    pattern.exec = (text) => {
      tried.push(pattern.source)
      return exec(text)
    }
    pattern.test = (text) => {
      tried.push(pattern.source)
      return test(text)
    }
  }
  for (const path of ['/api/deals/01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a', '/api/deals']) {
    tried.length = 0
    t.ok(app.find('GET', path).handlers.length > 0, `GET ${path} is found`)
    // A route whose pattern starts with a plain segment other than api cannot match.
    const outside = tried.filter((source) => /^\^\\\/[A-Za-z0-9_-]/.test(source) && !source.startsWith('^\\/api\\/'))
    t.same(outside, [], `GET ${path} tests only /api/ routes and those that may match any path`)
  }
})
