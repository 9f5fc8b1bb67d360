// A page that fails logs its path without the query: an invitation link's query is its secret.
import t from 'tap'
import { startTestServer } from '../helpers/server.ts'

t.test('a failing accept page does not log the invitation token', async (t) => {
  const server = await startTestServer(t)
  // A database that disappeared under a running service makes the page fail.
  await server.pool.end()
  const secret = `inv_${'s'.repeat(43)}`
  const response = await fetch(`${server.url}/invitations/accept?token=${secret}`)
  t.ok(response.status >= 500, `the page failed (${response.status})`)
  const failures = server.logLines.filter((line) => line.includes('page failed'))
  t.ok(failures.length > 0, 'the failure is logged')
  t.notOk(
    server.logLines.some((line) => line.includes(secret)),
    'the token is in no log line',
  )
  t.ok(
    failures.every((line) => JSON.parse(line).path === '/invitations/accept'),
    'the path without its query',
  )
})
