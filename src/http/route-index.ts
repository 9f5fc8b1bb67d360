// Route lookup by the path's leading segments. polka (trouter) tests every route's pattern against
// every request, in order: about 150 regular expressions per request (profiled at 3 % of GET one's
// API process). A route whose path starts with a plain segment (`/members/...`) can only match a path
// that starts with the same segment, and one that starts with two (`/api/deals/...`) only a path
// that starts with the same two; so each request tests only the routes of its leading segments and
// the routes that could match any path (middleware, patterns starting with a parameter), in the
// original order; the matching loop itself is trouter's, so the handlers and parameters found are
// the same. test/foundation/route-index.test.ts compares the two lookups.

type Route = { keys: string[] | false; pattern: RegExp; midx: number; handlers: unknown[] }
type Found = { params: Record<string, string>; handlers: unknown[] }
export type Router = { routes: Route[]; find: (method: string, url: string) => Found }

/** trouter's method numbers (0: any method, as middleware is stored). */
const METHOD_INDEX: Record<string, number> = {
  '': 0,
  GET: 1,
  HEAD: 2,
  PATCH: 3,
  OPTIONS: 4,
  CONNECT: 5,
  DELETE: 6,
  TRACE: 7,
  POST: 8,
  PUT: 9,
}

/**
 * The leading plain segments a route's pattern requires, lower-cased (patterns are
 * case-insensitive): two (`api/deals`), else one (`members`), else null when it may match any path.
 * Only patterns regexparam built from a string are read (keys is an array): each plain segment is
 * written into them as it is, and what follows one is always a segment boundary (`\/`, `(?:\/`,
 * `(?=$|\/)`, or the optional trailing slash `\/?$`). A segment with anything but letters, digits, `_`
 * and `-` (a `.` is a regex wildcard there) ends the key before it.
 */
function leadingSegments(route: Route): { two: string } | { one: string } | null {
  if (route.keys === false || route.pattern.flags !== 'i') return null
  const two = /^\^\\\/([A-Za-z0-9_-]+)\\\/([A-Za-z0-9_-]+)(\\\/|\(\?:\\\/|\(\?=\$\|\\\/\))/.exec(route.pattern.source)
  if (two) return { two: `${two[1].toLowerCase()}/${two[2].toLowerCase()}` }
  const one = /^\^\\\/([A-Za-z0-9_-]+)(\\\/|\(\?:\\\/|\(\?=\$\|\\\/\))/.exec(route.pattern.source)
  return one ? { one: one[1].toLowerCase() } : null
}

/** A request path's first segment, and its first two (null without a second), lower-cased. */
function pathKeys(url: string): { one: string; two: string | null } {
  const second = url.indexOf('/', 1)
  if (second < 0) return { one: url.slice(1).toLowerCase(), two: null }
  const third = url.indexOf('/', second + 1)
  const two = url.slice(1, third < 0 ? url.length : third).toLowerCase()
  return { one: two.slice(0, second - 1), two }
}

/** trouter's find, over the given routes only. */
function findIn(routes: Route[], method: string, url: string): Found {
  const midx = METHOD_INDEX[method]
  const isHead = midx === 2
  const params: Record<string, string> = {}
  let handlers: unknown[] = []
  for (const route of routes) {
    if (route.midx !== midx && route.midx !== 0 && !(isHead && route.midx === 1)) continue
    if (route.keys === false) {
      const matches = route.pattern.exec(url)
      if (matches === null) continue
      if (matches.groups !== undefined) for (const key in matches.groups) params[key] = matches.groups[key]
    } else if (route.keys.length > 0) {
      const matches = route.pattern.exec(url)
      if (matches === null) continue
      for (let index = 0; index < route.keys.length; ) params[route.keys[index]] = matches[++index]
    } else if (!route.pattern.test(url)) {
      continue
    }
    if (route.handlers.length > 1) handlers = handlers.concat(route.handlers)
    else handlers.push(route.handlers[0])
  }
  return { params, handlers }
}

/** Replaces the router's find with the indexed one; call after every route is added. */
export function indexRoutes(router: Router): void {
  const keys = router.routes.map(leadingSegments)
  // Each list keeps the original order: a key's own routes, its first segment's, and those that
  // may match anything.
  const listOf = (one: string, two: string | null) =>
    router.routes.filter((_, index) => {
      const key = keys[index]
      return key === null || ('one' in key ? key.one === one : key.two === two)
    })
  const byTwo = new Map<string, Route[]>()
  const byOne = new Map<string, Route[]>()
  for (const key of keys) {
    if (key === null) continue
    const one = 'one' in key ? key.one : key.two.slice(0, key.two.indexOf('/'))
    if (!byOne.has(one)) byOne.set(one, listOf(one, null))
    if ('two' in key && !byTwo.has(key.two)) byTwo.set(key.two, listOf(one, key.two))
  }
  const anywhere = router.routes.filter((_, index) => keys[index] === null)
  router.find = (method, url) => {
    const key = pathKeys(url)
    return findIn((key.two !== null && byTwo.get(key.two)) || byOne.get(key.one) || anywhere, method, url)
  }
}
