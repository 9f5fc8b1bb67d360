// The operator's CLI against a real database: --json output, one-line errors, and the database
// rules (seats, built-in roles) applying to it as to the API.
import t from 'tap'
import { crm, crmEach } from '../helpers/cli.ts'
import { createTestDatabase } from '../helpers/database.ts'
import { withOwner } from '../helpers/fixtures.ts'

const url = await createTestDatabase(t)
const PASSWORD = 'correct horse battery'

t.test('workspaces', async (t) => {
  const created = crm(url, ['workspace', 'create', '--slug', 'acme', '--name', 'Acme Inc', '--seats', '2', '--json'])
  t.equal(created.status, 0, created.stderr)
  t.match(created.json, { id: /^[0-9a-f-]{36}$/, slug: 'acme', name: 'Acme Inc', plan: 'free', seat_limit: 2, trial_ends_at: /Z$/ })
  const trialDays = (Date.parse(created.json.trial_ends_at) - Date.now()) / 86_400_000
  t.ok(trialDays > 13.9 && trialDays <= 14)
  const noTrial = crm(url, ['workspace', 'create', '--slug', 'beta', '--name', 'Beta', '--plan', 'pro', '--trial-days', '0', '--json'])
  t.match(noTrial.json, { plan: 'pro', trial_ends_at: null })
  const roles = await withOwner(url, async (client) =>
    (
      await client.query(
        "select r.name from crm.roles r join crm.workspaces w on w.id = r.workspace_id where w.slug = 'acme' order by r.name",
      )
    ).rows.map((row) => row.name),
  )
  t.same(roles, ['admin', 'member', 'read_only'], 'built-in roles come from the database')
  t.match(crm(url, ['workspace', 'set-plan', '--slug', 'acme', '--plan', 'pro', '--json']).json, { slug: 'acme', plan: 'pro' })
  // Refusals change nothing, so they run a few at once.
  const [taken, badSlug, noSlug, badPlan] = await crmEach(url, [
    { args: ['workspace', 'create', '--slug', 'acme', '--name', 'Again'] },
    { args: ['workspace', 'create', '--slug', 'Bad Slug!', '--name', 'x'] },
    { args: ['workspace', 'create', '--name', 'x'] },
    { args: ['workspace', 'set-plan', '--slug', 'acme', '--plan', 'gold'] },
  ])
  t.equal(taken.status, 1)
  t.match(taken.stderr, /^crm: already exists/)
  t.equal(taken.stderr.trim().split('\n').length, 1)
  t.match(badSlug.stderr, /^crm: invalid value/)
  t.match(noSlug.stderr, /missing --slug/)
  t.match(badPlan.stderr, /--plan must be free or pro/)
})

t.test('users, members and seats', async (t) => {
  t.equal(
    crm(url, [
      'user',
      'create',
      '--email',
      'ada@acme.test',
      '--name',
      'Ada',
      '--password',
      PASSWORD,
      '--workspace',
      'acme',
      '--role',
      'admin',
      '--team',
      'sales',
      '--json',
    ]).status,
    0,
  )
  const bob = crm(url, [
    'user',
    'create',
    '--email',
    'bob@acme.test',
    '--name',
    'Bob',
    '--password',
    PASSWORD,
    '--workspace',
    'acme',
    '--json',
  ])
  t.match(bob.json, { email: 'bob@acme.test', role: 'member', workspace: 'acme' })
  const [shortPassword, emailPassword] = await crmEach(url, [
    { args: ['user', 'create', '--email', 'c@acme.test', '--name', 'C', '--password', 'short'] },
    { args: ['user', 'create', '--email', 'carol@acme.test', '--name', 'C', '--password', 'carol@acme.test'] },
  ])
  t.match(shortPassword.stderr, /--password must be at least 10 characters/)
  t.match(emailPassword.stderr, /must not be the email/)
  t.equal(crm(url, ['user', 'create', '--email', 'carol@acme.test', '--name', 'Carol', '--password', PASSWORD, '--json']).status, 0)

  const full = crm(url, ['member', 'add', '--workspace', 'acme', '--email', 'carol@acme.test'])
  t.equal(full.status, 1)
  t.match(full.stderr, /no seat left: 2 of 2 seats are in use/)
  t.match(crm(url, ['member', 'suspend', '--workspace', 'acme', '--email', 'bob@acme.test', '--json']).json, {
    email: 'bob@acme.test',
    suspended_at: /Z$/,
  })
  t.match(crm(url, ['member', 'add', '--workspace', 'acme', '--email', 'carol@acme.test', '--role', 'read_only', '--json']).json, {
    role: 'read_only',
  })
  const [unsuspend, lastAdmin, nobody] = await crmEach(url, [
    { args: ['member', 'unsuspend', '--workspace', 'acme', '--email', 'bob@acme.test'] },
    { args: ['member', 'suspend', '--workspace', 'acme', '--email', 'ada@acme.test'] },
    { args: ['member', 'add', '--workspace', 'acme', '--email', 'nobody@acme.test'] },
  ])
  t.match(unsuspend.stderr, /no seat left/, 'unsuspend needs a free seat')
  t.match(lastAdmin.stderr, /last admin/, 'the last admin stays')
  t.match(nobody.stderr, /no user with email/)
})

t.test('roles, API access and platform suspension', async (t) => {
  const role = crm(url, [
    'role',
    'create',
    '--workspace',
    'acme',
    '--name',
    'erp_sync',
    '--grant',
    'deals:view:own',
    '--grant',
    'deals:update:own',
    '--json',
  ])
  t.match(role.json, { name: 'erp_sync', is_admin: false, grants: ['deals:view:own', 'deals:update:own'] })
  const [badGrant, neitherOnNorOff] = await crmEach(url, [
    { args: ['role', 'create', '--workspace', 'acme', '--name', 'x', '--grant', 'deals:fly:all'] },
    { args: ['user', 'api-access', '--email', 'ada@acme.test'] },
  ])
  t.match(badGrant.stderr, /is not resource:action:scope/)
  t.match(neitherOnNorOff.stderr, /exactly one of --on or --off/)
  t.match(crm(url, ['user', 'api-access', '--email', 'ada@acme.test', '--off', '--json']).json, { api_access: false })
  t.match(crm(url, ['user', 'api-access', '--email', 'ada@acme.test', '--on', '--json']).json, { api_access: true })
  t.match(crm(url, ['user', 'suspend', '--email', 'carol@acme.test', '--json']).json, { suspended_at: /Z$/ })
  t.match(crm(url, ['user', 'unsuspend', '--email', 'carol@acme.test', '--json']).json, { suspended_at: null })
  const built = await withOwner(url, async (client) =>
    client.query("update crm.roles set name = 'boss' where name = 'admin'").then(
      () => 'changed',
      (error) => error.message,
    ),
  )
  t.match(built, /built-in role admin cannot be changed/)
})
