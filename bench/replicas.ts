// Reads on a streaming standby (READ_REPLICA_URLS): a throwaway primary and a standby made with
// `pg_basebackup -R` (test/helpers/standby.ts), the real API in this process with and without the
// standby, and for each: list and GET one throughput, and the CPU the primary's and the standby's
// PostgreSQL processes spent per 1,000 reads; export throughput (every deal as CSV, one export
// after another) and the CPU each server spent per export. On a 2-core machine the point is the
// primary's share, not a higher total: the standby competes for the same cores. Then the standby's
// replay lag (pg_stat_replication.replay_lag, sampled every 100 ms) while the API creates deals.
//
//   node bench/replicas.ts                 prints a markdown report
//   BENCH_SECONDS=5 node bench/replicas.ts a quicker run
//   BENCH_REPLICA_EXPORTS=3 node bench/replicas.ts   fewer exports per setup (default 10)
import { createRequire } from 'node:module'
import { createTenant } from '../test/helpers/fixtures.ts'
import { missingStandbyBinaries, query, startStandbyPair } from '../test/helpers/standby.ts'
import { BENCH_APP_SECRET, postgresCpuMeter, startBenchApi } from './_database.ts'

type AutocannonResult = { requests: { average: number; total: number }; latency: { p99: number }; errors: number; non2xx: number }
const autocannon = (options: Record<string, unknown>) =>
  (createRequire(import.meta.url)('autocannon') as (options: Record<string, unknown>) => Promise<AutocannonResult>)(options)

const SECONDS = Number(process.env.BENCH_SECONDS ?? 10)
const DEALS = Number(process.env.BENCH_REPLICA_DEALS ?? 20_000)
const CONNECTIONS = 20
const EXPORTS = Number(process.env.BENCH_REPLICA_EXPORTS ?? 10)

const missing = missingStandbyBinaries()
if (missing.length > 0) {
  console.log(`## Read replicas\n\nSkipped: ${missing.join(', ')} missing (apt-get install postgresql-15).`)
} else {
  await main()
}

async function main(): Promise<void> {
  const pair = await startStandbyPair(BENCH_APP_SECRET)
  try {
    const tenant = await createTenant(pair.ownerUrl, { slug: 'bench-replicas', members: { 'admin@bench.test': 'admin' } })
    const admin = tenant.members['admin@bench.test']
    await query(
      pair.ownerUrl,
      `insert into crm.deals (workspace_id, owner_id, created_by, updated_by, name, amount, stage)
       select $1, $2, $2, $2, 'Deal ' || g, (g % 100000)::numeric / 4,
              (array['lead', 'qualified', 'proposal', 'negotiation', 'won', 'lost'])[1 + g % 6]
         from generate_series(1, $3::int) as g`,
      [tenant.id, admin.id, DEALS],
    )
    await query(pair.ownerUrl, 'vacuum analyze crm.deals')
    const ids = (await query(pair.ownerUrl, 'select id from crm.deals limit 1000')).rows.map((row) => row.id as string)
    await pair.caughtUp()
    const primaryCpu = await postgresCpuMeter((text) => query(pair.ownerUrl, text))
    const standbyCpu = await postgresCpuMeter((text) => query(pair.standbyAdmin, text))
    const headers = { authorization: `Bearer ${admin.token}` }
    const scenarios = [
      { name: 'list 50 deals, filter[stage]=won', path: () => '/api/deals?filter[stage]=won&limit=50' },
      { name: 'GET one deal', path: () => `/api/deals/${ids[Math.floor(Math.random() * ids.length)]}` },
    ]
    const lines = [
      '## Read replicas',
      '',
      `${DEALS.toLocaleString('en')} deals, ${CONNECTIONS} connections, ${SECONDS} s per row; the API and the load generator share this process. CPU: the PostgreSQL server's processes, per 1,000 reads.`,
      '',
      '| setup | scenario | req/s | p99 ms | primary CPU ms / 1,000 reads | standby CPU ms / 1,000 reads | reads on the standby |',
      '|---|---|---|---|---|---|---|',
    ]
    const exportLines = [
      '',
      `Exports: every deal (${DEALS.toLocaleString('en')} rows, CSV, every field), ${EXPORTS} one after another per setup; CPU: each PostgreSQL server's processes, per export.`,
      '',
      '| setup | rows/s | primary CPU ms / export | standby CPU ms / export | exports on the standby |',
      '|---|---|---|---|---|',
    ]
    for (const withReplica of [false, true]) {
      const service = await startBenchApi(pair.ownerUrl, {
        RUNTIME_DATABASE_URL: pair.runtimeUrl,
        ...(withReplica ? { READ_REPLICA_URLS: pair.replicaUrl } : {}),
      })
      try {
        // The token's first request authenticates in full on the primary; the rest resume.
        await fetch(`${service.url}/api/deals?limit=1`, { headers })
        for (const scenario of scenarios) {
          const readsBefore = service.readRouting?.report()[0].reads ?? 0
          const [p0, s0] = [primaryCpu?.() ?? 0, standbyCpu?.() ?? 0]
          const result = await autocannon({
            url: service.url,
            connections: CONNECTIONS,
            duration: SECONDS,
            headers,
            requests: [{ method: 'GET', setupRequest: (request: Record<string, unknown>) => ({ ...request, path: scenario.path() }) }],
          })
          const [p1, s1] = [primaryCpu?.() ?? 0, standbyCpu?.() ?? 0]
          const total = result.requests.total
          const onStandby = (service.readRouting?.report()[0].reads ?? 0) - readsBefore
          const per = (ms: number) => (total > 0 ? ((ms * 1000) / total).toFixed(0) : '–')
          lines.push(
            `| ${withReplica ? 'one standby' : 'primary only'} | ${scenario.name} | ${result.requests.average.toFixed(0)} | ${result.latency.p99} | ${per(p1 - p0)} | ${per(s1 - s0)} | ${total > 0 ? Math.min(100, (100 * onStandby) / total).toFixed(0) : 0} %${result.errors + result.non2xx > 0 ? ` (${result.errors + result.non2xx} errors)` : ''} |`,
          )
        }
        {
          const exportsBefore = service.readRouting?.report()[0].long_reads ?? 0
          const [p0, s0] = [primaryCpu?.() ?? 0, standbyCpu?.() ?? 0]
          const started = performance.now()
          let rows = 0
          for (let i = 0; i < EXPORTS; i++) {
            const response = await fetch(`${service.url}/api/deals/export`, {
              method: 'POST',
              headers: { ...headers, 'content-type': 'application/json' },
              body: '{}',
            })
            if (response.status !== 200) throw new Error(`export answered ${response.status}: ${await response.text()}`)
            const text = await response.text()
            // Lines after the header row (a quoted cell may hold a line break; these names do not).
            rows += text.split('\r\n').length - 2
          }
          const seconds = (performance.now() - started) / 1000
          const [p1, s1] = [primaryCpu?.() ?? 0, standbyCpu?.() ?? 0]
          const onStandby = (service.readRouting?.report()[0].long_reads ?? 0) - exportsBefore
          exportLines.push(
            `| ${withReplica ? 'one standby' : 'primary only'} | ${(rows / seconds).toFixed(0)} | ${((p1 - p0) / EXPORTS).toFixed(0)} | ${((s1 - s0) / EXPORTS).toFixed(0)} | ${onStandby} of ${EXPORTS} |`,
          )
        }
        if (withReplica) {
          // Replay lag while the API creates deals as fast as it can.
          const lags: number[] = []
          let sampling = true
          const sampler = (async () => {
            while (sampling) {
              const { rows } = await query(
                pair.ownerUrl,
                'select coalesce(extract(epoch from replay_lag) * 1000, 0)::float8 as ms from pg_stat_replication',
              )
              if (rows[0]) lags.push(Number(rows[0].ms))
              await new Promise((resolve) => setTimeout(resolve, 100))
            }
          })()
          const created = await autocannon({
            url: service.url,
            connections: CONNECTIONS,
            duration: SECONDS,
            headers: { ...headers, 'content-type': 'application/json' },
            requests: [{ method: 'POST', path: '/api/deals', body: JSON.stringify({ name: 'Bench deal', amount: '1250.00' }) }],
          })
          sampling = false
          await sampler
          lags.sort((a, b) => a - b)
          const at = (q: number) => (lags.length ? lags[Math.min(lags.length - 1, Math.floor(q * lags.length))].toFixed(1) : '–')
          lines.push(
            '',
            `Replay lag while the API created ${created.requests.average.toFixed(0)} deals/s (${lags.length} samples of \`pg_stat_replication.replay_lag\`): median ${at(0.5)} ms, p99 ${at(0.99)} ms, max ${at(1)} ms.`,
          )
        }
      } finally {
        await service.stop()
      }
    }
    console.log([...lines, ...exportLines].join('\n'))
  } finally {
    pair.stop()
  }
}
