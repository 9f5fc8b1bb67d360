// The answers of a wake shared by several requests of one credential (docs/api.md section 8a):
// the requests that joined the wake's run are answered from the run's end (src/http/app.ts,
// answerJoined), not through the route's response path, and each must still carry what a request
// without a wait answers: the same headers in the same order, the same events, its own request id
// and its own log line naming the caller.
import http from 'node:http'
import t from 'tap'
import { until } from '../helpers/until.ts'
import { startWorld } from '../records/helpers.ts'

const WAITERS = 6
/** Values that differ between any two answers. */
const OWN_VALUES = new Set(['x-request-id', 'date', 'ratelimit-remaining', 'ratelimit-reset'])

type Raw = { status: number; headers: string[]; body: string }

function rawGet(base: string, path: string, token: string, requestId: string): Promise<Raw> {
  return new Promise((resolve, reject) => {
    const request = http.get(
      `${base}${path}`,
      { headers: { authorization: `Bearer ${token}`, 'x-tenant-slug': 'acme', 'x-request-id': requestId }, agent: false },
      (response) => {
        const chunks: Buffer[] = []
        response.on('data', (chunk: Buffer) => chunks.push(chunk))
        response.on('end', () =>
          resolve({ status: response.statusCode ?? 0, headers: response.rawHeaders, body: Buffer.concat(chunks).toString() }),
        )
      },
    )
    request.on('error', reject)
  })
}

/** Header names in order, and the values that every answer of the same page shares. */
const shape = (raw: Raw) =>
  Array.from({ length: raw.headers.length / 2 }, (_, index) => {
    const name = raw.headers[2 * index].toLowerCase()
    return OWN_VALUES.has(name) ? name : `${name}: ${raw.headers[2 * index + 1]}`
  })

t.test("a shared wake's answers carry the headers and events of a request without a wait", async (t) => {
  const world = await startWorld(t)
  const admin = world.as('admin@acme.test')
  const token = admin.member.token
  const listener = world.server.feedListener!
  const start = (await admin.get('/api/events')).body.next_cursor
  const path = `/api/events?after=${start}`

  // One token, one URL: the woken requests share one run, and all but its leader join it.
  const answers = Array.from({ length: WAITERS }, (_, index) => rawGet(world.server.url, `${path}&wait=30`, token, `woken-${index}`))
  await until('every request waits', async () => listener.waiting() === WAITERS)
  await world.owner(
    `insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
     values ($1, 'deal.created', 'deal', gen_random_uuid(), '{"object": {"id": "woken"}}', '{"type": "system", "id": null, "via": "system"}')`,
    [world.tenant.id],
  )
  const woken = await Promise.all(answers)
  const plain = await rawGet(world.server.url, path, token, 'plain')
  t.equal(plain.status, 200, plain.body)
  const plainBody = JSON.parse(plain.body)
  t.equal(plainBody.data.length, 1, 'the request without a wait reads the event')

  for (const [index, answer] of woken.entries()) {
    t.equal(answer.status, 200, answer.body)
    t.same(shape(answer), shape(plain), `woken request ${index}: the same headers in the same order as without a wait`)
    t.equal(answer.headers[answer.headers.findIndex((name) => name.toLowerCase() === 'x-request-id') + 1], `woken-${index}`)
    const body = JSON.parse(answer.body)
    t.same(Object.keys(body), Object.keys(plainBody), 'the same members')
    t.equal(JSON.stringify(body.data), JSON.stringify(plainBody.data), 'the same events, byte for byte')
  }

  // Each woken request logs its own line with the caller, as every request does.
  const logged = (requestId: string) =>
    world.server.logLines.map((line) => JSON.parse(line)).find((entry) => entry.msg === 'request' && entry.request_id === requestId)
  await until('every woken request is logged', async () => woken.every((_, index) => logged(`woken-${index}`) !== undefined))
  for (let index = 0; index < WAITERS; index++) {
    const entry = logged(`woken-${index}`)
    t.equal(entry.status, 200)
    t.equal(entry.user_id, admin.member.id, `woken request ${index}'s log line names the caller`)
  }
})
