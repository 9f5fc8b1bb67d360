// `make bench`: runs every benchmark in bench/ (each prints a markdown section with its baseline
// measured in the same run) and writes bench/RESULTS.md with the machine it ran on, then the results
// table of docs/performance.md from it (bench/_summary.ts).
import { spawnSync } from 'node:child_process'
import { existsSync, readdirSync, writeFileSync } from 'node:fs'
import { cpus, totalmem } from 'node:os'
import { fileURLToPath } from 'node:url'
import { writeSummary } from './_summary.ts'

const here = fileURLToPath(new URL('.', import.meta.url))
const only = process.argv.slice(2)
const files = readdirSync(here)
  .filter((name) => name.endsWith('.ts') && name !== 'run.ts' && !name.startsWith('_'))
  .filter((name) => only.length === 0 || only.some((wanted) => name.includes(wanted)))
  .sort()

// The request path is measured on the oldest supported PostgreSQL too when its server is installed
// (Debian's postgresql-15): PostgreSQL before 18 plans non-inlined SQL functions on every call.
const OLDEST_SUPPORTED = '/usr/lib/postgresql/15'
const runs: { file: string; env: Record<string, string> }[] = files.map((file) => ({ file, env: {} }))
if (!process.env.DATABASE_URL && existsSync(`${OLDEST_SUPPORTED}/bin/postgres`) && files.includes('records.ts')) {
  runs.push({ file: 'records.ts', env: { BENCH_POSTGRES_DIR: OLDEST_SUPPORTED } })
}

const sections: string[] = []
let failed = 0
for (const { file, env } of runs) {
  console.log(`\n=== bench/${file}${env.BENCH_POSTGRES_DIR ? ` on ${env.BENCH_POSTGRES_DIR}` : ''}`)
  const started = Date.now()
  const result = spawnSync(process.execPath, [`${here}${file}`], {
    stdio: ['ignore', 'pipe', 'inherit'],
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
    timeout: 30 * 60_000,
    env: { ...process.env, ...env },
  })
  process.stdout.write(result.stdout ?? '')
  if (result.status !== 0) {
    failed++
    sections.push(`## ${file}\n\nFailed (exit ${result.status}); see the console output.\n`)
  } else {
    sections.push(`${(result.stdout ?? '').trim()}\n\n_${file}: ${Math.round((Date.now() - started) / 1000)} s_\n`)
  }
}

const machine = [
  `- CPU: ${cpus()[0]?.model ?? 'unknown'} × ${cpus().length}`,
  `- memory: ${Math.round(totalmem() / 2 ** 30)} GiB`,
  `- Node ${process.versions.node}, ${process.platform}/${process.arch}`,
  `- date: ${new Date().toISOString().slice(0, 10)}`,
].join('\n')

if (only.length === 0) {
  writeFileSync(
    `${here}RESULTS.md`,
    `# Benchmark results\n\nWritten by \`make bench\`. Each section compares the service with a bare baseline measured in the same run on the same machine.\n\n## Machine\n\n${machine}\n\n${sections.join('\n')}`,
  )
  writeSummary()
  console.log('\nwrote bench/RESULTS.md and the table of docs/performance.md')
}
process.exitCode = failed ? 1 : 0
