// The README's quick start, run as a user pastes it, from its `make run` line to a webhook whose
// signature the example receiver verified. The `make run` line gives the service's environment; the
// service starts as the test helpers start it (port 0, with its worker), and the shell blocks after
// that line run in one bash, as written, with PORT set to that service's port (never the default)
// and RECEIVER_PORT to a free one: a port written into a command rather than taken from those
// variables fails the test. The receiver verifies with examples/verify-webhook.ts, which must be
// the README's verifier, character for character.
import { type ChildProcess, spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import t from 'tap'
import { readmeBlocks } from '../helpers/readme.ts'
import { startTestServer, TEST_APP_SECRET } from '../helpers/server.ts'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))

/** A port nothing listens on now, for the receiver (which binds it itself, as the README has it). */
async function freePort(): Promise<number> {
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as { port: number }
  await new Promise((resolve) => server.close(resolve))
  return port
}

/** The host:port addresses a script names outside a `${VARIABLE:-default}` (where a default port belongs). */
function hardCodedAddresses(script: string): string[] {
  return script.replaceAll(/\$\{[A-Z_]+:-[^}]*\}/g, '').match(/\b(?:localhost|127\.0\.0\.1|\[::1\]):\d+/g) ?? []
}

t.test('hardCodedAddresses finds a port written into a command, not one behind a variable', async (t) => {
  // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell default, not a template
  t.same(hardCodedAddresses('API=http://localhost:${PORT:-3000}\ncurl -s $API/api/token'), [])
  t.same(hardCodedAddresses('curl -s localhost:3000/api/token'), ['localhost:3000'])
  t.same(hardCodedAddresses('-d \'{"url":"http://127.0.0.1:4000/"}\''), ['127.0.0.1:4000'])
})

t.test("the README's verifier is examples/verify-webhook.ts, which the quick start's receiver runs", async (t) => {
  const readmeVerifier = readmeBlocks('ts', 'Receiving webhooks').find((code) => code.includes('export function verifyWebhook'))
  t.equal(readmeVerifier, readFileSync(new URL('../../examples/verify-webhook.ts', import.meta.url), 'utf8'))
})

t.test('the quick start, from make run to a verified webhook', async (t) => {
  const [start, ...blocks] = readmeBlocks('sh', 'Quick start')
  const makeRun = /^((?:[A-Z_]+=\S+ )*)make run\n$/.exec(start)
  if (!makeRun) throw new Error(`the quick start's first block is not "[VARIABLE=value ...] make run": ${start}`)
  const env = Object.fromEntries(
    makeRun[1]
      .trim()
      .split(/ +/)
      .filter(Boolean)
      .map((assignment) => assignment.split('=', 2) as [string, string]),
  )
  const server = await startTestServer(t, { worker: true, env })
  const receiverPort = await freePort()

  const script = blocks.join('\n')
  t.same(hardCodedAddresses(script), [], 'every address in the quick start takes its port from PORT or RECEIVER_PORT')
  const port = new URL(server.url).port
  t.not(port, '3000', 'the service is not on the default port, so a hard-coded 3000 would fail')

  // The second terminal: the same folder, the crm command finding the database (here by its URL
  // rather than .data/postgres.json), Node 24 on the PATH. Its own process group, so the receiver it
  // leaves in the background is stopped with it.
  const shell: ChildProcess = spawn('bash', ['-e', '-o', 'pipefail', '-c', script], {
    cwd: ROOT,
    detached: true,
    env: {
      ...process.env,
      PATH: `${dirname(process.execPath)}:${process.env.PATH}`,
      PORT: port,
      RECEIVER_PORT: String(receiverPort),
      DATABASE_URL: server.databaseUrl,
      APP_SECRET: TEST_APP_SECRET,
      LOG_LEVEL: 'error',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  t.teardown(() => {
    try {
      process.kill(-shell.pid!, 'SIGTERM')
    } catch {
      // already gone
    }
  })
  let stdout = ''
  let stderr = ''
  shell.stderr!.on('data', (chunk: Buffer) => (stderr += chunk))
  const verified = await new Promise<RegExpExecArray>((resolve, reject) => {
    shell.stdout!.on('data', (chunk: Buffer) => {
      stdout += chunk
      // Not anchored: the receiver and curl share the terminal, and either may print first.
      const line = /(verified|refused) contact\.created (\S+) (.*)$/m.exec(stdout)
      if (line) resolve(line)
    })
    shell.on('exit', (code) => {
      if (code !== 0) reject(new Error(`the quick start failed (exit ${code}):\n${stdout}\n${stderr}`))
    })
  })
  t.equal(verified[1], 'verified', 'the receiver verified the signature with the README snippet')
  const delivery = JSON.parse(verified[3])
  t.equal(delivery.event, 'contact.created')
  t.equal(delivery.delivery_id, verified[2])
  t.equal(delivery.data.object.email, 'grace@example.com')
  t.match(stdout, /"last_name" ?: ?"Hopper"/, 'the contact was created and listed')

  // The DBA's block of the README, as the owner, on the database the quick start filled.
  const [audit] = readmeBlocks('sql', 'Auditing access as a DBA')
  const owner = new pg.Client({ connectionString: server.databaseUrl })
  await owner.connect()
  t.teardown(() => owner.end())
  const results = (await owner.query(audit)) as unknown as pg.QueryResult[]
  const rows = results.map((result) => result.rows)
  t.ok(
    rows[0].some((row) => row.role === 'admin' && row.resource === 'contacts'),
    'the permission matrix lists the admin role',
  )
  t.ok(rows[1].length > 0, "Ada's effective access")
  t.same(rows[5], [{ count: '1' }], 'acting as Ada sees the one contact she created')
})
