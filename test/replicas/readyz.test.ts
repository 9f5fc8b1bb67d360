// /readyz is public (auth none): it reports each READ_REPLICA_URLS standby by its place in the list,
// with its state and counts, and never the address, port, user or database of one.
import t from 'tap'
import { freePort } from '../../src/db/provision.ts'
import { startTestServer } from '../helpers/server.ts'
import { until } from '../helpers/until.ts'

const port = await freePort()
const server = await startTestServer(t, {
  env: { READ_REPLICA_URLS: `postgres://standby_reader:standby-password@127.0.0.1:${port}/standby_database` },
})

t.test('/readyz names no standby', async (t) => {
  await until('the unreachable standby is reported down', async () => {
    await server.readRouting?.check()
    return server.readRouting?.report()[0].state === 'down'
  })
  const ready = await server.request('GET', '/readyz')
  t.equal(ready.status, 200, 'ready: the primary serves')
  t.same(
    ready.body.replicas.map((replica: { position: number; state: string }) => [replica.position, replica.state]),
    [[1, 'down']],
  )
  for (const secret of ['standby_reader', 'standby-password', '127.0.0.1', String(port), 'standby_database', 'postgres://']) {
    t.notOk(ready.text.includes(secret), `the answer does not contain ${secret}`)
  }
})
