// The log's stdout writer gathers a turn's lines into one write (src/log.ts, batchedStdout): the
// lines come out whole, in order, and none is lost when the process exits in the same turn, by
// process.exit or by an uncaught error.
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import t from 'tap'

const LOG = fileURLToPath(new URL('../../src/log.ts', import.meta.url))

function run(ending: string): { lines: string[]; status: number | null } {
  const script = `
    import { createLogger } from ${JSON.stringify(LOG)}
    const logger = createLogger('info')
    for (let i = 0; i < 1000; i++) logger.info('line', { i })
    logger.debug('below the level')
    ${ending}
  `
  const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' })
  return { lines: child.stdout.split('\n').filter(Boolean), status: child.status }
}

for (const [name, ending, status] of [
  ['the turn ends', '', 0],
  ['process.exit in the same turn', 'process.exit(3)', 3],
  ['an uncaught error in the same turn', "throw new Error('boom')", 1],
] as const) {
  t.test(`every line is written when ${name}`, async (t) => {
    const answer = run(ending)
    t.equal(answer.status, status)
    t.equal(answer.lines.length, 1000, 'a thousand lines, the debug one left out')
    t.same(
      answer.lines.map((line) => JSON.parse(line).i),
      Array.from({ length: 1000 }, (_, i) => i),
      'whole JSON objects, in order',
    )
  })
}
