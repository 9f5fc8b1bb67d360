// crm.settle_request_counts (sql/definitions/20_tenancy_and_access.sql), in SQL: only the runtime role
// calls it, it refuses nonsense, its totals add every process's and backend's rows of the window,
// settlements of one user wait for one another, and housekeeping prunes what it writes.
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import t from 'tap'
import { ensureRuntimeRole, ensureWorkerRole } from '../../src/db/runtime-role.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { TEST_APP_SECRET } from '../helpers/server.ts'

const url = await createTestDatabase(t)
const connect = async (connectionString: string) => {
  const client = new pg.Client({ connectionString })
  await client.connect()
  t.teardown(() => client.end())
  return client
}
const owner = await connect(url)
const runtime = await connect(await ensureRuntimeRole(url, TEST_APP_SECRET))
const worker = await connect(await ensureWorkerRole(url, TEST_APP_SECRET))

const SETTLE = 'select user_id, total from crm.settle_request_counts($1, $2, $3::uuid[], $4::int[])'
const currentWindow = async (): Promise<Date> => (await owner.query(`select date_trunc('minute', now()) as w`)).rows[0].w
const errorOf = (client: pg.Client, text: string, values: unknown[] = []) =>
  client.query(text, values).then(
    () => null,
    (error: { code?: string; message: string }) => ({ code: error.code, message: error.message }),
  )
const totals = (rows: { user_id: string; total: number }[]) => Object.fromEntries(rows.map((row) => [row.user_id, row.total]))

t.test('only the runtime role may call it, and not from inside a request (as crm_api)', async (t) => {
  const { rows } = await owner.query(
    `select r as role, has_function_privilege(r, 'crm.settle_request_counts(integer, timestamptz, uuid[], integer[])', 'execute') as may
       from unnest(array['crm_runtime', 'crm_api', 'crm_worker', 'public']) r order by 1`,
  )
  t.same(rows, [
    { role: 'crm_api', may: false },
    { role: 'crm_runtime', may: true },
    { role: 'crm_worker', may: false },
    { role: 'public', may: false },
  ])
  const window = await currentWindow()
  const user = randomUUID()
  t.same((await runtime.query(SETTLE, [-1, window, [user], [1]])).rows, [{ user_id: user, total: 1 }], 'crm_runtime settles')
  await runtime.query('begin')
  try {
    await runtime.query(`select set_config('role', 'crm_api', true)`)
    t.equal((await errorOf(runtime, SETTLE, [-1, window, [user], [1]]))?.code, '42501', 'as crm_api: permission denied')
  } finally {
    await runtime.query('rollback')
  }
  t.equal((await errorOf(worker, SETTLE, [-1, window, [user], [1]]))?.code, '42501', 'the worker may not')
})

t.test('it refuses nonsense with a clear error (22023)', async (t) => {
  const window = await currentWindow()
  const user = randomUUID()
  const minutes = (n: number) => new Date(window.getTime() + n * 60_000)
  const cases: [string, unknown[], RegExp][] = [
    ['a positive counter id (a backend pid)', [1234, window, [user], [1]], /counter id must be a negative integer/],
    ['counter id 0', [0, window, [user], [1]], /counter id must be a negative integer/],
    ['no counter id', [null, window, [user], [1]], /counter id must be a negative integer/],
    ['a window not on a whole minute', [-1, new Date(window.getTime() + 1500), [user], [1]], /whole minute/],
    ['no window', [-1, null, [user], [1]], /whole minute/],
    ['a window two minutes back', [-1, minutes(-2), [user], [1]], /more than a minute from the database's current window/],
    ['a window two minutes ahead', [-1, minutes(2), [user], [1]], /more than a minute from the database's current window/],
    ['arrays of unequal length', [-1, window, [user, randomUUID()], [1]], /arrays of equal length/],
    ['counts without users', [-1, window, [], [1]], /arrays of equal length/],
    ['no arrays', [-1, window, null, null], /arrays of equal length/],
    ['a negative count', [-1, window, [user], [-1]], /counts must be 0 or more/],
    ['a null count', [-1, window, [user], [null]], /counts must be 0 or more/],
    ['a null user', [-1, window, [null], [1]], /user ids must not be null/],
  ]
  for (const [what, values, message] of cases) {
    const error = await errorOf(runtime, SETTLE, values)
    t.equal(error?.code, '22023', what)
    t.match(error?.message, message, what)
  }
  t.equal(
    (await owner.query('select count(*)::int as n from crm.rate_limit_counters where user_id = $1', [user])).rows[0].n,
    0,
    'nothing written',
  )
  t.same((await runtime.query(SETTLE, [-1, window, [], []])).rows, [], 'no users: nothing to answer')
  t.same(
    (await runtime.query(SETTLE, [-1, minutes(-1), [user], [0]])).rows,
    [{ user_id: user, total: 0 }],
    'the window that just ended is taken',
  )
  t.same(
    (await runtime.query(SETTLE, [-1, minutes(1), [user], [0]])).rows,
    [{ user_id: user, total: 0 }],
    'the next one too (clocks differ a little)',
  )
})

t.test('the total adds every process and backend of the window', async (t) => {
  const window = await currentWindow()
  const previous = new Date(window.getTime() - 60_000)
  const [a, b, c] = [randomUUID(), randomUUID(), randomUUID()]
  // A request crm.authenticate counted in backend 4242, and one of the window before.
  await owner.query(
    `insert into crm.rate_limit_counters (user_id, window_start, backend_pid, count) values ($1, $2, 4242, 7), ($1, $3, -9, 100)`,
    [a, window, previous],
  )
  t.same(
    totals((await runtime.query(SETTLE, [-1, window, [a, b], [3, 0]])).rows),
    { [a]: 10, [b]: 0 },
    'backend row + this process; 0 asks only',
  )
  t.same(totals((await runtime.query(SETTLE, [-2, window, [a, c], [2, 5]])).rows), { [a]: 12, [c]: 5 }, 'another process adds its own')
  t.same(
    totals((await runtime.query(SETTLE, [-1, window, [a, a], [1, 1]])).rows),
    { [a]: 14 },
    'a user named twice: their counts summed, one answer',
  )
  const { rows } = await owner.query(
    `select backend_pid, count from crm.rate_limit_counters where user_id = any ($1) and window_start = $2 order by user_id = $3 desc, backend_pid`,
    [[a, b, c], window, a],
  )
  t.same(
    rows,
    [
      { backend_pid: -2, count: 2 },
      { backend_pid: -1, count: 5 },
      { backend_pid: 4242, count: 7 },
      { backend_pid: -2, count: 5 },
    ],
    'one row per user and counter id; a count of 0 writes no row',
  )
})

t.test('the full path sees what processes settled', async (t) => {
  // crm.authenticate sums every row of the window but its own backend's: settled counts included.
  const { rows } = await owner.query(
    `select pg_get_functiondef('crm.authenticate(bytea, text, text, integer)'::regprocedure) ~ 'o\\.backend_pid <> pg_backend_pid\\(\\)' as sums_others`,
  )
  t.equal(rows[0].sums_others, true)
})

t.test('settlements of one user wait for one another, so each total includes the one before', async (t) => {
  const window = await currentWindow()
  const user = randomUUID()
  const other = await connect(await ensureRuntimeRole(url, TEST_APP_SECRET))
  await runtime.query('begin')
  let secondDone = false
  let second: Promise<pg.QueryResult>
  try {
    t.same(totals((await runtime.query(SETTLE, [-1, window, [user], [5]])).rows), { [user]: 5 })
    second = other.query(SETTLE, [-2, window, [user], [5]])
    second.then(() => {
      secondDone = true
    })
    // Until the first commits, the second waits on its advisory lock (seen in pg_locks); without
    // the lock it would answer 5 at once.
    let waiting = false
    while (!secondDone && !waiting) {
      const { rows } = await owner.query(
        `select count(*)::int as n from pg_locks where locktype = 'advisory' and not granted and pid = $1`,
        [(other as unknown as { processID: number }).processID],
      )
      waiting = rows[0].n === 1
      if (!waiting) await new Promise((resolve) => setTimeout(resolve, 10))
    }
    t.equal(secondDone, false, 'the second is waiting')
  } finally {
    await runtime.query('commit')
  }
  t.same(totals((await second).rows), { [user]: 10 }, 'and its total includes the first, committed meanwhile')
})

t.test('housekeeping prunes settled windows once they are over', async (t) => {
  const window = await currentWindow()
  const user = randomUUID()
  await runtime.query(SETTLE, [-3, window, [user], [4]])
  await owner.query(
    `insert into crm.rate_limit_counters (user_id, window_start, backend_pid, count) values ($1, $2::timestamptz - interval '3 minutes', -3, 9)`,
    [user, window],
  )
  await worker.query('select * from crm.housekeeping(30)')
  const { rows } = await owner.query('select count from crm.rate_limit_counters where user_id = $1', [user])
  t.same(rows, [{ count: 4 }], 'the old window is gone, the current one stays')
})
