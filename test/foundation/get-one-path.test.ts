// The path of the hottest request, GET /api/contacts/:id with a bearer token the process has seen,
// stays short: a stack captured where its one statement is sent (the deepest point of its work)
// names the files of src/ it passes through on the way down, and the files it comes back to after
// leaving them; at most 9. Every file whose code runs for the request at all (helpers that return
// before the statement included: the rate limit, the identity cache, the log line) is counted too,
// and held to where it stands. ARCHITECTURE.md lists both.
import { Session } from 'node:inspector/promises'
import { fileURLToPath, pathToFileURL } from 'node:url'
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

/** Where the whole-run count stands (15 before the request-database layer); lower it as it improves. */
const FILES_RUN_BOUND = 16

const SRC = fileURLToPath(new URL('../../src/', import.meta.url))

/** The files of src/ in a stack, outermost first, as each frame names them (one entry per frame). */
function srcFramesOf(stack: string): string[] {
  const frames: string[] = []
  for (const line of stack.split('\n').slice(1)) {
    const at = line.indexOf(SRC)
    if (at === -1) continue
    frames.push(line.slice(at + SRC.length).replace(/:\d+:\d+\)?$/, ''))
  }
  return frames.reverse()
}

/** The files a path enters, in order, and how often it enters a file it had left before. */
export function walk(frames: string[]): { files: string[]; returns: number } {
  const files: string[] = []
  let returns = 0
  for (const [index, file] of frames.entries()) {
    if (index > 0 && frames[index - 1] === file) continue
    if (files.includes(file)) returns++
    else files.push(file)
  }
  return { files, returns }
}

t.test('walk counts the files a path enters and its returns to one it left', async (t) => {
  t.same(walk(['a.ts', 'a.ts', 'b.ts', 'a.ts', 'c.ts']), { files: ['a.ts', 'b.ts', 'c.ts'], returns: 1 })
})

t.test('GET one record by a cached token passes through at most 9 files of src/', async (t) => {
  const stacks: string[] = []
  const limit = Error.stackTraceLimit
  Error.stackTraceLimit = Number.POSITIVE_INFINITY
  t.teardown(() => {
    Error.stackTraceLimit = limit
  })
  let capture = false
  // The rate limit's settlements run on a timer (on a pool of their own); a long interval keeps
  // them away from the requests below, and the measurement below is taken three times.
  const server = await startTestServer(t, { countQueries: true, env: { RATE_LIMIT_SETTLE_MS: '10000' } })
  // countQueries makes the pools call onQuery; the stack is taken inside it, where the statement is sent.
  server.queries.push = (...texts: string[]) => {
    if (capture && texts.some((text) => text.includes('contact_json'))) stacks.push(new Error('GET one').stack ?? '')
    return Array.prototype.push.apply(server.queries, texts)
  }
  const { members } = await createTenant(server.databaseUrl, { members: { 'ada@acme.test': 'admin' } })
  const token = members['ada@acme.test'].token
  const created = await server.request('POST', '/api/contacts', { token, body: { first_name: 'Ada' } })
  t.equal(created.status, 201)
  // The first GET caches the identity; the next ones are the common case, a resumed identity.
  t.equal((await server.request('GET', `/api/contacts/${created.body.data.id}`, { token })).status, 200)
  // Every file of src/ whose code runs for the request at all, helpers that return before the
  // statement included (V8's call counts, reset just before the request). A timer of the process
  // firing meanwhile (a settlement of the rate limit) would count its files too, so the files are
  // those that ran in each of three requests.
  const base = pathToFileURL(SRC).href
  const runs: string[][] = []
  for (let attempt = 0; attempt < 3; attempt++) {
    const inspector = new Session()
    inspector.connect()
    await inspector.post('Profiler.enable')
    await inspector.post('Profiler.startPreciseCoverage', { callCount: true, detailed: false })
    await inspector.post('Profiler.takePreciseCoverage')
    capture = attempt === 0
    t.equal((await server.request('GET', `/api/contacts/${created.body.data.id}`, { token })).status, 200)
    capture = false
    const { result } = await inspector.post('Profiler.takePreciseCoverage')
    inspector.disconnect()
    runs.push(
      result
        .filter((script) => script.url.startsWith(base) && script.functions.some((fn) => fn.ranges[0].count > 0))
        .map((script) => script.url.slice(base.length))
        .sort(),
    )
  }
  const ran = runs[0].filter((file) => runs.every((run) => run.includes(file)))
  t.comment(`files of src/ whose code ran for the request: ${ran.length}: ${ran.join(', ')}`)
  t.equal(stacks.length, 1, 'one statement')
  const path = walk(srcFramesOf(stacks[0]))
  t.comment(`files: ${path.files.join(' -> ')}; returns to a file left before: ${path.returns}`)
  t.ok(path.files.length <= 9, `${path.files.length} files: ${path.files.join(', ')}`)
  t.ok(path.returns <= 1, `${path.returns} returns to a file left before`)
  t.ok(ran.length <= FILES_RUN_BOUND, `${ran.length} files run (at most ${FILES_RUN_BOUND}): ${ran.join(', ')}`)
  t.ok(path.files.includes('db/request/statement-pool.ts'), 'the stack reaches the statement pool')
})
