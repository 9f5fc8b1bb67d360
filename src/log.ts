// One JSON object per line on stdout. Callers pass fields, never whole request bodies or headers,
// so tokens, passwords and secrets cannot reach the log by accident.
import type { LogLevel } from './config.ts'

const RANK: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 }

export type Logger = {
  debug: (message: string, fields?: Record<string, unknown>) => void
  info: (message: string, fields?: Record<string, unknown>) => void
  warn: (message: string, fields?: Record<string, unknown>) => void
  error: (message: string, fields?: Record<string, unknown>) => void
}

/**
 * stdout, a line at a time but one write per turn of the event loop: a write to a pipe or a file is
 * a system call, made once per request at info level (profiled on GET one: about a tenth of the API
 * process's time went to writing its log lines one by one). What is gathered is written before the
 * process exits, on an uncaught error too; a SIGKILL loses at most the lines of one turn.
 */
export function batchedStdout(): (line: string) => void {
  let pending: string[] = []
  let scheduled = false
  const flush = () => {
    scheduled = false
    if (pending.length === 0) return
    const text = pending.join('')
    pending = []
    process.stdout.write(text)
  }
  process.on('exit', flush)
  return (line) => {
    pending.push(line + '\n')
    if (!scheduled) {
      scheduled = true
      setImmediate(flush)
    }
  }
}

export function createLogger(level: LogLevel, write: (line: string) => void = batchedStdout()): Logger {
  const at = (name: Exclude<LogLevel, 'silent'>) => (message: string, fields?: Record<string, unknown>) => {
    if (RANK[name] < RANK[level]) return
    write(JSON.stringify({ time: new Date().toISOString(), level: name, msg: message, ...fields }))
  }
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') }
}
