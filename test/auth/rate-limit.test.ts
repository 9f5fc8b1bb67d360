// 600 requests a minute per user, shared by every API process: here one in this process and one
// `crm serve --no-worker` child process, against the same database.
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer, TEST_APP_SECRET } from '../helpers/server.ts'

const server = await startTestServer(t)
const { members } = await createTenant(server.databaseUrl, { members: { 'busy@acme.test': 'member' } })
const token = members['busy@acme.test'].token

const child = spawn(process.execPath, [fileURLToPath(new URL('../../bin/crm.js', import.meta.url)), 'serve', '--no-worker'], {
  env: { ...process.env, DATABASE_URL: server.databaseUrl, APP_SECRET: TEST_APP_SECRET, PORT: '0', LOG_LEVEL: 'info' },
  stdio: ['ignore', 'pipe', 'inherit'],
})
t.teardown(() => child.kill('SIGTERM'))
const childUrl: string = await new Promise((resolve, reject) => {
  let buffered = ''
  child.stdout.on('data', (chunk: Buffer) => {
    buffered += chunk.toString()
    const match = /listening on (http:\/\/[^\s]+)/.exec(buffered)
    if (match) resolve(match[1])
  })
  child.once('exit', (code) => reject(new Error(`crm serve exited with ${code}`)))
})

async function get(base: string) {
  const response = await fetch(`${base}/api/me`, { headers: { authorization: `Bearer ${token}` } })
  await response.arrayBuffer()
  return response
}

t.test('the 601st request in one window gets 429, across two processes', async (t) => {
  // Stay inside one clock-aligned minute.
  const second = new Date().getUTCSeconds()
  if (second > 40) await new Promise((resolve) => setTimeout(resolve, (61 - second) * 1000))
  const statuses: number[] = []
  for (let batch = 0; batch < 30; batch++) {
    const responses = await Promise.all(Array.from({ length: 20 }, (_, i) => get(i % 2 === 0 ? server.url : childUrl)))
    statuses.push(...responses.map((response) => response.status))
  }
  t.equal(statuses.filter((status) => status === 200).length, 600, 'the first 600 pass, half through each process')
  const refused = await get(childUrl)
  t.equal(refused.status, 429)
  const body = await (await fetch(`${server.url}/api/me`, { headers: { authorization: `Bearer ${token}` } })).json()
  t.equal(body.code, 'rate_limited')
  const retryAfter = Number(refused.headers.get('retry-after'))
  t.ok(retryAfter >= 1 && retryAfter <= 60, `Retry-After ${retryAfter}`)
  t.equal(refused.headers.get('ratelimit-remaining'), '0')
})
