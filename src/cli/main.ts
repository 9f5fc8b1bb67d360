// `crm <command>`: the operator's entry point. Every command accepts --json, and its output then has
// one shape (docs/api.md, "CLI"): every line on stdout is one JSON object; a command that does one
// thing prints one line, the object it made or read, a list prints {"data": [...]}, and a stream
// (`listen`, `serve`, `worker`) prints one object per thing that happens. A failure prints a problem
// object like the API's ({title, code, detail, exit_code, ...}) and exits non-zero; without --json
// the reason is one line on stderr.
import { parseArgs } from 'node:util'
import { ConfigError, loadConfig } from '../config.ts'
import { createLogger } from '../log.ts'
import { type CliContext, CliError, type Command } from './command.ts'
import { commands as listenCommands } from './listen.ts'
import { commands as operatorCommands } from './operator.ts'

/** The title of each problem code the CLI prints (the API's codes live in src/http/problem-codes.ts). */
const PROBLEM_TITLES: Record<string, string> = {
  unknown_command: 'Unknown command',
  invalid_arguments: 'Invalid arguments',
  invalid_configuration: 'Invalid configuration',
  audit_chain_broken: 'Audit chain broken',
  cursor_expired: 'Cursor expired',
  command_failed: 'Command failed',
}

const serviceCommands: Record<string, Command> = {
  migrate: {
    usage: 'migrate',
    summary: 'apply pending migrations (safe to run twice, or twice at once)',
    run: async (context) => {
      const { provisionDatabase } = await import('../db/provision.ts')
      const { migrate } = await import('../db/migrate.ts')
      const { operatorLogins } = await import('../db/runtime-role.ts')
      const config = context.config()
      const database = await provisionDatabase({ databaseUrl: config.databaseUrl, dataDir: config.dataDir })
      try {
        const result = await migrate(database.url, {
          log: context.json ? undefined : (line) => console.log(line),
          logins: operatorLogins([config.runtimeDatabaseUrl, config.workerDatabaseUrl]),
        })
        context.print(
          result.applied.length ? `applied ${result.applied.length} migration(s)` : 'schema is current: nothing to apply',
          result,
        )
      } finally {
        await database.stop()
      }
    },
  },
  'login-roles': {
    usage: 'login-roles',
    summary: "set up the login roles of requests and the worker; print them as a pooler's user list (name, password)",
    run: async (context) => {
      const { provisionDatabase } = await import('../db/provision.ts')
      const { ensureLoginRoles } = await import('../db/runtime-role.ts')
      const config = context.config()
      const database = await provisionDatabase({ databaseUrl: config.databaseUrl, dataDir: config.dataDir })
      try {
        const { runtime, worker } = await ensureLoginRoles(database.url, config.appSecret)
        // PgBouncer's auth_file format: "name" "password", a double quote doubled.
        const quote = (text: string) => `"${text.replaceAll('"', '""')}"`
        context.print([runtime, worker].map((role) => `${quote(role.name)} ${quote(role.password)}`).join('\n'), { runtime, worker })
      } finally {
        await database.stop()
      }
    },
  },
  serve: {
    usage: 'serve [--no-worker]',
    summary: 'run the API and the worker (--no-worker: the API alone)',
    options: { 'no-worker': { type: 'boolean' } },
    run: async (context, values) => runService(context, { api: true, worker: !values['no-worker'] }),
  },
  worker: {
    usage: 'worker',
    summary: 'run the background worker alone',
    run: async (context) => runService(context, { api: false, worker: true }),
  },
}

async function runService(context: CliContext, parts: { api: boolean; worker: boolean }): Promise<number> {
  const config = context.config()
  const logger = createLogger(config.logLevel)
  const { startService } = await import('../service.ts')
  const service = await startService({ config, logger, ...parts })
  const where = config.databaseUrl ? 'the database at DATABASE_URL' : `the embedded PostgreSQL, data in ${config.dataDir}`
  if (parts.api)
    logger.info(`CRM API listening on ${service.url} (${parts.worker ? 'with the worker' : 'without the worker'}), using ${where}`)
  else logger.info(`CRM worker running, using ${where}`)
  return new Promise<number>((resolve) => {
    const shutdown = (signal: string) => {
      logger.info(`${signal}: finishing in-flight work and stopping`)
      service.stop().then(
        () => {
          logger.info('stopped cleanly')
          resolve(0)
        },
        (error) => {
          logger.error('shutdown failed', { error: String(error) })
          resolve(1)
        },
      )
    }
    process.once('SIGINT', () => shutdown('SIGINT'))
    process.once('SIGTERM', () => shutdown('SIGTERM'))
  })
}

const allCommands: Record<string, Command> = { ...serviceCommands, ...operatorCommands, ...listenCommands }

/** Every command, for `crm help --json` and for the test that runs each with --json. */
export function commandList(): { command: string; usage: string; summary: string }[] {
  return Object.entries(allCommands).map(([command, { usage, summary }]) => ({ command, usage: `crm ${usage}`, summary }))
}

function usage(): string {
  const lines = Object.values(allCommands).map((command) => `  crm ${command.usage.padEnd(58)} ${command.summary}`)
  return ['usage: crm <command> [options] [--json]', '', ...lines].join('\n')
}

export async function main(argv: string[]): Promise<number> {
  const json = argv.includes('--json')
  const fail = (code: string, message: string, exitCode: number, extensions: Record<string, unknown> = {}) => {
    const detail = message.replace(/\s*\n\s*/g, '; ')
    if (json) console.log(JSON.stringify({ title: PROBLEM_TITLES[code], code, detail, exit_code: exitCode, ...extensions }))
    else console.error(`crm: ${detail}`)
    return exitCode
  }
  if (!argv[0] || argv[0] === 'help' || argv[0] === '--help' || argv[0] === '--json') {
    console.log(json ? JSON.stringify({ data: commandList() }) : usage())
    return 0
  }
  // Commands are one to three words (`migrate`, `user create`, `user totp enable`): longest first.
  const words = [3, 2, 1].find(
    (count) => argv.slice(0, count).every((word) => !word.startsWith('-')) && allCommands[argv.slice(0, count).join(' ')],
  )
  if (!words)
    return fail(
      'unknown_command',
      `unknown command "${argv
        .filter((word) => !word.startsWith('-'))
        .slice(0, 2)
        .join(' ')}"; run crm help`,
      2,
    )
  const command = allCommands[argv.slice(0, words).join(' ')]
  const rest = argv.slice(words)
  let parsed
  try {
    parsed = parseArgs({ args: rest, options: { json: { type: 'boolean' }, ...command.options }, allowPositionals: true, strict: true })
  } catch (error) {
    return fail('invalid_arguments', `${(error as Error).message}; usage: crm ${command.usage}`, 2)
  }
  const context: CliContext = {
    args: rest,
    json,
    config: () => loadConfig(),
    print: (human, data) => console.log(json ? JSON.stringify(data) : human),
  }
  try {
    return (await command.run(context, parsed.values, parsed.positionals)) ?? 0
  } catch (error) {
    if (error instanceof ConfigError) {
      if (json) return fail('invalid_configuration', error.problems.join('; '), 2, { problems: error.problems })
      for (const problem of error.problems) console.error(`crm: configuration: ${problem}`)
      return 2
    }
    if (error instanceof CliError) return fail(error.code, error.message, error.exitCode, error.extensions)
    return fail('command_failed', (error as Error).message, 1)
  }
}
