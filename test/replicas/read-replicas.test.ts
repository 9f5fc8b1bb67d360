// Reads on a real streaming standby: a throwaway primary and a standby made from it with
// `pg_basebackup -R`, from the system's PostgreSQL 15 (its embedded build has no pg_basebackup).
// The API reads on the standby (proven by reads a paused standby answers without a row written
// since), keeps workspaces and scopes apart there, shows a client its own writes at once, refuses a
// revoked token once the standby's lag passes READ_REPLICA_MAX_LAG_MS, and falls back to the
// primary when the standby is promoted or down. Skipped when the binaries are missing (.ci/run
// installs postgresql-15).
import t, { type Test } from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { TEST_APP_SECRET, type TestResponse, type TestServer } from '../helpers/server.ts'
import {
  missingStandbyBinaries,
  promoteCluster,
  query,
  serveWithStandby,
  startCluster,
  startStandbyPair,
  stopCluster,
  until,
} from '../helpers/standby.ts'

async function onStandby(t: Test): Promise<void> {
  const pair = await startStandbyPair(TEST_APP_SECRET)
  t.teardown(pair.stop)
  const { ownerUrl, standbyAdmin, standby, pauseReplay, resumeReplay, caughtUp } = pair
  t.equal((await query(standbyAdmin, 'select pg_is_in_recovery() as r')).rows[0].r, true, 'the standby is in recovery')

  const serve = (maxLagMs: number): Promise<TestServer> => serveWithStandby(t, pair, maxLagMs)
  const replicaReads = (service: TestServer) => service.readRouting?.report()[0].reads ?? 0
  const longReads = (service: TestServer) => service.readRouting?.report()[0].long_reads ?? 0

  const a = await createTenant(ownerUrl, {
    slug: 'replica-a',
    members: {
      'admin@a.test': 'admin',
      'bob@a.test': 'member',
      'carol@a.test': 'member',
      'dave@a.test': 'member',
      'erin@a.test': 'member',
      'frank@a.test': 'admin',
      'gina@a.test': 'member',
    },
  })
  const b = await createTenant(ownerUrl, { slug: 'replica-b', members: { 'admin@b.test': 'admin' } })
  const tokenA = a.members['admin@a.test'].token
  const tokenB = b.members['admin@b.test'].token
  const dealsOnly = await withOwner(ownerUrl, (client) => mintToken(client, a.members['admin@a.test'].id, { scopes: ['deals:read'] }))
  await caughtUp()

  // A cap far above any lag here: the standby answers whatever it has replayed.
  const wide = await serve(3_600_000)

  await t.test('reads go to the standby, and a paused standby answers without what it has not replayed', async (t) => {
    const created = await wide.request('POST', '/api/contacts', { token: tokenA, body: { first_name: 'Ada' } })
    t.equal(created.status, 201)
    await caughtUp()
    // The process learns that the standby has the write at its next check.
    await wide.readRouting?.check()
    // The first read authenticates in full on the primary; the next ones resume on the standby.
    t.equal((await wide.request('GET', '/api/contacts', { token: tokenA })).status, 200)
    const before = replicaReads(wide)
    await pauseReplay()
    t.teardown(resumeReplay)
    // Written behind the API's back: this process does not know the user wrote it.
    await withOwner(ownerUrl, (client) =>
      client.query(`insert into crm.contacts (workspace_id, owner_id, first_name) values ($1, $2, 'Unreplayed')`, [
        a.id,
        a.members['admin@a.test'].id,
      ]),
    )
    const list = await wide.request('GET', '/api/contacts?limit=200', { token: tokenA })
    t.equal(list.status, 200)
    t.same(
      list.body.data.map((contact: { first_name: string }) => contact.first_name),
      ['Ada'],
      'the standby answered: the row it has not replayed is not there',
    )
    t.ok(replicaReads(wide) > before, 'the standby counted the read')
    await resumeReplay()
    await caughtUp()
    const after = await wide.request('GET', '/api/contacts?limit=200', { token: tokenA })
    t.equal(after.body.data.length, 2, 'once replayed, the standby shows it')
  })

  await t.test('workspaces and scopes stay apart on the standby', async (t) => {
    const created = await wide.request('POST', '/api/contacts', { token: tokenA, body: { first_name: 'Secret' } })
    const id = created.body.data.id
    await caughtUp()
    await wide.request('GET', '/api/contacts', { token: tokenB })
    await wide.request('GET', '/api/deals', { token: dealsOnly })
    const before = replicaReads(wide)
    for (let i = 0; i < 5; i++) {
      t.equal(
        (await wide.request('GET', `/api/contacts/${id}`, { token: tokenB })).status,
        404,
        `another workspace reads nothing (${i + 1})`,
      )
      const foreign = await wide.request('GET', '/api/contacts?limit=200', { token: tokenB })
      t.same(foreign.body.data, [], 'nor lists it')
      const search = await wide.request('GET', '/api/contacts/search?q=Secret', { token: tokenB })
      t.same(search.body.data, [], 'nor finds it')
      const scoped = await wide.request('GET', `/api/contacts/${id}`, { token: dealsOnly })
      t.equal(scoped.status, 403, 'a deals:read token reads no contact')
      t.equal((await wide.request('GET', '/api/deals', { token: dealsOnly })).status, 200, 'but lists deals')
    }
    t.ok(replicaReads(wide) >= before + 15, `the standby answered them (${replicaReads(wide) - before} reads)`)
    t.equal((await wide.request('GET', `/api/contacts/${id}`, { token: tokenA })).status, 200, 'its own workspace reads it')
  })

  await t.test('the last-used bookkeeping a standby cannot write is left to the primary', async (t) => {
    t.equal((await wide.request('GET', '/api/contacts', { token: tokenA })).status, 200)
    // Last used two minutes ago: crm.resume_identity writes the bookkeeping, which a standby refuses.
    await withOwner(ownerUrl, (client) =>
      client.query(`update crm.tokens set last_used_at = now() - interval '2 minutes' where token_hash = $1`, [hashToken(tokenA)]),
    )
    await caughtUp()
    await wide.readRouting?.check()
    const read = await wide.request('GET', '/api/contacts', { token: tokenA })
    t.equal(read.status, 200, 'the read is answered')
    const { rows } = await query(
      ownerUrl,
      `select last_used_at > now() - interval '1 minute' as fresh from crm.tokens where token_hash = $1`,
      [hashToken(tokenA)],
    )
    t.equal(rows[0].fresh, true, 'by the primary, which wrote the bookkeeping')
  })

  await t.test('a client sees its own writes at once, every time', async (t) => {
    const before = replicaReads(wide)
    let seen = 0
    for (let i = 0; i < 100; i++) {
      const created = await wide.request('POST', '/api/deals', { token: tokenA, body: { name: `Deal ${i}` } })
      if (created.status !== 201) t.fail(`create ${i}: ${created.status} ${created.text}`)
      const id = created.body.data.id
      // Another user's read on the standby brings this process news of its replay position.
      await wide.request('GET', '/api/contacts', { token: tokenB })
      const list = await wide.request('GET', '/api/deals?sort=-created_at&limit=5', { token: tokenA })
      const one = await wide.request('GET', `/api/deals/${id}`, { token: tokenA })
      if (list.body.data.some((deal: { id: string }) => deal.id === id) && one.status === 200) seen++
    }
    t.equal(seen, 100, 'each deal is in the list and readable right after its creation')
    t.comment(`${replicaReads(wide) - before} of 300 reads answered by the standby (100 of them another user's)`)

    // With replay paused the standby cannot have the write: the reads go to the primary.
    await pauseReplay()
    t.teardown(resumeReplay)
    const created = await wide.request('POST', '/api/deals', { token: tokenA, body: { name: 'While paused' } })
    const read = await wide.request('GET', `/api/deals/${created.body.data.id}`, { token: tokenA })
    t.equal(read.status, 200, 'a write the paused standby has not replayed is read on the primary')
    await resumeReplay()
    await caughtUp()
  })

  await t.test('a revoked token is refused once the standby lags past the cap', async (t) => {
    const tight = await serve(500)
    const bob = a.members['bob@a.test']
    const dave = a.members['dave@a.test']
    t.equal((await tight.request('GET', '/api/contacts', { token: bob.token })).status, 200)
    t.equal((await tight.request('GET', '/api/contacts', { token: dave.token })).status, 200)
    const before = replicaReads(tight)
    t.equal((await tight.request('GET', '/api/contacts', { token: bob.token })).status, 200)
    t.ok(replicaReads(tight) > before, 'the token reads on the standby')
    await pauseReplay()
    t.teardown(resumeReplay)
    // Revoked on the primary, by another path than this process: only the cap bounds it.
    await withOwner(ownerUrl, (client) =>
      client.query('update crm.tokens set revoked_at = now() where token_hash = $1', [hashToken(bob.token)]),
    )
    await withOwner(ownerUrl, (client) =>
      client.query('update crm.memberships set suspended_at = now() where workspace_id = $1 and user_id = $2', [a.id, dave.id]),
    )
    const revokedAt = (await query(ownerUrl, 'select pg_current_wal_lsn() as lsn')).rows[0].lsn
    const refused = (await until('the revoked token is refused', async () => {
      const answer = await tight.request('GET', '/api/contacts', { token: bob.token })
      return answer.status === 401 ? answer : null
    })) as TestResponse
    t.equal(refused.body.code, 'token_revoked')
    const behind = (await query(standbyAdmin, 'select pg_last_wal_replay_lsn() < $1::pg_lsn as behind', [revokedAt])).rows[0].behind
    t.equal(behind, true, 'refused while the standby still has not replayed the revocation: the primary answered')
    for (let i = 0; i < 5; i++) t.equal((await tight.request('GET', '/api/contacts', { token: bob.token })).status, 401, 'and from then on')
    const suspended = await tight.request('GET', '/api/contacts', { token: dave.token })
    t.equal(suspended.status, 401, `the member suspended meanwhile is refused too (${suspended.body?.code})`)
    await until('the standby is reported lagging', async () => {
      await tight.readRouting?.check()
      return tight.readRouting?.report()[0].state === 'lagging'
    })
    const ready = await tight.request('GET', '/readyz')
    t.equal(ready.status, 200, 'still ready: the primary serves')
    t.equal(ready.body.replicas[0].state, 'lagging', '/readyz reports the standby lagging')
    t.ok(
      tight.logLines.some((line) => line.includes('read routing changed') && line.includes('"to":"lagging"')),
      'the change is logged',
    )
    await resumeReplay()
    await caughtUp()
  })

  await t.test('a role that loses grants, a role change and a removal apply on a paused standby within the cap', async (t) => {
    const erin = a.members['erin@a.test']
    const frank = a.members['frank@a.test']
    const gina = a.members['gina@a.test']
    // Erin's role may view and export contacts; Frank is an admin; Gina a member.
    await withOwner(ownerUrl, async (client) => {
      const {
        rows: [role],
      } = await client.query(`insert into crm.roles (workspace_id, name) values ($1, 'exporter') returning id`, [a.id])
      await client.query(
        `insert into crm.role_grants (workspace_id, role_id, resource, action, scope)
         select $1, $2, 'contacts', action, 'all' from unnest(array['view', 'export']) action`,
        [a.id, role.id],
      )
      await client.query('update crm.memberships set role_id = $1 where workspace_id = $2 and user_id = $3', [role.id, a.id, erin.id])
    })
    await caughtUp()
    const tight = await serve(500)
    const exportContacts = (service: TestServer, token: string) =>
      service.request('POST', '/api/contacts/export', { token, body: { fields: ['id'] } })
    const listsContacts = async (service: TestServer, token: string) => {
      const answer = await service.request('GET', '/api/contacts?limit=200', { token })
      return answer.status === 200 && answer.body.data.length > 0
    }
    for (const service of [wide, tight]) {
      await service.readRouting?.check()
      for (const member of [erin, frank, gina])
        t.equal((await service.request('GET', '/api/contacts', { token: member.token })).status, 200)
    }
    const before = { reads: replicaReads(tight), exports: longReads(tight) }
    t.equal(await listsContacts(tight, erin.token), true, 'Erin lists contacts')
    t.equal(await listsContacts(tight, gina.token), true, 'Gina lists contacts')
    t.equal((await exportContacts(tight, erin.token)).status, 200, 'Erin exports them')
    t.equal((await exportContacts(tight, frank.token)).status, 200, 'Frank exports them')
    t.ok(replicaReads(tight) > before.reads && longReads(tight) > before.exports, 'on the standby')

    // Their last-used bookkeeping, which a standby cannot write, is made not due for a minute from
    // here, so the paused standby's answers below are not left to the primary for it.
    await query(ownerUrl, 'update crm.tokens set last_used_at = now() where user_id = any($1::uuid[])', [[erin.id, frank.id, gina.id]])
    await caughtUp()
    await pauseReplay()
    t.teardown(resumeReplay)
    // Changed on the primary by another path than these processes: only the cap bounds them.
    await withOwner(ownerUrl, async (client) => {
      await client.query(
        `delete from crm.role_grants where workspace_id = $1 and role_id = (select id from crm.roles where workspace_id = $1 and name = 'exporter')`,
        [a.id],
      )
      await client.query(
        `update crm.memberships set role_id = (select id from crm.roles where workspace_id = $1 and name = 'read_only') where workspace_id = $1 and user_id = $2`,
        [a.id, frank.id],
      )
      await client.query('delete from crm.memberships where workspace_id = $1 and user_id = $2', [a.id, gina.id])
    })
    const changedAt = (await query(ownerUrl, 'select pg_current_wal_lsn() as lsn')).rows[0].lsn

    // Within the cap (an hour here), the paused standby answers with the grants it has replayed.
    const wideBefore = { reads: replicaReads(wide), exports: longReads(wide) }
    t.equal(await listsContacts(wide, erin.token), true, 'within the cap, the standby still lists contacts to Erin')
    t.equal((await exportContacts(wide, frank.token)).status, 200, 'and exports them to Frank')
    t.equal(await listsContacts(wide, gina.token), true, 'and lists them to Gina')
    t.ok(replicaReads(wide) >= wideBefore.reads + 2 && longReads(wide) === wideBefore.exports + 1, 'the standby answered them')

    // Past the cap (500 ms), the primary answers, with the new grants.
    await until('the export grant Erin lost is refused', async () => (await exportContacts(tight, erin.token)).status === 403)
    t.equal(await listsContacts(tight, erin.token), false, 'Erin lists no contact: her role lost the view grant')
    t.equal((await exportContacts(tight, frank.token)).status, 403, 'Frank, read_only now, exports nothing')
    t.equal(await listsContacts(tight, frank.token), true, 'but still lists')
    const removed = await tight.request('GET', '/api/contacts', { token: gina.token })
    t.ok(removed.status === 401 || removed.status === 404, `Gina, removed, is refused (${removed.status} ${removed.body?.code})`)
    const behind = (await query(standbyAdmin, 'select pg_last_wal_replay_lsn() < $1::pg_lsn as behind', [changedAt])).rows[0].behind
    t.equal(behind, true, 'while the standby still has not replayed the changes: the primary answered')
    await resumeReplay()
    await caughtUp()
  })

  await t.test('a standby that goes down is skipped without an error, and used again once back', async (t) => {
    const carol = a.members['carol@a.test'].token
    await wide.readRouting?.check()
    t.equal((await wide.request('GET', '/api/contacts', { token: carol })).status, 200)
    stopCluster(standby)
    for (let i = 0; i < 5; i++) {
      t.equal((await wide.request('GET', '/api/contacts', { token: carol })).status, 200, `read ${i + 1} with the standby down`)
    }
    t.equal(wide.readRouting?.report()[0].state, 'down', 'the failed read took the standby out at once')
    t.equal((await wide.request('GET', '/readyz')).body.replicas[0].state, 'down', '/readyz reports it')
    t.ok(
      wide.logLines.some((line) => line.includes('read routing changed') && line.includes('"to":"down"')),
      'the change is logged',
    )
    startCluster(standby)
    await caughtUp()
    await until('the standby serves again', async () => {
      await wide.readRouting?.check()
      return wide.readRouting?.report()[0].state === 'serving'
    })
    const before = replicaReads(wide)
    t.equal((await wide.request('GET', '/api/contacts', { token: carol })).status, 200)
    t.ok(replicaReads(wide) > before, 'and answers again')
  })

  await t.test('a promoted standby, then a stopped one, is skipped without an error', async (t) => {
    // Carol writes nothing: only the standby's own state keeps her reads off it.
    const carol = a.members['carol@a.test'].token
    await wide.readRouting?.check()
    const carolBefore = replicaReads(wide)
    t.equal((await wide.request('GET', '/api/contacts/search?q=Primary', { token: carol })).status, 200)
    t.equal((await wide.request('GET', '/api/contacts/search?q=Primary', { token: carol })).status, 200)
    t.ok(replicaReads(wide) > carolBefore, 'her reads are on the standby')
    const created = await wide.request('POST', '/api/contacts', { token: tokenA, body: { first_name: 'Before promotion' } })
    await caughtUp()
    promoteCluster(standby)
    const after = await wide.request('POST', '/api/contacts', { token: tokenA, body: { first_name: 'After promotion' } })
    for (const id of [created.body.data.id, after.body.data.id]) {
      t.equal((await wide.request('GET', `/api/contacts/${id}`, { token: tokenA })).status, 200, 'read on the primary')
    }
    // Written behind the API's back, after the promotion: only the primary has it.
    await withOwner(ownerUrl, (client) =>
      client.query(`insert into crm.contacts (workspace_id, owner_id, first_name) values ($1, $2, 'Primary only')`, [
        a.id,
        a.members['admin@a.test'].id,
      ]),
    )
    for (const token of [tokenA, carol]) {
      const listed = await wide.request('GET', '/api/contacts/search?q=Primary', { token })
      t.equal(listed.body.data.length, 1, 'the promoted server does not answer')
    }
    await until('the standby is reported promoted', async () => {
      await wide.readRouting?.check()
      return wide.readRouting?.report()[0].state === 'promoted'
    })
    t.ok(
      wide.logLines.some((line) => line.includes('read routing changed') && line.includes('"to":"promoted"')),
      'the change is logged',
    )
    stopCluster(standby)
    for (let i = 0; i < 5; i++) {
      t.equal((await wide.request('GET', '/api/contacts?limit=200', { token: tokenA })).status, 200, `read ${i + 1} with the standby down`)
    }
    await until('the standby is reported down', async () => {
      await wide.readRouting?.check()
      return wide.readRouting?.report()[0].state === 'down'
    })
    t.equal((await wide.request('GET', '/readyz')).body.replicas[0].state, 'down')
    t.ok(
      wide.logLines.some((line) => line.includes('read routing changed') && line.includes('"to":"down"')),
      'the change is logged',
    )
  })
}

const missing = missingStandbyBinaries()
if (missing.length > 0) {
  t.comment(`skipped: ${missing.join(', ')} missing (apt-get install postgresql-15; .ci/run installs it)`)
  t.pass('PostgreSQL 15 server binaries are not installed')
} else {
  t.test('reads on a streaming standby', onStandby)
}
