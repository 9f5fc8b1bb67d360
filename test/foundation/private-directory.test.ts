// Run as root from a checkout inside a private (mode 700) directory, the embedded PostgreSQL, which
// runs as the postgres system user, cannot reach the binaries or the data there: provisioning
// places both where that user can reach them, and says so in one line.
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import t from 'tap'
import { packagedBinaries } from '../../src/db/postgres-user-reach.ts'
import { startEmbeddedPostgres } from '../../src/db/provision.ts'

if (process.getuid?.() !== 0) {
  t.comment('not root: the embedded PostgreSQL runs as the current user, and a private directory is no obstacle')
  t.pass('skipped: not running as root')
} else {
  t.test('binaries and data under a mode-700 directory', async (t) => {
    const privateDir = mkdtempSync(join(tmpdir(), 'crm-private-'))
    t.teardown(() => rmSync(privateDir, { recursive: true, force: true }))
    chmodSync(privateDir, 0o700)
    const checkout = join(privateDir, 'checkout')
    mkdirSync(checkout)
    const nativeDir = join(checkout, 'native')
    cpSync(packagedBinaries(), nativeDir, { recursive: true, verbatimSymlinks: true })
    const baseDir = join(checkout, '.data')

    const lines: string[] = []
    const database = await startEmbeddedPostgres({
      baseDir,
      database: 'crm',
      persistent: false,
      durability: 'none',
      nativeDir,
      log: (line) => lines.push(line),
    })
    let stopped = false
    t.teardown(async () => {
      if (!stopped) await database.stop()
    })
    const placed = lines.filter((line) => line.includes('cannot reach'))
    t.equal(placed.length, 1, 'one line says where PostgreSQL runs instead')
    t.match(placed[0], /cannot reach .*checkout.*: PostgreSQL runs with its binaries copied to \S+ and its data kept in \S+/)
    t.equal(database.notice, placed[0], 'and is handed back for the caller to show (test/run.ts prints it)')
    t.notMatch(database.description, privateDir, 'the cluster is outside the private directory')

    const client = new pg.Client({ connectionString: database.url })
    await client.connect()
    const { rows } = await client.query('select current_database() as name')
    await client.end()
    t.equal(rows[0].name, 'crm', 'the server answers')

    const clusterDir = /data in (\S+)/.exec(database.description)?.[1] ?? ''
    t.ok(existsSync(clusterDir), `the cluster lives in ${clusterDir}`)
    await database.stop()
    stopped = true
    t.notOk(existsSync(clusterDir), 'a throwaway cluster placed elsewhere is removed on stop')
  })
}
