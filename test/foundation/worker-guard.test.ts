// The worker's guard against graphile-worker's one known unhandled rejection (a released local
// queue that could not hand its jobs back): that one is logged and the process goes on; any other
// unhandled rejection still ends the process.
import { spawnSync } from 'node:child_process'
import t from 'tap'

const workerModule = new URL('../../src/worker.ts', import.meta.url).href

function runScript(script: string) {
  return spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 30_000 })
}

const prelude = `
  const { guardAgainstLocalQueueRejections } = await import(${JSON.stringify(workerModule)})
  const logged = []
  guardAgainstLocalQueueRejections({ warn: (msg, fields) => logged.push({ msg, ...fields }), info() {}, error() {}, debug() {} })
`

t.test('the local queue rejection is logged and the process goes on', async (t) => {
  const result = runScript(`${prelude}
    Promise.reject(new Error('Error occurred whilst returning jobs from local queue to database queue: Connection terminated unexpectedly'))
    await new Promise((resolve) => setTimeout(resolve, 100))
    console.log(JSON.stringify({ alive: true, logged }))
  `)
  t.equal(result.status, 0, result.stderr)
  const output = JSON.parse(result.stdout.trim().split('\n').at(-1)!)
  t.equal(output.alive, true)
  t.match(output.logged, [{ msg: /could not hand its queued jobs back/, error: /Connection terminated unexpectedly/ }])
})

t.test('any other unhandled rejection still ends the process', async (t) => {
  const result = runScript(`${prelude}
    Promise.reject(new Error('something else went wrong'))
    await new Promise((resolve) => setTimeout(resolve, 100))
    console.log('still alive')
  `)
  t.not(result.status, 0)
  t.notMatch(result.stdout, /still alive/)
  t.match(result.stderr, /something else went wrong/)
})
