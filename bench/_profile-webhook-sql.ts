// Profiling aid for the webhook worker's database work (not run by `make bench`: files starting
// with _ are helpers). Makes the statements the worker makes for deliveries whose first attempt
// succeeds, without HTTP: per batch of events (one fan_out_event job's), the read
// (crm.webhook_first_attempts_to_send) and the record (crm.record_webhook_attempts, with attempts
// shaped as the worker's: signature and every request header), CONCURRENCY batches at a time as the
// worker's DATABASE_CONCURRENCY allows, and prints PostgreSQL's CPU per delivery (every backend,
// user + system from /proc), the per-delivery cost of the worker's encoding of the batch, and, when
// the server loads pg_stat_statements, the statements (track = all) that cost the most.
//
//   node bench/_profile-webhook-sql.ts     env: EVENTS (10,000), ROUNDS (3), CONCURRENCY (4), VARIANTS (current)
// VARIANTS, comma-separated, taken in turns round after round, asks what the delivery log's parts
// cost (an experiment on a throwaway database, never a change to make): `current`;
// `without:INDEX+INDEX...`, those indexes of crm dropped for the round (and made again after it);
// `no-attempt-rows`, attempts not written at all (a trigger skips each row), which is the floor of
// any cheaper way to log them.
import pg from 'pg'
// @ts-expect-error: pg's own parameter encoding, untyped
import { prepareValue } from 'pg/lib/utils.js'
import { BENCH_APP_SECRET, postgresCpuMeter, provision } from './_database.ts'

const EVENTS = Number(process.env.EVENTS ?? 10_000)
const ROUNDS = Number(process.env.ROUNDS ?? 3)
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 4)
const VARIANTS = (process.env.VARIANTS ?? 'current').split(',')

/** A variant's change to the schema before its round, and what undoes it after. */
async function applyVariant(owner: pg.Pool, variant: string): Promise<string> {
  if (variant === 'current') return ''
  if (variant === 'no-attempt-rows') {
    await owner.query(`create function crm.bench_skip_row() returns trigger language plpgsql as 'begin return null; end';
      create trigger bench_skip_attempts before insert on crm.webhook_attempts for each row execute function crm.bench_skip_row()`)
    return 'drop trigger bench_skip_attempts on crm.webhook_attempts; drop function crm.bench_skip_row()'
  }
  const indexes = variant.slice('without:'.length).split('+')
  const { rows } = await owner.query(
    `select pg_get_indexdef(format('crm.%I', name)::regclass) as definition from unnest($1::text[]) name`,
    [indexes],
  )
  await owner.query(indexes.map((name) => `drop index crm.${name}`).join('; '))
  return rows.map((row) => row.definition).join('; ')
}
for (const variant of VARIANTS)
  if (!/^(current|no-attempt-rows|without:[a-z_+]+)$/.test(variant)) throw new Error(`VARIANTS: no variant ${variant}`)
const BATCH = 100

const db = await provision()
const owner = new pg.Pool({ connectionString: db.url, max: 2 })
owner.on('error', () => {})
try {
  const { migrate } = await import('../src/db/migrate.ts')
  await migrate(db.url)
  const { ensureWorkerRole } = await import('../src/db/runtime-role.ts')
  const { attemptResultsParameter } = await import('../src/webhooks/batch-sender.ts')
  const { loggedHeaders, deliveryHeaders } = await import('../src/webhooks/request-headers.ts')
  const worker = new pg.Pool({ connectionString: await ensureWorkerRole(db.url, BENCH_APP_SECRET), max: CONCURRENCY })
  worker.on('error', () => {})
  const statementStats = await owner
    .query('create extension if not exists pg_stat_statements')
    .then(() => owner.query('select pg_stat_statements_reset()'))
    .then(() => true)
    .catch(() => false)
  const pgCpu = await postgresCpuMeter((text) => owner.query(text))
  const url = 'http://127.0.0.1:9/hook'
  for (let round = 1; round <= ROUNDS; round++) {
    const slug = `hooks-${round}`
    const variant = VARIANTS[(round - 1) % VARIANTS.length]
    const {
      rows: [ws],
    } = await owner.query(`insert into crm.workspaces (slug, name, plan) values ($1, 'Bench', 'pro') returning id`, [slug])
    const email = `bench-${round}@hooks.test`
    const {
      rows: [user],
    } = await owner.query(`insert into crm.users (email, name) values ($1, 'Bench') returning id`, [email])
    await owner.query(
      `insert into crm.memberships (workspace_id, user_id, role_id) select $1, $2, id from crm.roles where workspace_id = $1 and name = 'admin'`,
      [ws.id, user.id],
    )
    const {
      rows: [subscription],
    } = await owner.query(
      `insert into crm.webhook_subscriptions (workspace_id, name, url, events, secret_encrypted, secret_last4) values ($1, 'bench', $2, '{contact.*}', '\\x00', 'last') returning id`,
      [ws.id, url],
    )
    const client = await owner.connect()
    try {
      for (let i = 0; i < EVENTS; i += BATCH) {
        await client.query('begin')
        await client.query(`select crm.act_as($1, $2)`, [email, slug])
        await client.query(
          `insert into crm.contacts (email, first_name, last_name, custom_fields)
           select 'c' || g || '@example.com', 'Bench', 'Marker-Holloway', jsonb_build_object('notes', repeat('x', 1500)) from generate_series($1::int, $2::int) g`,
          [i, i + BATCH - 1],
        )
        await client.query('commit')
      }
    } finally {
      client.release()
    }
    const { rows: events } = await owner.query(`select id from crm.events where workspace_id = $1 order by id`, [ws.id])
    const batches: string[][] = []
    for (let i = 0; i < events.length; i += BATCH) batches.push(events.slice(i, i + BATCH).map((e) => e.id))
    await owner.query('vacuum analyze')
    if (statementStats) await owner.query('select pg_stat_statements_reset()')

    const undo = await applyVariant(owner, variant)
    let encodeMs = 0
    const pgFrom = pgCpu?.() ?? Number.NaN
    const started = performance.now()
    let next = 0
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < batches.length) {
          const batch = batches[next++]
          const { rows } = await worker.query('select * from crm.webhook_first_attempts_to_send($1::uuid[], $2)', [batch, false])
          const encodeStarted = performance.now()
          const results = rows.map((row) => {
            const headers = {
              'content-type': 'application/json',
              ...deliveryHeaders({ event: row.event, deliveryId: row.delivery_id, subscriptionId: subscription.id }),
              'x-service-signature': `t=1790000000,v1=${'a'.repeat(64)}`,
              'webhook-id': row.delivery_id,
              'webhook-timestamp': '1790000000',
              'webhook-signature': `v1,${'b'.repeat(43)}=`,
            }
            return {
              delivery_id: row.delivery_id,
              event_id: row.event_id,
              generation: null,
              started_at: new Date().toISOString(),
              duration_ms: 1,
              response_status: 200,
              error: null,
              response_body_excerpt: 'ok',
              signature: headers['x-service-signature'],
              request_headers: JSON.stringify(loggedHeaders(new URL(url), headers, 2003)),
            }
          })
          // As pg sends it (an array is escaped once more there).
          const parameter = prepareValue(attemptResultsParameter(results))
          encodeMs += performance.now() - encodeStarted
          await worker.query('select crm.record_webhook_attempts($1, $2, $3::crm.webhook_attempt_result[], $4::interval[])', [
            ws.id,
            subscription.id,
            parameter,
            null,
          ])
        }
      }),
    )
    const elapsed = performance.now() - started
    const pgMs = (pgCpu?.() ?? Number.NaN) - pgFrom
    if (undo) await owner.query(undo)
    const {
      rows: [check],
    } = await owner.query(
      `select count(*) filter (where status = 'delivered')::int as delivered, (select count(*)::int from crm.webhook_attempts where workspace_id = $1) as attempts
         from crm.webhook_deliveries where workspace_id = $1`,
      [ws.id],
    )
    console.log(
      `round ${round} (${variant}): ${check.delivered} delivered, ${check.attempts} attempts, ${Math.round((events.length / elapsed) * 1000)}/s, ` +
        `PostgreSQL ${((pgMs * 1000) / events.length).toFixed(1)} µs CPU per delivery, the batch's encoding ${((encodeMs * 1000) / events.length).toFixed(1)} µs`,
    )
    if (statementStats && round === ROUNDS) {
      const { rows } = await owner.query(
        `select calls, rows, round(total_exec_time::numeric * 1000 / $1, 1) as us_per_delivery, left(regexp_replace(query, '\\s+', ' ', 'g'), 140) as query
           from pg_stat_statements order by total_exec_time desc limit 12`,
        [events.length],
      )
      for (const row of rows) console.log(`  ${String(row.us_per_delivery).padStart(7)} µs  ${row.calls} calls  ${row.query}`)
    }
  }
  await worker.end()
} finally {
  await owner.end()
  await db.stop()
}
