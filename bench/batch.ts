// Batch routes (docs/api.md section 5a) against single requests in the same run: records per second
// of single creates, batch creates of 100 and batch upserts of 100 (match_on email, half of each
// batch updating contacts that exist, half creating new ones), through the real API.
//
//   node bench/batch.ts                          prints a markdown section (DATABASE_URL, or an embedded PostgreSQL)
//   BENCH_SECONDS=2 node bench/batch.ts          a quicker run
//
// The service runs in this process: the load is a few fetch loops, far lighter than the service.
import { benchWorkspace, provision, startBenchApi } from './_database.ts'

const CONCURRENCY = 8
const BATCH = 100

type Scenario = { name: string; path: string; records: number; request: (n: number) => { path: string; body: unknown } }

async function measure(
  url: string,
  headers: Record<string, string>,
  scenario: Scenario,
  seconds: number,
): Promise<{ recordsPerSecond: number; failed: number; requests: number }> {
  const deadline = performance.now() + seconds * 1000
  const started = performance.now()
  let requests = 0
  let failed = 0
  let counter = 0
  const worker = async () => {
    while (performance.now() < deadline) {
      const { path, body } = scenario.request(counter++)
      const response = await fetch(`${url}${path}`, { method: 'POST', headers, body: JSON.stringify(body) })
      const answer = (await response.json()) as { counts?: { failed: number } }
      if (!response.ok || (answer.counts?.failed ?? 0) > 0) failed++
      requests++
    }
  }
  await Promise.all(Array.from({ length: CONCURRENCY }, worker))
  return { recordsPerSecond: (requests * scenario.records) / ((performance.now() - started) / 1000), failed, requests }
}

export async function benchBatch(seconds = Number(process.env.BENCH_SECONDS ?? 10)): Promise<string> {
  const database = await provision()
  try {
    const { slug, admin } = await benchWorkspace(database.url)
    const service = await startBenchApi(database.url)
    const headers = { authorization: `Bearer ${admin.token}`, 'x-tenant-slug': slug, 'content-type': 'application/json' }
    const run = Date.now().toString(36)
    const contacts = (n: number, offset = 0) =>
      Array.from({ length: BATCH }, (_, index) => ({ first_name: 'Bench', email: `c${n}-${index + offset}@${run}.test` }))
    // Upsert batch n updates 50 contacts of a batch the batch-create row made and creates 50 new ones.
    let created = 1
    const upsertInputs = (n: number) =>
      Array.from({ length: BATCH }, (_, index) => ({
        email: index < 50 ? `c${n % created}-${index + 1}@${run}.test` : `u${n}-${index}@${run}.test`,
        job_title: `n${n}`,
      }))
    const scenarios: Scenario[] = [
      {
        name: 'single creates (POST /api/contacts)',
        path: 'single',
        records: 1,
        request: (n) => ({ path: '/api/contacts', body: contacts(n)[0] }),
      },
      {
        name: `batch create of ${BATCH}`,
        path: 'create',
        records: BATCH,
        request: (n) => ({ path: '/api/contacts/batch/create', body: { inputs: contacts(n, 1) } }),
      },
      {
        name: `batch upsert of ${BATCH} (match_on email, half updates)`,
        path: 'upsert',
        records: BATCH,
        request: (n) => ({ path: '/api/contacts/batch/upsert', body: { match_on: 'email', inputs: upsertInputs(n) } }),
      },
    ]
    const results = []
    for (const scenario of scenarios) {
      process.stderr.write(`${scenario.name}: ${seconds} s, ${CONCURRENCY} concurrent requests\n`)
      const result = await measure(service.url, headers, scenario, seconds)
      results.push({ scenario, ...result })
      if (scenario.path === 'create') created = result.requests
    }
    await service.stop()
    const single = results[0].recordsPerSecond
    const targets = ['—', '≥ 10× single creates', '≥ 20,000 records/s']
    const met = [true, results[1].recordsPerSecond >= 10 * single, results[2].recordsPerSecond >= 20_000]
    return [
      `## Batch routes (${new Date().toISOString().slice(0, 10)})`,
      '',
      `${database.label}, Node ${process.version}; ${CONCURRENCY} concurrent requests for ${seconds} s per row, the service in the same process, one admin token. Upserts run on contacts that exist for half of each batch.`,
      '',
      '| scenario | records/s | × single creates | target | failed requests |',
      '|---|---:|---:|---|---:|',
      ...results.map(
        (result, index) =>
          `| ${result.scenario.name} | ${Math.round(result.recordsPerSecond).toLocaleString('en-US')} | ${(result.recordsPerSecond / single).toFixed(1)} | ${targets[index]} ${index === 0 ? '' : met[index] ? '✅' : '❌'} | ${result.failed} |`,
      ),
      '',
    ].join('\n')
  } finally {
    await database.stop()
  }
}

if (import.meta.main) process.stdout.write((await benchBatch()) + '\n')
