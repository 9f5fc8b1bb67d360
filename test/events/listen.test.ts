// `crm listen --forward-to` (docs/api.md section 8a) against a real server and a local receiver:
// every event arrives signed with the printed secret (both schemes, checked by the standardwebhooks
// library and Stripe's), one line is printed per event, and a restart resumes after the last event
// forwarded with the same secret.
import { type ChildProcess, spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { until } from '../helpers/until.ts'
import { startWorld } from '../records/helpers.ts'
import { startReceiver } from '../webhooks/receiver.ts'
import { everyVerifierAccepts } from '../webhooks/verifiers.ts'

const CRM = fileURLToPath(new URL('../../bin/crm.js', import.meta.url))

type Listener = { child: ChildProcess; lines: string[]; exited: Promise<number | null> }

function startListen(args: string[]): Listener {
  const child = spawn(process.execPath, [CRM, 'listen', ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
  const lines: string[] = []
  let partial = ''
  child.stdout!.on('data', (chunk: Buffer) => {
    const text = partial + chunk.toString('utf8')
    const parts = text.split('\n')
    partial = parts.pop() ?? ''
    lines.push(...parts)
  })
  child.stderr!.on('data', (chunk: Buffer) => process.stderr.write(chunk))
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  return { child, lines, exited }
}

t.test('crm listen forwards each event signed, prints a line each, and resumes after a restart', async (t) => {
  const world = await startWorld(t)
  const admin = world.as('admin@acme.test')
  const receiver = await startReceiver(t)
  const directory = mkdtempSync(join(tmpdir(), 'crm-listen-'))
  t.teardown(() => rmSync(directory, { recursive: true, force: true }))
  const state = join(directory, 'state.json')
  const args = [
    '--forward-to',
    `${receiver.url}/hook`,
    '--workspace',
    'acme',
    '--token',
    admin.member.token,
    '--api-url',
    world.server.url,
    '--state',
    state,
    '--json',
  ]
  const contacts = [(await admin.post('/api/contacts', { first_name: 'Zoë' })).body.data.id]

  const first = startListen(args)
  t.teardown(() => first.child.kill('SIGKILL'))
  const ready = JSON.parse(await until('the ready line', async () => first.lines[0]))
  t.match(ready.secret, /^whsec_[A-Za-z0-9+/]+={0,2}$/, 'a local secret is printed')
  contacts.push((await admin.post('/api/contacts', { first_name: 'Second' })).body.data.id)
  await until('two forwarded', async () => receiver.received.length >= 2)
  await until('two lines', async () => first.lines.length >= 3)
  for (const request of receiver.received) {
    t.same(everyVerifierAccepts(request, ready.secret), { stripe: true, standardwebhooks: true, svix: true }, 'both schemes verify')
    t.equal(request.headers['x-service-event'], 'contact.created')
    t.equal(request.headers['webhook-id'], request.body.delivery_id)
    t.ok(request.body.delivered_at, 'a delivery body: delivered_at and delivery_id')
  }
  t.same(
    receiver.received.map((request) => request.body.data.object.id),
    contacts,
    'the events in order',
  )
  t.ok(receiver.received[0].raw.toString('latin1').includes('Zo\\u00eb'), 'non-ASCII escaped as in deliveries')
  const printed = first.lines.slice(1).map((line) => JSON.parse(line))
  t.same(
    printed.map((line) => [line.event, line.status]),
    [
      ['contact.created', 200],
      ['contact.created', 200],
    ],
    'one line per event',
  )
  await until('the cursor is kept', async () => JSON.parse(readFileSync(state, 'utf8')).cursor)

  first.child.kill('SIGTERM')
  t.equal(await first.exited, 0, 'stops cleanly on SIGTERM')
  contacts.push((await admin.post('/api/contacts', { first_name: 'While stopped' })).body.data.id)

  const second = startListen(args)
  t.teardown(() => second.child.kill('SIGKILL'))
  const resumed = JSON.parse(await until('the ready line again', async () => second.lines[0]))
  t.equal(resumed.secret, ready.secret, 'the same secret after a restart')
  t.equal(resumed.resuming, true)
  await until('the third forwarded', async () => receiver.received.length >= 3)
  await until('its line', async () => second.lines.length >= 2)
  t.same(
    receiver.received.map((request) => request.body.data.object.id),
    contacts,
    'only the event after the kept cursor, none again',
  )
  second.child.kill('SIGTERM')
  t.equal(await second.exited, 0)
})
