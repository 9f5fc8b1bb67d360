// What a command of `crm` is, what it is given to run, and how it fails: shared by the entry point
// (main.ts) and the files that define commands (operator.ts, listen.ts).
import type { ParseArgsConfig } from 'node:util'
import type { Config } from '../config.ts'

export type CliContext = {
  args: string[]
  json: boolean
  config: () => Config
  print: (human: string, data: unknown) => void
}

export type Command = {
  usage: string
  summary: string
  options?: ParseArgsConfig['options']
  run: (context: CliContext, values: Record<string, any>, positionals: string[]) => Promise<number | void>
}

/** A failure with its own problem code; its extension members go into the --json problem object. */
export class CliError extends Error {
  readonly code: string
  readonly exitCode: number
  readonly extensions: Record<string, unknown>
  constructor(code: string, message: string, options: { exitCode?: number; extensions?: Record<string, unknown> } = {}) {
    super(message)
    this.code = code
    this.exitCode = options.exitCode ?? (code === 'invalid_arguments' ? 2 : 1)
    this.extensions = options.extensions ?? {}
  }
}
