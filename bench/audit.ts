// The access audit log's cost (docs/api.md section 11): an audited write (renaming a custom role,
// `PATCH /api/roles/{id}`, one entry with its hash chained) through the real API with and without
// the audit trigger, in turns; the same change in SQL, where the trigger's own cost shows; and a
// page of `GET /api/audit-log` with BENCH_AUDIT_ENTRIES entries (default 20,000) in the workspace,
// against the same page read by plain SQL over node-postgres as the owner.
//
//   node bench/audit.ts
//   BENCH_AUDIT_ENTRIES=5000 BENCH_AUDIT_WRITES=50 node bench/audit.ts     a quicker run
import pg from 'pg'
import { benchWorkspace, provision, startBenchApi } from './_database.ts'

const ENTRIES = Number(process.env.BENCH_AUDIT_ENTRIES ?? 20_000)
const WRITES = Number(process.env.BENCH_AUDIT_WRITES ?? 300)
const ROUNDS = 3
/**
 * Renames per transaction while seeding: each entry updates the workspace's chain head, and a row
 * updated many times in one transaction makes every further update walk its versions.
 */
const SEED_BATCH = 200
const SEED_ROLES = 100
const SQL_CHANGES = 300

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]
}

const ms = (value: number) => value.toFixed(2)
const count = (value: number) => Math.round(value).toLocaleString('en-US')

async function main(): Promise<void> {
  const database = await provision()
  const client = new pg.Client({ connectionString: database.url })
  let api: Awaited<ReturnType<typeof startBenchApi>> | null = null
  try {
    const { tenant, slug, admin } = await benchWorkspace(database.url)
    await client.connect()
    const { rows: roles } = await client.query<{ id: string }>(
      `insert into crm.roles (workspace_id, name) select $1, 'bench_' || g from generate_series(1, $2::int) g returning id`,
      [tenant.id, SEED_ROLES],
    )
    const roleIds = roles.map((role) => role.id)

    // The entries the page is read from, written by the trigger as the admin (crm.act_as names the actor).
    const seedStarted = performance.now()
    for (let done = 0; done < ENTRIES; done += SEED_BATCH) {
      await client.query('begin')
      await client.query('select crm.act_as($1, $2)', [admin.email, slug])
      await client.query(
        `do $$
         declare role_ids uuid[] := $roles$${`{${roleIds.join(',')}}`}$roles$;
         begin
           for i in ${done + 1}..${Math.min(done + SEED_BATCH, ENTRIES)} loop
             update crm.roles set name = 'seed_' || i where id = role_ids[1 + i % ${SEED_ROLES}];
           end loop;
         end $$`,
      )
      await client.query('commit')
    }
    const seedSeconds = (performance.now() - seedStarted) / 1000
    await client.query('vacuum analyze crm.roles, crm.audit_log')

    // The trigger's cost in SQL: the same rename, a transaction each as a request makes it (one
    // round trip: begin, the admin's context, the update, commit), with the trigger and without.
    const sqlRenames = async (audited: boolean): Promise<number> => {
      const context = `select crm.act_as(${client.escapeLiteral(admin.email)}, ${client.escapeLiteral(slug)})`
      if (!audited) await client.query('alter table crm.roles disable trigger tg_roles__audit')
      try {
        const started = performance.now()
        for (let i = 0; i < SQL_CHANGES; i++) {
          await client.query(
            `begin; ${context}; update crm.roles set name = 'sql_${audited ? 'a' : 'b'}_${i}' where id = '${roleIds[i % SEED_ROLES]}'; commit`,
          )
        }
        return ((performance.now() - started) * 1000) / SQL_CHANGES
      } finally {
        if (!audited) await client.query('alter table crm.roles enable trigger tg_roles__audit')
      }
    }
    const sqlWith: number[] = []
    const sqlWithout: number[] = []
    for (let round = 0; round < ROUNDS; round++) {
      sqlWith.push(await sqlRenames(true))
      sqlWithout.push(await sqlRenames(false))
    }

    api = await startBenchApi(database.url)
    const headers = { authorization: `Bearer ${admin.token}`, 'x-tenant-slug': slug, 'content-type': 'application/json' }
    let renamed = 0
    const renames = async (n: number): Promise<{ latencies: number[]; perSecond: number }> => {
      const latencies: number[] = []
      const started = performance.now()
      for (let i = 0; i < n; i++) {
        const begun = performance.now()
        const response = await fetch(`${api!.url}/api/roles/${roleIds[i % SEED_ROLES]}`, {
          method: 'PATCH',
          headers,
          body: JSON.stringify({ name: `api_${++renamed}` }),
        })
        if (response.status !== 200) throw new Error(`PATCH /api/roles answered ${response.status}: ${await response.text()}`)
        await response.arrayBuffer()
        latencies.push(performance.now() - begun)
      }
      return { latencies, perSecond: n / ((performance.now() - started) / 1000) }
    }
    await renames(20)
    const audited = { latencies: [] as number[], rates: [] as number[] }
    const unaudited = { latencies: [] as number[], rates: [] as number[] }
    // In turns, so that both sides share the machine's background load.
    for (let round = 0; round < ROUNDS; round++) {
      const on = await renames(WRITES)
      audited.latencies.push(...on.latencies)
      audited.rates.push(on.perSecond)
      await client.query('alter table crm.roles disable trigger tg_roles__audit')
      try {
        const off = await renames(WRITES)
        unaudited.latencies.push(...off.latencies)
        unaudited.rates.push(off.perSecond)
      } finally {
        await client.query('alter table crm.roles enable trigger tg_roles__audit')
      }
    }

    // A page of the audit log: the route against plain SQL as the owner.
    const pageApi: number[] = []
    for (let i = -20; i < 200; i++) {
      const started = performance.now()
      const response = await fetch(`${api.url}/api/audit-log`, { headers })
      if (response.status !== 200) throw new Error(`GET /api/audit-log answered ${response.status}: ${await response.text()}`)
      await response.arrayBuffer()
      if (i >= 0) pageApi.push(performance.now() - started)
    }
    const pageBare: number[] = []
    for (let i = -20; i < 200; i++) {
      const started = performance.now()
      await client.query('select * from crm.audit_log where workspace_id = $1 order by seq desc limit 51', [tenant.id])
      if (i >= 0) pageBare.push(performance.now() - started)
    }
    const { rows: total } = await client.query<{ n: string }>('select count(*) as n from crm.audit_log where workspace_id = $1', [
      tenant.id,
    ])

    const median = (values: number[]) => percentile(values, 50)
    const rateWith = median(audited.rates)
    const rateWithout = median(unaudited.rates)
    console.log(`## Access audit log (bench/audit.ts)

The real API in this process, ${database.label}; ${count(Number(total[0].n))} entries in the workspace (${count(ENTRIES)} seeded in ${seedSeconds.toFixed(0)} s by the trigger). An audited write: renaming a custom role (\`PATCH /api/roles/{id}\`, one entry, hash chained), ${WRITES} requests one after another per side, ${ROUNDS} rounds in turns with the trigger on and off (p50 / p99 over every request, rate: the median round's).

| measure | with the audit trigger | without | cost |
|---|---:|---:|---:|
| audited write over HTTP: role renamed, p50 / p99 | ${ms(median(audited.latencies))} / ${ms(percentile(audited.latencies, 99))} ms | ${ms(median(unaudited.latencies))} / ${ms(percentile(unaudited.latencies, 99))} ms | rate ${(100 * (rateWith / rateWithout - 1)).toFixed(0)} % |
| audited write over HTTP: requests/s, one client | ${count(rateWith)} | ${count(rateWithout)} | |
| the same rename in SQL, µs per change (${count(SQL_CHANGES)} transactions one after another, median of ${ROUNDS}) | ${median(sqlWith).toFixed(0)} | ${median(sqlWithout).toFixed(0)} | ${(median(sqlWith) - median(sqlWithout)).toFixed(0)} µs an entry |

| measure | p50 ms | p99 ms |
|---|---:|---:|
| audit-log page: \`GET /api/audit-log\`, 50 newest entries, admin, 200 requests one after another | ${ms(median(pageApi))} | ${ms(percentile(pageApi, 99))} |
| baseline: the same 51 rows by plain SQL over node-postgres as the owner, no HTTP | ${ms(median(pageBare))} | ${ms(percentile(pageBare, 99))} |
`)
  } finally {
    await api?.stop()
    await client.end().catch(() => {})
    await database.stop()
  }
}

await main()
