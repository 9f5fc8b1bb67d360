import { existsSync, mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { ConfigError, loadConfig, parseDuration } from '../../src/config.ts'

const dataDir = () => mkdtempSync(join(tmpdir(), 'crm-config-'))

t.test('defaults', async (t) => {
  const config = loadConfig({}, { dataDir: dataDir() })
  t.equal(config.port, 3000)
  t.equal(config.host, '127.0.0.1')
  t.equal(config.databaseUrl, null)
  t.equal(config.tokenTtlDays, 14)
  t.equal(config.rateLimitPerMinute, 600)
  t.equal(config.rateLimitBatch, 6, '1 % of the limit')
  t.equal(config.rateLimitSettleMs, 250)
  t.equal(config.webhook.retryScheduleMs, null, "the database's schedule")
  t.equal(config.webhook.timeoutMs, 10_000)
  t.equal(config.webhook.allowHttp, false)
  t.equal(config.webhook.logRetentionDays, 30)
  t.equal(config.bodyIdleTimeoutMs, 10_000)
})

t.test('a local APP_SECRET is generated once and kept under the data directory', async (t) => {
  const dir = dataDir()
  const first = loadConfig({}, { dataDir: dir })
  t.ok(existsSync(join(dir, 'app-secret')))
  t.equal(loadConfig({}, { dataDir: dir }).appSecret, first.appSecret)
  t.equal(readFileSync(join(dir, 'app-secret'), 'utf8').trim(), first.appSecret)
  t.ok(first.appSecret.length >= 32)
})

t.test('each bad value yields one line naming its variable', async (t) => {
  const env = {
    PORT: 'eighty',
    DATABASE_URL: 'mysql://x',
    RUNTIME_DATABASE_URL: 'not a url',
    WORKER_DATABASE_URL: 'mysql://worker',
    LOG_LEVEL: 'loud',
    APP_SECRET: 'short',
    TOKEN_TTL_DAYS: '0',
    RATE_LIMIT_PER_MINUTE: '-5',
    RATE_LIMIT_BATCH: '0',
    RATE_LIMIT_SETTLE_MS: '5',
    WEBHOOK_TIMEOUT_MS: 'soon',
    WEBHOOK_RETRY_SCHEDULE: '1s,soon',
    WEBHOOK_ALLOW_HTTP: 'maybe',
    WEBHOOK_ALLOWED_CIDRS: 'not-a-cidr',
    WEBHOOK_LOG_RETENTION_DAYS: 'x',
    HOST: 'bad host!',
    PUBLIC_BASE_URL: 'nope',
    TRUST_PROXY: '10.0.0.0/99',
    SMTP_URL: 'http://mail',
    BODY_IDLE_TIMEOUT_MS: '10s',
    READ_REPLICA_URLS: 'postgres://standby/crm,mysql://replica',
    READ_REPLICA_MAX_LAG_MS: '5',
  }
  const error = t.throws(() => loadConfig(env, { dataDir: dataDir() })) as unknown as ConfigError
  t.type(error, ConfigError)
  for (const name of Object.keys(env)) {
    t.equal(error.problems.filter((line) => line.startsWith(`${name}:`)).length, 1, `${name} named once`)
  }
  t.equal(error.problems.length, Object.keys(env).length)
})

t.test('read replicas: none by default; URIs separated by commas; the lag cap', async (t) => {
  const none = loadConfig({}, { dataDir: dataDir() })
  t.same(none.readReplicas, { urls: [], maxLagMs: 5000 }, 'every read on the primary')
  const two = loadConfig(
    { READ_REPLICA_URLS: 'postgres://a@standby-1/crm, postgresql://a@standby-2:5433/crm', READ_REPLICA_MAX_LAG_MS: '2000' },
    { dataDir: dataDir() },
  )
  t.same(two.readReplicas, { urls: ['postgres://a@standby-1/crm', 'postgresql://a@standby-2:5433/crm'], maxLagMs: 2000 })
})

t.test('the rate limit batch: 1 % of the limit by default, never above it', async (t) => {
  t.equal(loadConfig({ RATE_LIMIT_PER_MINUTE: '50' }, { dataDir: dataDir() }).rateLimitBatch, 1)
  t.equal(loadConfig({ RATE_LIMIT_PER_MINUTE: '1000', RATE_LIMIT_BATCH: '25' }, { dataDir: dataDir() }).rateLimitBatch, 25)
  const error = t.throws(() =>
    loadConfig({ RATE_LIMIT_PER_MINUTE: '100', RATE_LIMIT_BATCH: '101' }, { dataDir: dataDir() }),
  ) as unknown as ConfigError
  t.match(error.problems, [/^RATE_LIMIT_BATCH: expected a whole number from 1 to 100/])
})

t.test('streams per process: a quarter of the pool by default, never above half of it', async (t) => {
  t.equal(loadConfig({}, { dataDir: dataDir() }).streamsPerProcess, 5)
  t.equal(loadConfig({ DB_POOL_SIZE: '2' }, { dataDir: dataDir() }).streamsPerProcess, 1)
  t.equal(loadConfig({ DB_POOL_SIZE: '40', STREAMS_PER_PROCESS: '20' }, { dataDir: dataDir() }).streamsPerProcess, 20)
  const error = t.throws(() =>
    loadConfig({ DB_POOL_SIZE: '20', STREAMS_PER_PROCESS: '11' }, { dataDir: dataDir() }),
  ) as unknown as ConfigError
  t.match(error.problems, [/^STREAMS_PER_PROCESS: expected a whole number from 1 to 10/])
})

t.test('production requires APP_SECRET', async (t) => {
  const error = t.throws(() => loadConfig({ NODE_ENV: 'production' }, { dataDir: dataDir() })) as unknown as ConfigError
  t.match(error.problems, [/^APP_SECRET: required when NODE_ENV=production/])
  t.equal(
    loadConfig({ NODE_ENV: 'production', APP_SECRET: 'x'.repeat(40), PUBLIC_BASE_URL: 'https://crm.example.com' }, { dataDir: dataDir() })
      .production,
    true,
  )
})

t.test('test knobs', async (t) => {
  const config = loadConfig(
    {
      WEBHOOK_RETRY_SCHEDULE: '10ms,20ms,1s,1m,1h,1d',
      WEBHOOK_ALLOW_HTTP: 'true',
      WEBHOOK_ALLOWED_CIDRS: '127.0.0.0/8,::1/128',
      DATABASE_URL: 'postgres://a@b/c',
    },
    { dataDir: dataDir() },
  )
  t.same(config.webhook.retryScheduleMs, [10, 20, 1000, 60_000, 3_600_000, 86_400_000])
  t.equal(config.webhook.allowHttp, true)
  t.equal(config.databaseUrl, 'postgres://a@b/c')
  t.equal(parseDuration('1.5s'), 1500)
  t.equal(parseDuration('soon'), null)
})
