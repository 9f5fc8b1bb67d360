// Objects made for every request keep one hidden class. An object literal with a getter made a new
// one per request, which V8 keeps outside the young generation pointing at that request, so every
// request's objects outlived their first garbage collections (docs/performance.md, "Promoted
// garbage"). V8's own %HaveSameMap answers, in a child started with --allow-natives-syntax.
import { spawnSync } from 'node:child_process'
import { pathToFileURL } from 'node:url'
import t from 'tap'

const singleStatement = pathToFileURL(new URL('../../src/db/request/statement-connection.ts', import.meta.url).pathname).href

const script = `
const { SingleStatementConnection } = await import(${JSON.stringify(singleStatement)})
const request = (id) => ({ req: {}, res: {}, requestId: id, params: { id }, query: {}, body: undefined, bodyFile: undefined, services: {} })
const context = (id) => new SingleStatementConnection({}, {}, () => {}).contextFor(request(id))
const first = context('a')
const second = context('b')
let refused = false
try { first.caller } catch { refused = true }
console.log(JSON.stringify({ sameShape: %HaveSameMap(first, second), refused, db: first.db !== second.db, requestId: second.requestId }))
`

t.test("a single-statement route's context has one shape for every request", async (t) => {
  const child = spawnSync(process.execPath, ['--allow-natives-syntax', '--input-type=module', '-e', script], { encoding: 'utf8' })
  t.equal(child.status, 0, child.stderr)
  const answer = JSON.parse(child.stdout)
  t.ok(answer.sameShape, 'two requests’ contexts share their hidden class')
  t.ok(answer.refused, 'the caller is not known before the statement answered')
  t.ok(answer.db, 'each context has its own connection')
  t.equal(answer.requestId, 'b', "the request's own fields are there")
})
