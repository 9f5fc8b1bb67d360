// The rate limit counted in two API processes and settled in one PostgreSQL: two OS processes,
// each with its own limiter and its own counter id, fire admissions for the same user from 20
// concurrent loops each until every loop is refused. The total admitted lies within the bound
// (docs/decisions.md, "The rate limit counted in the process"), and the database holds exactly
// what each process admitted once both have flushed.
import { type ChildProcess, fork } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { ensureRuntimeRole } from '../../src/db/runtime-role.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { TEST_APP_SECRET } from '../helpers/server.ts'

const CHILD = fileURLToPath(new URL('../helpers/rate-limit-child.ts', import.meta.url))
const LIMIT = 500
const BATCH = 20
const LOOPS = 20

const url = await createTestDatabase(t)
const runtimeUrl = await ensureRuntimeRole(url, TEST_APP_SECRET)
const owner = await ownerClient(t, url)
// Both processes count in the minute of this instant (their clocks are frozen there), so a run
// that crosses a minute stays in one window; the database takes it for a minute after.
const frozen = Date.now()
const windowStart = new Date(Math.floor(frozen / 60_000) * 60_000)

type LoadResult = { admitted: number; refused: number; errors: string[]; source: number }

function start(args: string[]): ChildProcess {
  const child = fork(CHILD, args, {
    env: { ...process.env, RATE_LIMIT_TEST_NOW: String(frozen) },
    execArgv: [],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  })
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  })
  return child
}
const nextMessage = <T>(child: ChildProcess): Promise<T> =>
  new Promise((resolve, reject) => {
    const onExit = (code: number | null) => reject(new Error(`the child exited with ${code} before answering`))
    child.once('exit', onExit)
    child.once('message', (message) => {
      child.off('exit', onExit)
      resolve(message as T)
    })
  })

const settled = async (user: string) => {
  const { rows } = await owner.query<{ backend_pid: number; count: number }>(
    'select backend_pid, count from crm.rate_limit_counters where user_id = $1 and window_start = $2 order by backend_pid',
    [user, windowStart],
  )
  return rows
}

t.test('two processes under concurrent load admit within the bound, and the database holds every admission once', async (t) => {
  const processes = [start(['load', runtimeUrl, String(LIMIT), String(BATCH), String(LOOPS)])]
  processes.push(start(['load', runtimeUrl, String(LIMIT), String(BATCH), String(LOOPS)]))
  await Promise.all(processes.map((child) => nextMessage(child)))
  // Three users, one after another, each with both processes firing at once.
  for (let round = 0; round < 3; round++) {
    const user = randomUUID()
    const answers = processes.map((child) => nextMessage<LoadResult>(child))
    for (const child of processes) child.send({ user })
    const [a, b] = await Promise.all(answers)
    const total = a.admitted + b.admitted
    t.same([...a.errors, ...b.errors], [], `user ${round + 1}: no error`)
    t.equal(a.refused + b.refused, 2 * LOOPS, `user ${round + 1}: every loop ended refused`)
    t.ok(a.admitted > 0 && b.admitted > 0, `user ${round + 1}: both processes admitted (${a.admitted} + ${b.admitted})`)
    // limit + (N - 1) × batch, N = 2; within the looser limit + N × batch - 1 as well.
    t.ok(total >= LIMIT && total <= LIMIT + BATCH, `user ${round + 1}: ${total} admitted, within [${LIMIT}, ${LIMIT + BATCH}]`)
    t.same(
      await settled(user),
      [a, b].map((result) => ({ backend_pid: result.source, count: result.admitted })).sort((x, y) => x.backend_pid - y.backend_pid),
      `user ${round + 1}: each process's row holds exactly what it admitted (nothing lost, nothing twice)`,
    )
  }
  for (const child of processes) child.send({ done: true })
  const codes = await Promise.all(processes.map((child) => new Promise((resolve) => child.once('exit', resolve))))
  t.same(codes, [0, 0], 'both ended cleanly')
})

t.test('a process that dies loses at most its unsettled batch', async (t) => {
  const user = randomUUID()
  // 2 full batches settle on their own; the last 3 admissions are still in the process.
  const child = start(['crash', runtimeUrl, '5', user, String(2 * 5 + 3)])
  const { admitted, source } = await nextMessage<{ admitted: number; source: number }>(child)
  child.kill('SIGKILL')
  await new Promise((resolve) => child.once('exit', resolve))
  t.equal(admitted, 13)
  const rows = await settled(user)
  t.same(rows, [{ backend_pid: source, count: 10 }], 'the two settled batches')
  t.ok(admitted - rows[0].count <= 5, 'lost: 3, at most one batch')
})
