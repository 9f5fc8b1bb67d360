// What a command of `crm` is, and what it is given to run: shared by the entry point (main.ts) and
// the files that define commands (operator.ts).
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
