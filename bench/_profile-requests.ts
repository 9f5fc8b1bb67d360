// Profiling aid for the API process (not run by `make bench`: files starting with _ are helpers).
// Loads the real API and the bare baseline of bench/records.ts, each in its own process, with
// GET one deal, a list of 50 deals and create a deal, and prints per scenario:
//   - CPU per request of each server process and of PostgreSQL behind it (user + system from /proc,
//     over unprofiled rounds; PostgreSQL's is every backend's, so read it for one side at a time),
//     and of the whole machine (/proc/stat: the load generator, the kernel's loopback and the
//     rest too), with the share of the cores left idle: what `make bench`'s req/s is made of;
//   - where the API process's time goes: a V8 CPU profile (the same sampler as `node --cpu-prof`,
//     started and stopped around the load through node:inspector, so start-up is not in it),
//     grouped by area (routing, our middleware, validation, auth, pg, slonik, ...), in µs per request.
// A sample whose function is Node's own (sockets, the HTTP parser, promises, crypto) is charged to
// the nearest caller in our code or a library when there is one, so `etagOf → crypto` counts under
// the records code; samples with no such caller (socket reads, the HTTP parser) form their own area.
//
//   node bench/_profile-requests.ts      env: BENCH_DEALS (20,000), SECONDS (4 per round), ROUNDS (3),
//                                        CONNECTIONS (20), ONLY (GET, list, create: comma-separated), TOP (15),
//                                        PROFILE_DIR (keeps the .cpuprofile files there, for DevTools),
//                                        LOG_LEVEL (info), SAMPLING_US (200)
//   COMPARE=../other-checkout node bench/_profile-requests.ts    also that tree's API, in turns with this one's
//   node bench/_profile-requests.ts --analyse <file.cpuprofile> <requests> <µs CPU per request>   a kept profile again
// The machine's load moves the figures: compare runs made in turns, and read them as indicative.
import { type ChildProcess, spawn } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { BENCH_APP_SECRET, machineCpuMs, postgresCpuMeter, processCpuMs, provision } from './_database.ts'

const SELF = fileURLToPath(import.meta.url)
const ROOT = fileURLToPath(new URL('..', import.meta.url))

type CpuProfile = {
  nodes: { id: number; callFrame: { functionName: string; url: string; lineNumber: number }; children?: number[] }[]
  samples: number[]
  timeDeltas: number[]
}

// ---------------------------------------------------------------------------------------------
// Child: the real API of the tree at `root` (this one, or another checkout to compare with), with
// profiling switched on and off by the parent over IPC. Logging at LOG_LEVEL (default info, as in
// production), to stdout, which the parent discards.
async function serveApi(databaseUrl: string, root: string): Promise<void> {
  const { Session } = await import('node:inspector/promises')
  const { loadConfig } = await import(join(root, 'src/config.ts'))
  const { createLogger } = await import(join(root, 'src/log.ts'))
  const { startService } = await import(join(root, 'src/service.ts'))
  const level = process.env.LOG_LEVEL ?? 'info'
  const config = loadConfig({
    DATABASE_URL: databaseUrl,
    PORT: '0',
    HOST: '127.0.0.1',
    APP_SECRET: BENCH_APP_SECRET,
    LOG_LEVEL: level,
    RATE_LIMIT_PER_MINUTE: '1000000',
  })
  const service = await startService({
    config,
    logger: createLogger(level),
    worker: false,
    migrate: false,
    database: { url: databaseUrl, description: 'bench', stop: async () => {} },
  })
  const session = new Session()
  session.connect()
  await session.post('Profiler.enable')
  await session.post('Profiler.setSamplingInterval', { interval: Number(process.env.SAMPLING_US ?? 200) })
  process.on('message', async (message: { do: 'start' | 'stop' }) => {
    if (message.do === 'start') {
      await session.post('Profiler.start')
      process.send!({ started: true })
    } else {
      const { profile } = await session.post('Profiler.stop')
      process.send!({ profile })
    }
  })
  process.send!({ url: service.url })
  process.on('SIGTERM', () => void service.stop().then(() => process.exit(0)))
}

// ---------------------------------------------------------------------------------------------
// Parent

type Scenario = { name: string; method: 'GET' | 'POST'; path: (ids: string[]) => string; body?: string }
const SCENARIOS: Scenario[] = [
  { name: 'GET one deal', method: 'GET', path: (ids) => `/api/deals/${ids[Math.floor(Math.random() * ids.length)]}` },
  { name: 'list 50 deals', method: 'GET', path: () => '/api/deals?filter[stage]=won&limit=50' },
  { name: 'create a deal', method: 'POST', path: () => '/api/deals', body: JSON.stringify({ name: 'Bench deal', amount: '1250.00' }) },
]

type AutocannonResult = { requests: { total: number }; errors: number; timeouts: number; non2xx: number }
const autocannon = (options: Record<string, unknown>) =>
  (createRequire(import.meta.url)('autocannon') as (options: Record<string, unknown>) => Promise<AutocannonResult>)(options)

async function load(url: string, scenario: Scenario, ids: string[], seconds: number, headers: Record<string, string>) {
  const result = await autocannon({
    url,
    connections: Number(process.env.CONNECTIONS ?? 20),
    duration: seconds,
    headers: { ...headers, ...(scenario.body ? { 'content-type': 'application/json' } : {}) },
    requests: [
      { method: scenario.method, setupRequest: (request: any) => ({ ...request, path: scenario.path(ids), body: scenario.body }) },
    ],
  })
  const failed = result.errors + result.timeouts + result.non2xx
  if (failed > 0) throw new Error(`${scenario.name}: ${failed} of ${result.requests.total} requests failed`)
  return result.requests.total
}

/**
 * CPU µs per request over one load round: of a process, and of PostgreSQL (every backend of its
 * server; NaN without a meter, see postgresCpuMeter).
 */
async function cpuPerRequest(
  pid: number,
  run: () => Promise<number>,
  postgresCpuMs: (() => number) | null = null,
): Promise<{ process: number; postgres: number; machine: number; idle: number; reads: number; writes: number }> {
  const before = processCpuMs(pid) ?? 0
  const ioBefore = systemCalls(pid)
  const postgresBefore = postgresCpuMs?.() ?? Number.NaN
  const machineBefore = machineCpuMs()
  const requests = await run()
  const machineAfter = machineCpuMs()
  const ioAfter = systemCalls(pid)
  const busy = machineAfter.busy - machineBefore.busy
  const idle = machineAfter.idle - machineBefore.idle
  return {
    process: (((processCpuMs(pid) ?? 0) - before) * 1000) / requests,
    postgres: (((postgresCpuMs?.() ?? Number.NaN) - postgresBefore) * 1000) / requests,
    machine: (busy * 1000) / requests,
    idle: (idle / (busy + idle)) * 100,
    reads: (ioAfter.reads - ioBefore.reads) / requests,
    writes: (ioAfter.writes - ioBefore.writes) / requests,
  }
}

/**
 * The read and write system calls a process has made (/proc/PID/io: syscr, syscw, sockets
 * included). On loopback a write to a socket carries the receiver's side of TCP too, so the count
 * of writes per request is a cost of its own beside the bytes.
 */
function systemCalls(pid: number): { reads: number; writes: number } {
  const io = readFileSync(`/proc/${pid}/io`, 'utf8')
  return { reads: Number(/syscr: (\d+)/.exec(io)?.[1]), writes: Number(/syscw: (\d+)/.exec(io)?.[1]) }
}

function startChild(args: string[], ipc: boolean): Promise<{ url: string; child: ChildProcess }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, {
      stdio: ['ignore', ipc ? 'ignore' : 'pipe', 'inherit', ...(ipc ? ['ipc' as const] : [])],
      cwd: ROOT,
    })
    if (ipc) child.once('message', (message: { url: string }) => resolve({ url: message.url, child }))
    else {
      let buffer = ''
      child.stdout!.on('data', (chunk: Buffer) => {
        buffer += chunk.toString()
        if (buffer.includes('\n')) resolve({ url: (JSON.parse(buffer.split('\n')[0]) as { url: string }).url, child })
      })
    }
    child.on('exit', (code) => reject(new Error(`${args.join(' ')} exited with ${code}`)))
  })
}

function ask<T>(child: ChildProcess, message: unknown): Promise<T> {
  return new Promise((resolve) => {
    child.once('message', (answer) => resolve(answer as T))
    child.send(message as never)
  })
}

/** The area a frame belongs to, or null for Node's own code (charged to its caller). */
function areaOf(url: string, functionName: string): string | null {
  if (functionName === '(garbage collector)') return 'garbage collection'
  if (functionName === '(program)') return 'V8 and native code outside JS functions'
  if (url === '' || url.startsWith('node:')) return null
  const at = url.indexOf('/node_modules/')
  if (at >= 0) {
    const name = url.slice(at + 14).split('/')
    const pkg = name[0].startsWith('@') ? `${name[0]}/${name[1]}` : name[0]
    if (pkg === 'polka' || pkg.startsWith('@polka/') || pkg === 'trouter' || pkg === 'regexparam') return 'polka routing'
    if (pkg.startsWith('pg') || pkg.startsWith('postgres-')) return 'pg driver (protocol, rows, type parsers)'
    if (pkg === 'slonik' || pkg.startsWith('@slonik/')) return 'slonik (query building, interceptors, pool)'
    if (pkg === 'typebox') return 'typebox (validation, row checks)'
    return `library ${pkg}`
  }
  // The path inside its tree (this one or COMPARE's).
  const file = /\/((?:src|workers|bench)\/.*)$/.exec(url)?.[1] ?? url
  if (file === 'src/log.ts') return 'logging (src/log.ts)'
  if (file.startsWith('src/auth/')) return 'authentication (src/auth: attempt, token hash, caller row)'
  if (file === 'src/http/route.ts') return 'body validation (src/http/route.ts)'
  if (file === 'src/http/body.ts') return 'body reading (src/http/body.ts)'
  if (SINGLE_STATEMENT_FILES.has(file)) return 'single-statement wrapper and its pool'
  if (file.startsWith('src/http/')) return `HTTP layer (${file.slice(9)})`
  if (file.startsWith('src/db/')) return `database code (${file.slice(4)})`
  if (file.startsWith('src/records/')) return 'records route work (src/records, routes)'
  if (file.startsWith('src/')) return file
  return `other ${file}`
}

/** The single statement's connection, pool and row checks, by their paths now and before src/db/request/ (a COMPARE tree). */
const SINGLE_STATEMENT_FILES = new Set([
  'src/db/request/statement-connection.ts',
  'src/db/request/statement-pool.ts',
  'src/db/request/rows.ts',
  'src/http/single-statement.ts',
  'src/db/statement-pool.ts',
])

/** The module group of Node's own code, for samples no caller in our code or a library owns. */
function nodeGroup(url: string, functionName: string): string {
  if (url === '') return `Node/V8 builtins (${functionName || 'anonymous'})`
  if (/_http_|node:http|httpparser|node:internal\/http/.test(url)) return 'Node http (parser, headers, writes)'
  if (/node:net|stream|node:internal\/net|socket/.test(url)) return 'Node sockets and streams'
  if (/task_queues|timers|async_hooks|promise/.test(url)) return 'Node event loop, timers, promises'
  return `Node ${url.replace('node:internal/', '').replace('node:', '')}`
}

/** Socket reads and writes (the system calls themselves): the work every server does, whoever calls it. */
const SOCKET_IO = new Set(['writev', 'writeUtf8String', 'writeBuffer', 'writeLatin1String', 'writeAsciiString', 'onStreamRead'])

/**
 * Self time by area. The sampler counts wall time, which on a loaded machine includes time the
 * thread was waiting for a core, so each area is given as its share of the profile applied to the
 * CPU per request measured from /proc over the same round.
 */
function analyse(profile: CpuProfile, requests: number, cpuMicros: number, top: number): string[] {
  const byId = new Map(profile.nodes.map((node) => [node.id, node]))
  const parent = new Map<number, number>()
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id)
  const areas = new Map<string, number>()
  const functions = new Map<string, number>()
  let busy = 0
  for (let index = 0; index < profile.samples.length; index++) {
    const micros = profile.timeDeltas[index + 1] ?? 0
    const leaf = byId.get(profile.samples[index])!
    if (leaf.callFrame.functionName === '(idle)') continue
    busy += micros
    let area: string | null = SOCKET_IO.has(leaf.callFrame.functionName) ? 'socket reads and writes (system calls)' : null
    for (let id: number | undefined = leaf.id; id !== undefined && area === null; id = parent.get(id)) {
      const frame = byId.get(id)!.callFrame
      if (frame.functionName === '(root)') break
      area = areaOf(frame.url, frame.functionName)
    }
    area ??= nodeGroup(leaf.callFrame.url, leaf.callFrame.functionName)
    areas.set(area, (areas.get(area) ?? 0) + micros)
    const where = `${leaf.callFrame.functionName || '(anonymous)'} ${leaf.callFrame.url.replace(`file://${ROOT}`, '').replace(/.*node_modules\//, '')}:${leaf.callFrame.lineNumber + 1}`
    functions.set(where, (functions.get(where) ?? 0) + micros)
  }
  const per = (micros: number) => ((micros / busy) * cpuMicros).toFixed(1)
  const lines = [
    `profiled round: ${requests} requests, ${cpuMicros.toFixed(0)} µs CPU per request (/proc); sampled ${(busy / requests).toFixed(0)} µs of busy main-thread wall time per request`,
    '',
    '| area | µs CPU / request | share |',
    '|---|---:|---:|',
  ]
  for (const [area, micros] of [...areas].sort((a, b) => b[1] - a[1])) {
    lines.push(`| ${area} | ${per(micros)} | ${((micros / busy) * 100).toFixed(1)} % |`)
  }
  lines.push('', `top ${top} functions by self time:`, '')
  for (const [where, micros] of [...functions].sort((a, b) => b[1] - a[1]).slice(0, top))
    lines.push(`  ${per(micros).padStart(6)} µs  ${where}`)
  return lines
}

async function main(): Promise<void> {
  const seconds = Number(process.env.SECONDS ?? 4)
  const rounds = Number(process.env.ROUNDS ?? 3)
  const dealCount = Number(process.env.BENCH_DEALS ?? 20_000)
  const top = Number(process.env.TOP ?? 15)
  const log = (line: string) => process.stderr.write(line + '\n')
  const database = await provision()
  const children: ChildProcess[] = []
  try {
    const { workspaceWithDeals } = await import('./records.ts')
    const { tenant, slug, admin, client, ids } = await workspaceWithDeals(database.url, dealCount, () => {})
    const postgresCpuMs = await postgresCpuMeter((text) => client.query(text))
    await client.end()

    // The API of this tree, and of COMPARE (another checkout, e.g. the code before a change) when set.
    const trees = [
      ...(process.env.COMPARE ? [{ label: `COMPARE (${process.env.COMPARE})`, root: process.env.COMPARE }] : []),
      { label: 'this tree', root: ROOT },
    ]
    const apis: { label: string; url: string; child: ChildProcess }[] = []
    for (const tree of trees) {
      const started = await startChild([SELF, '--serve-api', database.url, tree.root], true)
      children.push(started.child)
      apis.push({ label: tree.label, ...started })
    }
    const baseline = await startChild([join(ROOT, 'bench/records.ts'), '--serve-baseline', database.url, tenant.id, admin.id, '20'], false)
    children.push(baseline.child)
    const auth = { authorization: `Bearer ${admin.token}`, 'x-tenant-slug': slug }
    const output: string[] = []
    const median = (values: number[]) =>
      `median ${[...values].sort((a, b) => a - b)[Math.floor(values.length / 2)].toFixed(0)}, least ${Math.min(...values).toFixed(0)}`
    const range = (values: number[]) => values.map((value) => value.toFixed(0)).join(', ')
    for (const scenario of SCENARIOS.filter(
      (one) => !process.env.ONLY || process.env.ONLY.split(',').some((part) => one.name.startsWith(part)),
    )) {
      log(`${scenario.name}: warm-up, ${rounds} unprofiled rounds each side in turns, one profiled round per API`)
      for (const api of apis) await load(api.url, scenario, ids, 2, auth)
      await load(baseline.url, scenario, ids, 1, {})
      const apiCpu = apis.map(() => [] as number[])
      const apiPostgresCpu = apis.map(() => [] as number[])
      const apiMachine = apis.map(() => [] as number[])
      const apiIdle = apis.map(() => [] as number[])
      const apiCalls = apis.map(() => [] as string[])
      const baselineCalls: string[] = []
      const baselineCpu: number[] = []
      const baselinePostgresCpu: number[] = []
      const baselineMachine: number[] = []
      const baselineIdle: number[] = []
      for (let round = 0; round < rounds; round++) {
        const bare = await cpuPerRequest(baseline.child.pid!, () => load(baseline.url, scenario, ids, seconds, {}), postgresCpuMs)
        baselineCpu.push(bare.process)
        baselinePostgresCpu.push(bare.postgres)
        baselineMachine.push(bare.machine)
        baselineIdle.push(bare.idle)
        baselineCalls.push(`${bare.reads.toFixed(1)} / ${bare.writes.toFixed(1)}`)
        for (const [index, api] of apis.entries()) {
          const real = await cpuPerRequest(api.child.pid!, () => load(api.url, scenario, ids, seconds, auth), postgresCpuMs)
          apiCpu[index].push(real.process)
          apiPostgresCpu[index].push(real.postgres)
          apiMachine[index].push(real.machine)
          apiIdle[index].push(real.idle)
          apiCalls[index].push(`${real.reads.toFixed(1)} / ${real.writes.toFixed(1)}`)
        }
      }
      output.push(`## ${scenario.name}`, '', `CPU per request (/proc, user + system), rounds of ${seconds} s in turns:`, '')
      for (const [index, api] of apis.entries()) {
        output.push(`- API, ${api.label}: ${median(apiCpu[index])} µs (${range(apiCpu[index])})`)
        output.push(`  - its PostgreSQL: ${median(apiPostgresCpu[index])} µs (${range(apiPostgresCpu[index])})`)
        output.push(`  - the machine: ${median(apiMachine[index])} µs (${range(apiMachine[index])}), idle ${range(apiIdle[index])} %`)
        output.push(`  - its read / write system calls per request: ${apiCalls[index].join(', ')}`)
      }
      output.push(`- baseline: ${median(baselineCpu)} µs (${range(baselineCpu)})`)
      output.push(`  - its PostgreSQL: ${median(baselinePostgresCpu)} µs (${range(baselinePostgresCpu)})`)
      output.push(`  - the machine: ${median(baselineMachine)} µs (${range(baselineMachine)}), idle ${range(baselineIdle)} %`)
      output.push(`  - its read / write system calls per request: ${baselineCalls.join(', ')}`, '')
      for (const api of apis) {
        await ask(api.child, { do: 'start' })
        let requests = 0
        const { process: profiledCpu } = await cpuPerRequest(api.child.pid!, async () => {
          requests = await load(api.url, scenario, ids, seconds, auth)
          return requests
        })
        const { profile } = await ask<{ profile: CpuProfile }>(api.child, { do: 'stop' })
        if (process.env.PROFILE_DIR) {
          mkdirSync(process.env.PROFILE_DIR, { recursive: true })
          const name = `${scenario.name.replaceAll(' ', '-')}${api === apis.at(-1) ? '' : '.compare'}.cpuprofile`
          writeFileSync(join(process.env.PROFILE_DIR, name), JSON.stringify(profile))
        }
        output.push(`### API, ${api.label}`, '', ...analyse(profile, requests, profiledCpu, top), '')
      }
    }
    process.stdout.write(output.join('\n') + '\n')
  } finally {
    await Promise.all(
      children.map(
        (child) =>
          new Promise((resolve) => {
            if (child.exitCode !== null) return resolve(null)
            child.once('exit', resolve)
            child.kill('SIGTERM')
            setTimeout(resolve, 5000).unref()
          }),
      ),
    )
    await database.stop()
  }
}

const [mode, ...args] = process.argv.slice(2)
if (mode === '--serve-api') await serveApi(args[0], args[1])
else if (mode === '--analyse') {
  // A kept profile again: node bench/_profile-requests.ts --analyse file.cpuprofile <requests> <µs CPU per request>
  const profile = JSON.parse(readFileSync(args[0], 'utf8')) as CpuProfile
  process.stdout.write(analyse(profile, Number(args[1]), Number(args[2]), Number(process.env.TOP ?? 15)).join('\n') + '\n')
} else await main()
