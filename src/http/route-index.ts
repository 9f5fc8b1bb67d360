// Route lookup by the path's first two segments. polka (trouter) tests every route's pattern against
// every request, in order: about 150 regular expressions per request (profiled at 3 % of GET one's
// API process). Routes whose path starts with two plain segments (`/api/deals/...`) can only match a
// path that starts with the same two segments, so each request tests only those and the routes
// that could match any path (middleware, patterns starting with a parameter), in the original order;
// the matching loop itself is trouter's, so the handlers and parameters found are the same.
// test/foundation/route-index.test.ts compares the two lookups.

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
 * The two leading plain segments a route's pattern requires, lower-cased (patterns are
 * case-insensitive), or null when it may match other paths. Only patterns regexparam built from a
 * string are read (keys is an array): each plain segment is written into them as it is, and what
 * follows one is always a segment boundary (`\/`, `(?:\/`, `(?=$|\/)`). A segment with anything but
 * letters, digits, `_` and `-` (a `.` is a regex wildcard there) leaves the route unindexed.
 */
function leadingSegments(route: Route): string | null {
  if (route.keys === false) return null
  const match = /^\^\\\/([A-Za-z0-9_-]+)\\\/([A-Za-z0-9_-]+)(\\\/|\(\?:\\\/|\(\?=\$\|\\\/\))/.exec(route.pattern.source)
  return match && route.pattern.flags === 'i' ? `${match[1].toLowerCase()}/${match[2].toLowerCase()}` : null
}

/** The same key for a request path: its first two segments, lower-cased. */
function pathKey(url: string): string | null {
  const second = url.indexOf('/', 1)
  if (second < 0) return null
  const third = url.indexOf('/', second + 1)
  return url.slice(1, third < 0 ? url.length : third).toLowerCase()
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
  const keyed = new Map<string, Route[]>()
  const anywhere: Route[] = []
  const keys = router.routes.map(leadingSegments)
  for (const key of keys) if (key !== null && !keyed.has(key)) keyed.set(key, [])
  // Each list keeps the original order: its own routes and those that may match anything.
  router.routes.forEach((route, index) => {
    const key = keys[index]
    if (key === null) {
      anywhere.push(route)
      for (const list of keyed.values()) list.push(route)
    } else {
      keyed.get(key)!.push(route)
    }
  })
  router.find = (method, url) => {
    const key = pathKey(url)
    return findIn((key !== null && keyed.get(key)) || anywhere, method, url)
  }
}
