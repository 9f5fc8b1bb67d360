// Experiment (not run by `make bench`): what a refused request costs, against a served one. The API
// runs in its own process (the service's V8 flags), autocannon sends one kind of request for
// SECONDS at CONNECTIONS connections, and the figures are the rate, the CPU per request of the API
// and of the whole PostgreSQL server, and the sessions PostgreSQL started meanwhile
// (pg_stat_database.sessions): a pool that closes a connection after a refusal starts one per
// refusal. Kinds: a deal that is not there (404, one statement), a read-only member's create (403,
// in the request transaction), and a served GET of one deal.
//   SECONDS=5 CONNECTIONS=10 node bench/_experiment-refusals.ts
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { API_NODE_FLAGS, BENCH_APP_SECRET, benchWorkspace, postgresCpuMeter, processCpuMs, provision } from './_database.ts'

const SELF = fileURLToPath(import.meta.url)
const SECONDS = Number(process.env.SECONDS ?? 5)
const CONNECTIONS = Number(process.env.CONNECTIONS ?? 10)

if (process.argv[2] === '--serve') {
  const { loadConfig } = await import('../src/config.ts')
  const { createLogger } = await import('../src/log.ts')
  const { startService } = await import('../src/service.ts')
  const url = process.argv[3]
  const config = loadConfig({
    DATABASE_URL: url,
    PORT: '0',
    HOST: '127.0.0.1',
    APP_SECRET: BENCH_APP_SECRET,
    RATE_LIMIT_PER_MINUTE: '1000000',
  })
  const service = await startService({
    config,
    logger: createLogger('warn'),
    worker: false,
    migrate: false,
    database: { url, description: 'bench', stop: async () => {} },
  })
  process.send!({ url: service.url })
} else {
  const database = await provision()
  let api: ChildProcess | undefined
  try {
    const { tenant, slug, admin } = await benchWorkspace(database.url)
    const owner = new pg.Client({ connectionString: database.url })
    await owner.connect()
    const { mintToken } = await import('../test/helpers/fixtures.ts')
    const { rows: readers } = await owner.query(
      `insert into crm.users (email, name) values ('reader@' || $1 || '.test', 'Reader') returning id`,
      [slug],
    )
    await owner.query(
      `insert into crm.memberships (workspace_id, user_id, role_id) select $1, $2, id from crm.roles where workspace_id = $1 and name = 'read_only'`,
      [tenant.id, readers[0].id],
    )
    const readerToken = await mintToken(owner, readers[0].id)
    const { rows: deals } = await owner.query(
      `insert into crm.deals (workspace_id, owner_id, name, stage) values ($1, $2, 'Kept', 'lead') returning id`,
      [tenant.id, admin.id],
    )
    api = spawn(process.execPath, [...API_NODE_FLAGS, SELF, '--serve', database.url], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
    const apiUrl = await new Promise<string>((resolve, reject) => {
      api!.once('message', (message: { url: string }) => resolve(message.url))
      api!.once('exit', (code) => reject(new Error(`the API exited with ${code}`)))
    })
    const cpu = await postgresCpuMeter((text) => owner.query(text))
    const sessions = async () =>
      Number((await owner.query(`select sessions from pg_stat_database where datname = current_database()`)).rows[0].sessions)
    const autocannon = createRequire(import.meta.url)('autocannon') as (
      options: unknown,
    ) => Promise<{ requests: { total: number }; non2xx: number }>
    const kinds = [
      { name: 'GET a deal that is not there (404)', token: admin.token, method: 'GET', path: () => `/api/deals/${randomUUID()}` },
      {
        name: "a read-only member's create (403)",
        token: readerToken,
        method: 'POST',
        path: () => '/api/deals',
        body: '{"name":"No","stage":"lead"}',
      },
      { name: 'GET one deal (200)', token: admin.token, method: 'GET', path: () => `/api/deals/${deals[0].id}` },
    ]
    console.log(`| request | req/s | API CPU µs / request | PostgreSQL CPU µs / request | sessions started / 1,000 requests |`)
    console.log('|---|---:|---:|---:|---:|')
    for (const round of [1, 2]) {
      for (const kind of kinds) {
        const headers = { authorization: `Bearer ${kind.token}`, 'x-tenant-slug': slug, 'content-type': 'application/json' }
        await autocannon({
          url: apiUrl,
          connections: CONNECTIONS,
          duration: 1,
          headers,
          requests: [{ method: kind.method, setupRequest: (r: object) => ({ ...r, path: kind.path(), body: kind.body }) }],
        })
        await new Promise((resolve) => setTimeout(resolve, 1100)) // the sessions counter is flushed at most once a second
        const [sessionsBefore, apiBefore, pgBefore] = [await sessions(), processCpuMs(api.pid!) ?? 0, cpu?.() ?? Number.NaN]
        const result = await autocannon({
          url: apiUrl,
          connections: CONNECTIONS,
          duration: SECONDS,
          headers,
          requests: [{ method: kind.method, setupRequest: (r: object) => ({ ...r, path: kind.path(), body: kind.body }) }],
        })
        const [apiAfter, pgAfter] = [processCpuMs(api.pid!) ?? 0, cpu?.() ?? Number.NaN]
        await new Promise((resolve) => setTimeout(resolve, 1100))
        const started = (await sessions()) - sessionsBefore
        const n = result.requests.total
        console.log(
          `| ${kind.name}, round ${round} | ${Math.round(n / SECONDS)} | ${Math.round(((apiAfter - apiBefore) * 1000) / n)} | ${Math.round(((pgAfter - pgBefore) * 1000) / n)} | ${Math.round((started * 1000) / n)} |`,
        )
      }
    }
    await owner.end()
  } finally {
    api?.kill()
    await database.stop()
  }
}
