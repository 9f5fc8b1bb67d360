// Shared by the benchmarks: the database one runs against (DATABASE_URL when set, otherwise a
// throwaway embedded PostgreSQL with fsync off; the baseline in the same run uses the same server,
// so ratios are fair), CPU time read from /proc, and the contacts file the import benchmarks land.
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type pg from 'pg'
import type { inspectCsv } from '../src/imports/csv-file.ts'

export async function provision(): Promise<{ url: string; stop: () => Promise<void>; label: string }> {
  if (process.env.DATABASE_URL) return { url: process.env.DATABASE_URL, stop: async () => {}, label: 'DATABASE_URL' }
  const { startEmbeddedPostgres } = await import('../src/db/provision.ts')
  const baseDir = mkdtempSync(join(tmpdir(), 'crm-bench-'))
  // BENCH_POSTGRES_DIR: another PostgreSQL build (bin/ holding initdb, pg_ctl, postgres), such as
  // Debian's /usr/lib/postgresql/15, in a throwaway cluster of its own (bench/run.ts sets it).
  const nativeDir = process.env.BENCH_POSTGRES_DIR || undefined
  const database = await startEmbeddedPostgres({ baseDir, database: 'crm_bench', persistent: false, durability: 'none', nativeDir })
  return {
    url: database.url,
    label: nativeDir ? `${nativeDir}, throwaway cluster (fsync off)` : 'embedded PostgreSQL (fsync off)',
    stop: async () => {
      await database.stop()
      rmSync(baseDir, { recursive: true, force: true })
    },
  }
}

/**
 * The V8 flags the benchmarks start the API's process with: the service's own (SERVICE_NODE_FLAGS,
 * which `make bench` passes from the Makefile, where `make run` takes them too), or BENCH_NODE_FLAGS
 * to try others. Empty when neither is set (a benchmark run directly, not through make).
 */
export const API_NODE_FLAGS: string[] = (process.env.BENCH_NODE_FLAGS ?? process.env.SERVICE_NODE_FLAGS ?? '').split(' ').filter(Boolean)

/** How a report names the flags the API ran with. */
export const apiNodeFlagsLabel = (): string => (API_NODE_FLAGS.length === 0 ? 'no V8 flags' : `\`node ${API_NODE_FLAGS.join(' ')}\``)

/** The app secret every benchmark's service runs with (long enough for the config's check). */
export const BENCH_APP_SECRET = 'bench-app-secret-that-is-long-enough-0123456789'

/** The real API (no worker) in this process on a free port, silent and without a rate limit worth the name. */
export async function startBenchApi(databaseUrl: string, env: Record<string, string> = {}) {
  const { loadConfig } = await import('../src/config.ts')
  const { createLogger } = await import('../src/log.ts')
  const { startService } = await import('../src/service.ts')
  const config = loadConfig({
    DATABASE_URL: databaseUrl,
    PORT: '0',
    HOST: '127.0.0.1',
    APP_SECRET: BENCH_APP_SECRET,
    LOG_LEVEL: 'silent',
    RATE_LIMIT_PER_MINUTE: '1000000',
    ...env,
  })
  return startService({
    config,
    logger: createLogger('silent'),
    worker: false,
    migrate: false,
    database: { url: databaseUrl, description: 'bench', stop: async () => {} },
  })
}

/** Migrates the database and makes a fresh workspace with one admin (and an API token for it). */
export async function benchWorkspace(url: string) {
  const { migrate } = await import('../src/db/migrate.ts')
  await migrate(url)
  const { createTenant } = await import('../test/helpers/fixtures.ts')
  const slug = `bench-${Date.now().toString(36)}`
  const tenant = await createTenant(url, { slug, members: { [`admin@${slug}.test`]: 'admin' } })
  return { tenant, slug, admin: tenant.members[`admin@${slug}.test`] }
}

/**
 * CPU time (user + system, ms) used so far by the PostgreSQL server behind `url`: the postmaster
 * and every process it started, those that have exited included (the postmaster reaps its backends,
 * so their CPU moves into its children's times, which are added): a backend that closes during a
 * phase neither vanishes from the sum nor makes it go backwards. Linux only; null elsewhere or
 * without the rights to read data_directory.
 */
export async function postgresCpuMeter(
  query: (text: string) => Promise<{ rows: { [key: string]: unknown }[] }>,
): Promise<(() => number) | null> {
  try {
    const {
      rows: [row],
    } = await query('show data_directory')
    const postmaster = Number(readFileSync(join(String(row.data_directory), 'postmaster.pid'), 'utf8').split('\n')[0])
    return () => {
      const own = procStat(postmaster)
      let ms = own === null ? 0 : own.cpuMs + own.childrenCpuMs
      for (const entry of readdirSync('/proc')) {
        if (!/^\d+$/.test(entry)) continue
        const stat = procStat(Number(entry))
        if (stat !== null && stat.ppid === postmaster) ms += stat.cpuMs
      }
      return ms
    }
  } catch {
    return null
  }
}

/**
 * CPU time (user + system, ms) a process has used, from /proc; null when there is no such local
 * process (it is gone, or the pid is a remote database's backend).
 */
export function processCpuMs(pid: number): number | null {
  return procStat(pid)?.cpuMs ?? null
}

const CLOCK_TICKS_PER_SECOND = 100

function procStat(pid: number): { ppid: number; cpuMs: number; childrenCpuMs: number } | null {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // The command name is in parentheses and may hold spaces: count fields after the last ')'.
    const fields = text.slice(text.lastIndexOf(')') + 2).split(' ')
    const ms = (ticks: number) => (ticks * 1000) / CLOCK_TICKS_PER_SECOND
    // utime and stime, then cutime and cstime: the children it has waited for.
    return {
      ppid: Number(fields[1]),
      cpuMs: ms(Number(fields[11]) + Number(fields[12])),
      childrenCpuMs: ms(Number(fields[13]) + Number(fields[14])),
    }
  } catch {
    return null
  }
}

/**
 * A contacts CSV file as other tools export them: a quoted comma and non-ASCII text in every row,
 * 1,000 companies named in the Company column.
 */
export function contactsFile(rows: number): string {
  const lines = ['First Name,Last Name,Email,Phone,Job Title,City,Country,Company']
  for (let i = 1; i <= rows; i++) {
    lines.push(
      `Ann${i},"O'Neil, Jr.",ann${i}@example.com,+1 555 010 ${String(i % 10000).padStart(4, '0')},Engineer,Zürich,Switzerland,"Company ${i % 1000}, Inc."`,
    )
  }
  return lines.join('\n') + '\n'
}

/**
 * The bench's contacts file as an import queued to run (what the upload and the start of
 * docs/api.md section 6 leave behind), with the upload's inspection and mapping: created on
 * email, not a dry run. Returns the import's id.
 */
export async function queueContactsImport(
  client: pg.Client,
  owner: { workspaceId: string; userId: string },
  bytes: Buffer,
  inspection: ReturnType<typeof inspectCsv>,
  mapping: Record<string, string | null>,
): Promise<string> {
  const { rows } = await client.query(
    `insert into crm.imports (workspace_id, user_id, record_type, file_name, file_bytes, file_size, delimiter, columns, row_count, sample_rows, suggested_mapping,
                              status, mapping, mode, match_on, dry_run)
     values ($1, $2, 'contacts', 'contacts.csv', $3, $4, ',', $5, $6, $7, $8, 'queued', $8, 'create', 'email', false) returning id`,
    [
      owner.workspaceId,
      owner.userId,
      bytes,
      bytes.length,
      inspection.columns,
      inspection.rowCount,
      JSON.stringify(inspection.sampleRows),
      JSON.stringify(mapping),
    ],
  )
  return rows[0].id as string
}

/** CPU time of every core since boot (/proc/stat, ms): busy (user, system, interrupts, steal) and idle (with iowait). */
export function machineCpuMs(): { busy: number; idle: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1, 9).map(Number)
  const [user, nice, system, idle, iowait, irq, softirq, steal] = fields
  return { busy: ((user + nice + system + irq + softirq + steal) * 1000) / 100, idle: ((idle + iowait) * 1000) / 100 }
}
