// Experiment (not run by `make bench`: files starting with _ are helpers): how much of GET one's gap
// to the bare baseline of bench/records.ts is the contract itself, how much the database work of
// authentication and row-level security, and how much the API's layers. Four servers, each in its
// own process, take turns under the same load:
//   - bare: bench/records.ts's baseline (node:http + pg, the owner's statement, two headers);
//   - floor: the same statement and server, plus what docs/api.md makes every answer carry and
//     the least work behind it: the bearer token's SHA-256 (the lookup key of any token store),
//     an X-Request-Id (a random UUID), the three RateLimit headers, and a strong ETag (the body's
//     SHA-256), with no database work beyond the bare statement;
//   - lean: the floor's server sending the API's statement for GET one instead: crm.resume_identity
//     and the read under row-level security in one named statement, on the runtime role's
//     connections (as src/auth/authenticate.ts wraps it for a cached identity), with none of the
//     API's layers (routing, middleware, admission, the identity cache, the statement wrapper);
//   - API: the real service (bench/records.ts --serve-api), with the service's V8 flags.
// It prints req/s (mean of the slices) and the CPU per request of each server process, of
// PostgreSQL (every backend) and of the whole machine (autocannon included).
//
//   node bench/_experiment-contract-floor.ts      env: BENCH_DEALS (20,000), ROUNDS (5), SECONDS (2 per slice),
//                                                 PROFILE_DIR (each server writes a V8 CPU profile there, for DevTools)
import { type ChildProcess, spawn } from 'node:child_process'
import { createHash, randomUUID } from 'node:crypto'
import { createServer } from 'node:http'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { API_NODE_FLAGS, BENCH_APP_SECRET, machineCpuMs, postgresCpuMeter, processCpuMs, provision } from './_database.ts'
import { workspaceWithDeals } from './records.ts'

const SELF = fileURLToPath(import.meta.url)
const RECORDS = fileURLToPath(new URL('records.ts', import.meta.url))
const CONNECTIONS = 50

/**
 * The floor server (and the lean one, with `lean`): GET one deal answered with the contract's
 * headers. The floor reads the deal as the baseline does; the lean server sends the API's statement
 * for a cached identity, whose values it learnt from one crm.authenticate at start.
 */
async function serveFloor(databaseUrl: string, workspaceId: string, lean?: { token: string; runtimeUrl: string }): Promise<void> {
  const pool = new pg.Pool({ connectionString: lean?.runtimeUrl ?? databaseUrl, max: 20 })
  pool.on('error', () => {})
  let read: (tokenHash: Buffer, id: string) => Promise<string | null> = async (_tokenHash, id) => {
    const { rows } = await pool.query('select crm.deal_json(t)::text as record from crm.deals t where t.workspace_id = $1 and t.id = $2', [
      workspaceId,
      id,
    ])
    return rows[0]?.record ?? null
  }
  if (lean) {
    const {
      rows: [identity],
    } = await pool.query(`select workspace_id, access_version from crm.authenticate($1, null, 'api', 1000000)`, [
      createHash('sha256').update(lean.token).digest(),
    ])
    read = async (tokenHash, id) => {
      const { rows } = await pool.query({
        name: 'lean_get_one',
        text: `select row_to_json(a)::text as auth_row, r.*
                 from crm.resume_identity($1, $2, $3, 'api', true) a
                 left join lateral (
                   select true as auth_row_found, q.*
                     from (select crm.deal_json(t)::text as record from crm.deals t where t.id = $4::uuid) q
                    where a.failure is null
                   offset 0
                 ) r on true
                where (select crm.require_confined_role())`,
        values: [tokenHash, identity.workspace_id, identity.access_version, id],
      })
      if (JSON.parse(rows[0].auth_row).failure !== null) throw new Error('the cached identity went stale')
      return rows[0].auth_row_found ? rows[0].record : null
    }
  }
  let remaining = 1_000_000
  const server = createServer(async (req, res) => {
    const tokenHash = createHash('sha256')
      .update(req.headers.authorization?.slice(7) ?? '')
      .digest()
    const record = await read(tokenHash, (req.url ?? '').slice(11))
    const text = `{"data":${record ?? 'null'}}`
    res.writeHead(record ? 200 : 404, {
      'x-request-id': randomUUID(),
      'ratelimit-limit': '1000000',
      'ratelimit-remaining': String(--remaining),
      'ratelimit-reset': '60',
      etag: `"${createHash('sha256').update(text).digest('base64url').slice(0, 27)}"`,
      'content-type': 'application/json; charset=utf-8',
      'content-length': Buffer.byteLength(text),
    })
    res.end(text)
  })
  server.listen(0, '127.0.0.1', () => {
    process.stdout.write(JSON.stringify({ url: `http://127.0.0.1:${(server.address() as { port: number }).port}` }) + '\n')
  })
  process.on('SIGTERM', () => server.close(() => void pool.end().then(() => process.exit(0))))
}

function startChild(args: string[], nodeFlags: string[] = []): Promise<{ url: string; child: ChildProcess }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...nodeFlags, ...args], { stdio: ['ignore', 'pipe', 'inherit'] })
    let buffer = ''
    child.stdout!.on('data', (chunk: Buffer) => {
      buffer += chunk.toString()
      if (buffer.includes('\n')) resolve({ url: (JSON.parse(buffer.split('\n')[0]) as { url: string }).url, child })
    })
    child.on('exit', (code) => reject(new Error(`${args.join(' ')} exited with ${code}`)))
  })
}

const autocannon = createRequire(import.meta.url)('autocannon') as (options: Record<string, unknown>) => Promise<{
  requests: { total: number; average: number }
  non2xx: number
  errors: number
}>

if (process.argv[2] === '--serve-floor') await serveFloor(process.argv[3], process.argv[4])
else if (process.argv[2] === '--serve-lean')
  await serveFloor(process.argv[3], process.argv[4], { token: process.argv[5], runtimeUrl: process.argv[6] })
else {
  const deals = Number(process.env.BENCH_DEALS ?? 20_000)
  const rounds = Number(process.env.ROUNDS ?? 5)
  const seconds = Number(process.env.SECONDS ?? 2)
  const database = await provision()
  const children: ChildProcess[] = []
  try {
    const { tenant, slug, admin, client, ids } = await workspaceWithDeals(database.url, deals, () => {})
    const postgresMs = await postgresCpuMeter((text) => client.query(text))
    // Each server's V8 profile over its whole life (start-up is a small part of it at 5 rounds).
    const profiling = process.env.PROFILE_DIR ? ['--cpu-prof', '--cpu-prof-interval=200', `--cpu-prof-dir=${process.env.PROFILE_DIR}`] : []
    const { ensureRuntimeRole } = await import('../src/db/runtime-role.ts')
    const runtimeUrl = await ensureRuntimeRole(database.url, BENCH_APP_SECRET)
    const sides = [
      {
        name: 'bare',
        ...(await startChild([RECORDS, '--serve-baseline', database.url, tenant.id, admin.id, '20'], profiling)),
        headers: {},
      },
      {
        name: 'floor',
        ...(await startChild([SELF, '--serve-floor', database.url, tenant.id], profiling)),
        headers: { authorization: `Bearer ${admin.token}` },
      },
      {
        name: 'lean',
        ...(await startChild([SELF, '--serve-lean', database.url, tenant.id, admin.token, runtimeUrl], profiling)),
        headers: { authorization: `Bearer ${admin.token}` },
      },
      {
        name: 'API',
        ...(await startChild([RECORDS, '--serve-api', database.url], [...API_NODE_FLAGS, ...profiling])),
        headers: { authorization: `Bearer ${admin.token}`, 'x-tenant-slug': slug },
      },
    ]
    children.push(...sides.map((side) => side.child))
    const totals = new Map(sides.map((side) => [side.name, { requests: 0, rps: 0, processMs: 0, postgresMs: 0, machineMs: 0 }]))
    for (let round = -1; round < rounds; round++) {
      for (const side of sides) {
        const beforeProcess = processCpuMs(side.child.pid!) ?? 0
        const beforePostgres = postgresMs?.() ?? Number.NaN
        const beforeMachine = machineCpuMs().busy
        const result = await autocannon({
          url: side.url,
          connections: CONNECTIONS,
          duration: seconds,
          headers: side.headers,
          requests: [
            {
              method: 'GET',
              setupRequest: (request: object) => ({ ...request, path: `/api/deals/${ids[Math.floor(Math.random() * ids.length)]}` }),
            },
          ],
        })
        if (result.non2xx + result.errors > 0) throw new Error(`${side.name}: ${result.non2xx + result.errors} failed requests`)
        if (round < 0) continue // the warm-up round
        const total = totals.get(side.name)!
        total.requests += result.requests.total
        total.rps += result.requests.average / rounds
        total.processMs += (processCpuMs(side.child.pid!) ?? 0) - beforeProcess
        total.postgresMs += (postgresMs?.() ?? Number.NaN) - beforePostgres
        total.machineMs += machineCpuMs().busy - beforeMachine
      }
    }
    const bare = totals.get('bare')!
    console.log(
      `GET one deal, ${deals.toLocaleString('en')} deals, ${CONNECTIONS} connections, ${rounds} × ${seconds} s per side in turns; µs of CPU per request`,
    )
    console.log('| side | req/s | / bare | server process | PostgreSQL | machine |')
    console.log('|---|---:|---:|---:|---:|---:|')
    for (const [name, total] of totals) {
      const perRequest = (ms: number) => Math.round((ms * 1000) / total.requests)
      console.log(
        `| ${name} | ${Math.round(total.rps)} | ${Math.round((total.rps / bare.rps) * 100)} % | ${perRequest(total.processMs)} | ${perRequest(total.postgresMs)} | ${perRequest(total.machineMs)} |`,
      )
    }
    await client.end()
  } finally {
    for (const child of children) child.kill('SIGTERM')
    await Promise.all(
      children.map((child) => new Promise((resolve) => (child.exitCode !== null ? resolve(null) : child.once('exit', resolve)))),
    )
    await database.stop()
  }
}
