// Every `crm` command's --json output has the one shape of docs/api.md ("CLI"): each line on stdout
// is a JSON object; a command that does one thing prints exactly one line (the object, or
// {"data": [...]} for a list), a stream prints one object per line, and a failure prints one problem
// object ({title, code, detail, exit_code}) and exits with that code. The table names every command
// `crm help --json` lists: a new command fails this test until it has a row, and its output the
// shape.
import { type ChildProcess, spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t, { type Test } from 'tap'
import { crm, crmEach } from '../helpers/cli.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { startTestServer, TEST_APP_SECRET } from '../helpers/server.ts'
import { until } from '../helpers/until.ts'

const CRM = fileURLToPath(new URL('../../bin/crm.js', import.meta.url))
const PASSWORD = 'correct horse battery'

type Shape = 'object' | 'list' | 'stream'
type Row = {
  args: (context: { apiUrl: string; token: string; stateDir: string }) => string[]
  shape: Shape
  /** For a stream: the line after which it runs (and stops cleanly on SIGTERM). */
  ready?: RegExp
}

/** In the order they run: later rows use what earlier ones made. */
const ROWS: Record<string, Row> = {
  migrate: { args: () => [], shape: 'object' },
  'login-roles': { args: () => [], shape: 'object' },
  'workspace create': { args: () => ['--slug', 'acme', '--name', 'Acme'], shape: 'object' },
  'workspace set-plan': { args: () => ['--slug', 'acme', '--plan', 'pro'], shape: 'object' },
  'user create': {
    args: () => ['--email', 'ada@acme.test', '--name', 'Ada', '--password', PASSWORD, '--workspace', 'acme', '--role', 'admin'],
    shape: 'object',
  },
  'user api-access': { args: () => ['--email', 'ada@acme.test', '--on'], shape: 'object' },
  'user totp enable': { args: () => ['--email', 'ada@acme.test'], shape: 'object' },
  'user suspend': { args: () => ['--email', 'ada@acme.test'], shape: 'object' },
  'user unsuspend': { args: () => ['--email', 'ada@acme.test'], shape: 'object' },
  'member add': { args: () => ['--workspace', 'acme', '--email', 'bob@acme.test'], shape: 'object' },
  'member suspend': { args: () => ['--workspace', 'acme', '--email', 'bob@acme.test'], shape: 'object' },
  'member unsuspend': { args: () => ['--workspace', 'acme', '--email', 'bob@acme.test'], shape: 'object' },
  'role create': { args: () => ['--workspace', 'acme', '--name', 'erp_sync', '--grant', 'deals:view:own'], shape: 'object' },
  'audit verify': { args: () => ['--workspace', 'acme'], shape: 'object' },
  serve: { args: () => ['--no-worker'], shape: 'stream', ready: /CRM API listening/ },
  worker: { args: () => [], shape: 'stream', ready: /CRM worker running/ },
  listen: {
    args: ({ apiUrl, token, stateDir }) => [
      '--forward-to',
      'http://127.0.0.1:9/',
      '--workspace',
      'acme',
      '--token',
      token,
      '--api-url',
      apiUrl,
      '--state',
      join(stateDir, 'listen.json'),
    ],
    shape: 'stream',
    ready: /"ready":true/,
  },
}

/** The lines of stdout, each parsed; a line that is not a JSON object fails the test. */
function objectLines(t: Test, stdout: string, what: string): Record<string, unknown>[] {
  const lines = stdout.split('\n').filter((line) => line !== '')
  return lines.map((line) => {
    let parsed: unknown
    try {
      parsed = JSON.parse(line)
    } catch {
      t.fail(`${what}: a line that is not JSON: ${line}`)
    }
    t.ok(parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed), `${what}: each line is a JSON object`)
    return parsed as Record<string, unknown>
  })
}

function checkProblem(t: Test, problem: Record<string, unknown> | undefined, status: number | null, what: string): void {
  t.match(problem, { title: String, code: /^[a-z_]+$/, detail: String, exit_code: Number }, `${what}: a problem object`)
  t.not(status, 0, `${what}: a non-zero exit`)
  t.equal(problem?.exit_code, status, `${what}: exit_code is the exit status`)
}

/** Runs a stream command until its ready line, stops it as Ctrl-C would, and gives all it printed. */
async function runStream(args: string[], ready: RegExp, env: Record<string, string>): Promise<{ stdout: string; status: number | null }> {
  const child: ChildProcess = spawn(process.execPath, [CRM, ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let stdout = ''
  child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk))
  child.stderr!.on('data', (chunk: Buffer) => process.stderr.write(chunk))
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  try {
    await until(`the ready line of crm ${args[0]}`, async () => ready.test(stdout))
  } finally {
    child.kill('SIGTERM')
  }
  return { stdout, status: await exited }
}

const url = await createTestDatabase(t)
const env = { DATABASE_URL: url, APP_SECRET: TEST_APP_SECRET, LOG_LEVEL: 'info', PORT: '0' }

t.test('crm help --json lists every command, as a list; the table has a row for each', async (t) => {
  const help = crm(url, ['help', '--json'])
  t.equal(help.status, 0)
  const [document] = objectLines(t, help.stdout, 'help')
  t.equal(help.stdout.trim().split('\n').length, 1, 'one line')
  t.match(document, { data: Array })
  const names = (document.data as { command: string }[]).map((entry) => entry.command)
  t.same(names.toSorted(), Object.keys(ROWS).toSorted(), 'every command has a row in this table, and every row a command')
  for (const entry of document.data as object[]) t.match(entry, { command: String, usage: /^crm /, summary: String })
})

t.test('each command prints one shape with --json', async (t) => {
  const stateDir = mkdtempSync(join(tmpdir(), 'crm-json-'))
  t.teardown(() => rmSync(stateDir, { recursive: true, force: true }))
  // Bob exists before the member rows run; the API answers listen.
  t.equal(crm(url, ['user', 'create', '--email', 'bob@acme.test', '--name', 'Bob', '--password', PASSWORD]).status, 0)
  const server = await startTestServer(t, { databaseUrl: url })
  let token = ''
  for (const [command, row] of Object.entries(ROWS)) {
    if (command === 'listen') {
      const signIn = await server.request('POST', '/api/token', {
        body: { email: 'bob@acme.test', password: PASSWORD, device_name: 'cli' },
      })
      token = signIn.body.token
    }
    const args = [...command.split(' '), ...row.args({ apiUrl: server.url, token, stateDir }), '--json']
    if (row.shape === 'stream') {
      const { stdout, status } = await runStream(args, row.ready!, env)
      t.equal(status, 0, `${command}: stops cleanly: ${stdout}`)
      t.ok(objectLines(t, stdout, command).length >= 1, `${command}: at least one object line`)
      continue
    }
    const result = crm(url, args, { LOG_LEVEL: 'info' })
    t.equal(result.status, 0, `${command}: ${result.stdout}${result.stderr}`)
    const lines = objectLines(t, result.stdout, command)
    t.equal(lines.length, 1, `${command}: exactly one line`)
    if (row.shape === 'list') t.match(lines[0], { data: Array }, `${command}: a list is {data: [...]}`)
    else t.notOk(Array.isArray(lines[0].data), `${command}: one thing is the object itself`)
  }
})

t.test('every command fails with one problem object and its exit status', async (t) => {
  // None of these changes the database, so they run a few at once.
  const commands = Object.keys(ROWS)
  const [unknown, missing, taken, configuration, ...mistyped] = await crmEach(url, [
    { args: ['frobnicate', '--json'] },
    { args: ['workspace', 'create', '--name', 'x', '--json'] },
    { args: ['workspace', 'create', '--slug', 'acme', '--name', 'Again', '--json'] },
    { args: ['migrate', '--json'], env: { PORT: 'abc' } },
    ...commands.map((command) => ({ args: [...command.split(' '), '--no-such-option', '--json'] })),
  ])
  for (const [index, command] of commands.entries()) {
    const result = mistyped[index]
    const lines = objectLines(t, result.stdout, command)
    t.equal(lines.length, 1, `${command}: one line`)
    checkProblem(t, lines[0], result.status, command)
    t.match(lines[0], { code: 'invalid_arguments', exit_code: 2 })
  }
  checkProblem(t, JSON.parse(unknown.stdout), unknown.status, 'an unknown command')
  t.match(JSON.parse(unknown.stdout), { code: 'unknown_command', detail: 'unknown command "frobnicate"; run crm help' })
  checkProblem(t, JSON.parse(missing.stdout), missing.status, 'a missing option')
  t.match(JSON.parse(missing.stdout), { code: 'invalid_arguments', detail: 'missing --slug' })
  checkProblem(t, JSON.parse(taken.stdout), taken.status, 'a failure in the database')
  t.match(JSON.parse(taken.stdout), { code: 'command_failed', detail: /^already exists/ })
  checkProblem(t, JSON.parse(configuration.stdout), configuration.status, 'a bad configuration')
  t.match(JSON.parse(configuration.stdout), { code: 'invalid_configuration', problems: [/^PORT: /] })
})
