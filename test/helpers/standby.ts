// A throwaway primary and a streaming standby made from it with `pg_basebackup -R`, from the
// system's PostgreSQL 15 server binaries (the embedded build has no pg_basebackup), in a temporary
// directory on free ports, migrated, with the runtime login role. As root, the servers run as the
// postgres system user (PostgreSQL refuses root). Used by the replica tests and the bench.
import { type SpawnSyncOptions, spawnSync } from 'node:child_process'
import { chmodSync, existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import { migrate } from '../../src/db/migrate.ts'
import { freePort } from '../../src/db/provision.ts'
import { ensureRuntimeRole } from '../../src/db/runtime-role.ts'
import { startTestServer, type TestServer } from './server.ts'
import { until } from './until.ts'

export { until }

const BIN = '/usr/lib/postgresql/15/bin'
const NEEDED = ['initdb', 'pg_ctl', 'postgres', 'pg_basebackup', 'pg_resetwal']

/** The binaries that are missing (empty: a standby can be made here). */
export function missingStandbyBinaries(): string[] {
  return NEEDED.filter((name) => !existsSync(join(BIN, name))).map((name) => join(BIN, name))
}

const asRoot = process.getuid?.() === 0

function run(command: string, args: string[], options: SpawnSyncOptions = {}): string {
  const [file, argv] = asRoot ? ['runuser', ['-u', 'postgres', '--', join(BIN, command), ...args]] : [join(BIN, command), args]
  const result = spawnSync(file, argv, { encoding: 'utf8', ...options })
  if (result.status !== 0) throw new Error(`${command} ${args.join(' ')} failed: ${result.stderr}${result.stdout}`)
  return String(result.stdout)
}

export type Cluster = { dir: string; port: number; url: (database: string) => string }

function cluster(dir: string, port: number): Cluster {
  return { dir, port, url: (database) => `postgres://postgres@127.0.0.1:${port}/${database}` }
}

/** Starts a server; `extra` settings (`-c name=value`) come last and override the defaults here. */
export function startCluster(node: Cluster, extra: string[] = []): void {
  const settings = [
    `-p ${node.port}`,
    `-k ${node.dir}`,
    '-c listen_addresses=127.0.0.1',
    '-c wal_level=replica',
    '-c max_wal_senders=4',
    '-c hot_standby=on',
    '-c hot_standby_feedback=on',
    '-c fsync=off',
    '-c max_connections=100',
    ...extra,
  ].join(' ')
  run('pg_ctl', ['-D', join(node.dir, 'data'), '-o', settings, '-l', join(node.dir, 'log'), '-w', 'start'])
}

export function stopCluster(node: Cluster): void {
  if (existsSync(join(node.dir, 'data', 'postmaster.pid'))) run('pg_ctl', ['-D', join(node.dir, 'data'), '-m', 'immediate', '-w', 'stop'])
}

export function promoteCluster(node: Cluster): void {
  run('pg_ctl', ['-D', join(node.dir, 'data'), '-w', 'promote'])
}

export async function query(url: string, text: string, values: unknown[] = []): Promise<pg.QueryResult> {
  const client = new pg.Client({ connectionString: url })
  client.on('error', () => {})
  await client.connect()
  try {
    return await client.query(text, values)
  } finally {
    await client.end()
  }
}

export type StandbyPair = {
  primary: Cluster
  standby: Cluster
  /** The owner on the primary (migrations, fixtures). */
  ownerUrl: string
  /** The runtime login role on the primary, and the same role on the standby. */
  runtimeUrl: string
  replicaUrl: string
  /** A superuser on the standby (pausing replay). */
  standbyAdmin: string
  pauseReplay: () => Promise<unknown>
  resumeReplay: () => Promise<unknown>
  /** Waits until the standby has replayed everything the primary has written so far. */
  caughtUp: () => Promise<void>
  stop: () => void
}

/**
 * `walStartSegment`: the WAL segment the pair's primary starts at (`pg_resetwal -l`, before its first
 * start), for a test that needs the pair's WAL position past another cluster's without writing the
 * WAL in between.
 */
export async function startStandbyPair(appSecret: string, options: { walStartSegment?: string } = {}): Promise<StandbyPair> {
  const base = mkdtempSync(join(tmpdir(), 'crm-replica-'))
  if (asRoot) chmodSync(base, 0o777)
  const primary = cluster(join(base, 'primary'), await freePort())
  const standby = cluster(join(base, 'standby'), await freePort())
  const stop = () => {
    for (const node of [standby, primary]) {
      try {
        stopCluster(node)
      } catch {}
    }
    rmSync(base, { recursive: true, force: true })
  }
  try {
    for (const dir of [primary.dir, standby.dir]) {
      spawnSync(asRoot ? 'runuser' : 'mkdir', asRoot ? ['-u', 'postgres', '--', 'mkdir', '-p', dir] : ['-p', dir])
    }
    run('initdb', ['-D', join(primary.dir, 'data'), '-U', 'postgres', '--auth=trust', '--no-sync', '-E', 'UTF8', '--locale=C'])
    if (options.walStartSegment) run('pg_resetwal', ['-l', options.walStartSegment, join(primary.dir, 'data')])
    startCluster(primary)
    await query(primary.url('postgres'), 'create database crm')
    const ownerUrl = primary.url('crm')
    await migrate(ownerUrl)
    const runtimeUrl = await ensureRuntimeRole(ownerUrl, appSecret)
    const baseBackup = ['-h', '127.0.0.1', '-p', String(primary.port), '-U', 'postgres', '-D', join(standby.dir, 'data')]
    run('pg_basebackup', [...baseBackup, '-R', '-X', 'stream', '--checkpoint=fast'])
    startCluster(standby)
    const replica = new URL(runtimeUrl)
    replica.port = String(standby.port)
    const replicaUrl = replica.toString()
    const standbyAdmin = standby.url('crm')
    await until('the standby answers as the runtime role', async () => (await query(replicaUrl, 'select 1')).rowCount === 1)
    const caughtUp = async () => {
      const want = (await query(ownerUrl, 'select pg_current_wal_lsn() as lsn')).rows[0].lsn
      await until('the standby replays everything', async () => {
        return (await query(standbyAdmin, 'select pg_last_wal_replay_lsn() >= $1::pg_lsn as ok', [want])).rows[0].ok
      })
    }
    return {
      primary,
      standby,
      ownerUrl,
      runtimeUrl,
      replicaUrl,
      standbyAdmin,
      pauseReplay: () => query(standbyAdmin, 'select pg_wal_replay_pause()'),
      resumeReplay: () => query(standbyAdmin, 'select pg_wal_replay_resume()'),
      caughtUp,
      stop,
    }
  } catch (error) {
    stop()
    throw error
  }
}

/**
 * An API server on the pair's primary (through the runtime role) with the standby as its read
 * replica under `maxLagMs`, once its routing has seen the standby serve.
 */
export async function serveWithStandby(
  t: Parameters<typeof startTestServer>[0],
  pair: Pick<StandbyPair, 'ownerUrl' | 'runtimeUrl' | 'replicaUrl'>,
  maxLagMs: number,
): Promise<TestServer> {
  const service = await startTestServer(t, {
    databaseUrl: pair.ownerUrl,
    env: {
      RUNTIME_DATABASE_URL: pair.runtimeUrl,
      READ_REPLICA_URLS: pair.replicaUrl,
      READ_REPLICA_MAX_LAG_MS: String(maxLagMs),
      RATE_LIMIT_PER_MINUTE: '1000000',
    },
  })
  await until('the standby serves', async () => {
    await service.readRouting?.check()
    return service.readRouting?.report()[0].state === 'serving'
  })
  return service
}
