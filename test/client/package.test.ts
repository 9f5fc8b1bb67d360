// The client as an integrator gets it: packed (npm pack builds dist/ with tsc), installed from the
// tarball alone into a new project (--offline: it needs nothing from a registry), run on the
// machine's plain Node (20 or later, no TypeScript loader) against a live server, and a misspelled
// body field refused by tsc through the package's .d.ts.
import { execFile, execFileSync, spawnSync } from 'node:child_process'
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const root = new URL('../../', import.meta.url).pathname
/** Plain Node as integrators run it: the machine's own when there is one, else this one. */
const PLAIN_NODE = process.env.PLAIN_NODE ?? '/usr/bin/node'

const project = mkdtempSync(join(tmpdir(), 'crm-client-project-'))
t.teardown(() => rmSync(project, { recursive: true, force: true }))
const quiet = ['--no-audit', '--no-fund', '--loglevel=error']
// npm through env -i: tap wraps this process's spawns with its loaders, which break the tsc of prepack.
const npm = (args: string[], cwd: string) =>
  execFileSync('env', ['-i', `PATH=${process.env.PATH ?? ''}`, `HOME=${process.env.HOME ?? project}`, 'npm', ...args, ...quiet], {
    cwd,
    stdio: 'ignore',
  })
npm(['pack', '--pack-destination', project], join(root, 'clients/typescript'))
const tarball = readdirSync(project).find((name) => name.endsWith('.tgz'))!
writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'integrator', private: true, type: 'module' }))
npm(['install', '--offline', `./${tarball}`], project)

const SCRIPT = `
import { createClient, CrmApiError, verifyWebhook } from '@crm/client'
const crm = createClient({ baseUrl: process.env.BASE_URL, token: process.env.TOKEN, workspace: process.env.WORKSPACE })
const created = await crm.contacts.create({ first_name: 'Grace', email: 'grace@example.com' })
const updated = await crm.contacts.update(created.id, { last_name: 'Hopper' })
await crm.contacts.create({ first_name: 'Ada', email: 'ada@example.com' })
const page = await crm.contacts.list({ filter: { email: 'grace@example.com' }, sort: '-created_at', limit: 1 })
const every = []
for await (const contact of crm.contacts.all({ limit: 1 })) every.push(contact.email)
const batch = await crm.deals.batch.create({ inputs: [{ name: 'Renewal', amount: '1200.00' }, { name: 'Upsell', amount: 'lots' }] })
const feed = await crm.events.list({ types: ['deal.*'] })
const followed = []
for await (const event of crm.events.follow({ types: ['deal.*'] })) if (followed.push(event.data.object.name) === 1) break
await crm.contacts.delete(created.id)
let missing
try { await crm.contacts.get(created.id) } catch (error) { missing = error instanceof CrmApiError && { status: error.status, code: error.code } }
console.log(JSON.stringify({ node: process.version, updated: updated.last_name, page: page.data.map((c) => c.email), every: every.sort(), missing, verify: typeof verifyWebhook,
  batch: batch.results.map((item) => item.status), feed: feed.data.map((event) => event.event), followed }))
`

t.test('the packed client runs on plain Node from node_modules', async (t) => {
  const server = await startTestServer(t)
  const tenant = await createTenant(server.databaseUrl, { slug: 'pack', members: { 'ada@pack.test': 'admin' } })
  writeFileSync(join(project, 'script.mjs'), SCRIPT)
  const node = spawnSync(PLAIN_NODE, ['--version'], { encoding: 'utf8' }).status === 0 ? PLAIN_NODE : process.execPath
  // Not spawnSync: the server runs in this process and must answer while the script runs.
  const run = await promisify(execFile)(node, ['script.mjs'], {
    cwd: project,
    encoding: 'utf8',
    env: { ...process.env, BASE_URL: server.url, TOKEN: tenant.members['ada@pack.test'].token, WORKSPACE: 'pack' },
  })
  t.equal(run.stderr, '')
  const result = JSON.parse(run.stdout)
  t.comment(`ran on node ${result.node}`)
  t.same(result, {
    node: result.node,
    updated: 'Hopper',
    page: ['grace@example.com'],
    every: ['ada@example.com', 'grace@example.com'],
    missing: { status: 404, code: 'not_found' },
    verify: 'function',
    batch: [201, 422],
    feed: ['deal.created'],
    followed: ['Renewal'],
  })
})

/** tsc's verdict on a file of the project, with the package's own .d.ts. */
function typeCheck(name: string, text: string) {
  writeFileSync(join(project, name), text)
  // Through env -i: tap wraps this process's spawns with its loaders, which the compiler must not get.
  return spawnSync(
    'env',
    [
      '-i',
      `PATH=${process.env.PATH ?? ''}`,
      join(root, 'node_modules/.bin/tsc'),
      ...['--noEmit', '--strict', '--target', 'es2022', '--module', 'nodenext', '--moduleResolution', 'nodenext'],
      ...['--types', 'node', '--typeRoots', join(root, 'node_modules/@types'), name],
    ],
    { cwd: project, encoding: 'utf8' },
  )
}

t.test('a misspelled body field fails tsc; the right one passes', async (t) => {
  const body = (fields: string) => `import { createClient } from '@crm/client'
const crm = createClient({ baseUrl: 'http://localhost', token: 't' })
export const made = await crm.contacts.create({ ${fields} })
export const rich = await crm.deals.list({ filter: { amount: { gte: '1000' }, stage: 'won' }, sort: '-amount' })
`
  const right = typeCheck('right.ts', body("first_name: 'Grace', email: 'g@example.com'"))
  t.equal(right.status, 0, right.stdout + right.stderr)
  const typo = typeCheck('typo.ts', body("firstname: 'Grace', emial: 'g@example.com'"))
  t.not(typo.status, 0, 'tsc refuses it')
  t.match(typo.stdout, /firstname/)
  const badSort = typeCheck(
    'sort.ts',
    `import { createClient } from '@crm/client'
export const page = await createClient({ baseUrl: 'http://localhost', token: 't' }).deals.list({ sort: '-amont' })
`,
  )
  t.not(badSort.status, 0, 'an unknown sort field is refused too')
  const batchItem = (fields: string) => `import { createClient } from '@crm/client'
const crm = createClient({ baseUrl: 'http://localhost', token: 't' })
const answer = await crm.deals.batch.update({ inputs: [{ id: 'x', ${fields} }], atomic: true })
const first = answer.results[0]
export const amount = first.status === 200 || first.status === 201 ? first.data.amount : first.status === 204 ? null : first.problem.code
`
  const rightBatch = typeCheck('batch.ts', batchItem("amount: '10.00'"))
  t.equal(rightBatch.status, 0, rightBatch.stdout + rightBatch.stderr)
  const typoBatch = typeCheck('batch-typo.ts', batchItem("amout: '10.00'"))
  t.not(typoBatch.status, 0, 'a misspelled batch item field is refused')
  t.match(typoBatch.stdout, /amout/)
})
