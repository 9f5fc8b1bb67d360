// SIGTERM: stop accepting, finish the request in flight, stop the worker, close the pool, exit 0.
import { spawn } from 'node:child_process'
import { request } from 'node:http'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { createTestDatabase } from '../helpers/database.ts'
import { TEST_APP_SECRET } from '../helpers/server.ts'

const url = await createTestDatabase(t)

t.test('a request in flight when SIGTERM arrives still gets its answer', async (t) => {
  const child = spawn(process.execPath, [fileURLToPath(new URL('../../bin/crm.js', import.meta.url)), 'serve'], {
    env: { ...process.env, DATABASE_URL: url, APP_SECRET: TEST_APP_SECRET, PORT: '0' },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  let output = ''
  const listening: string = await new Promise((resolve) => {
    child.stdout.on('data', (chunk: Buffer) => {
      output += chunk.toString()
      const match = /listening on (http:\/\/[^\s]+) \(with the worker\)/.exec(output)
      if (match) resolve(match[1])
    })
  })
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  // Send the headers now and the body after SIGTERM: the request is in flight during shutdown.
  const body = JSON.stringify({ email: 'nobody@example.com', password: 'not the password', device_name: 'x' })
  const answer = new Promise<number>((resolve, reject) => {
    const req = request(
      `${listening}/api/token`,
      { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
      (res) => {
        res.resume()
        res.on('end', () => resolve(res.statusCode ?? 0))
      },
    )
    req.on('error', reject)
    req.write(body.slice(0, 10))
    setTimeout(() => {
      child.kill('SIGTERM')
      setTimeout(() => req.end(body.slice(10)), 300)
    }, 300)
  })
  t.equal(await answer, 401, 'the in-flight request was answered')
  t.equal(await exited, 0, 'exit code 0')
  t.match(output, /SIGTERM: finishing in-flight work and stopping/)
  t.match(output, /stopped cleanly/)
  const refused = await fetch(`${listening}/healthz`).then(
    () => 'answered',
    () => 'refused',
  )
  t.equal(refused, 'refused', 'no longer accepting')
})
