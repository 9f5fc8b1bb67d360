// Exports on a real streaming standby (test/helpers/standby.ts): an export runs on the standby
// (proven by the standby's long-read count and by a row it has not replayed), keeps workspaces and
// scopes apart there, shows a client its own writes at once, goes to the primary once the standby
// lags past READ_REPLICA_MAX_LAG_MS (where a revoked token is refused), and meets the standby's
// conflicts with replay: before the answer began the primary runs it instead, after it the client
// sees a failed transfer, never a shorter file that looks whole. Skipped without the binaries.
import pg from 'pg'
import t, { type Test } from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { TEST_APP_SECRET, type TestServer } from '../helpers/server.ts'
import { missingStandbyBinaries, query, serveWithStandby, startCluster, startStandbyPair, stopCluster, until } from '../helpers/standby.ts'

async function onStandby(t: Test): Promise<void> {
  const pair = await startStandbyPair(TEST_APP_SECRET)
  t.teardown(pair.stop)
  const { ownerUrl, standby, standbyAdmin, pauseReplay, resumeReplay, caughtUp } = pair

  const serve = (maxLagMs: number): Promise<TestServer> => serveWithStandby(t, pair, maxLagMs)
  const longReads = (service: TestServer) => service.readRouting?.report()[0].long_reads ?? 0
  // A token's last-used bookkeeping falls due once a minute and the standby cannot write it, so such
  // an export is left to the primary (tested below). An assertion that one export is the standby's
  // marks the token used just before, on the primary, and waits for the standby to replay it.
  const usedJustNow = async (token: string) => {
    await query(ownerUrl, 'update crm.tokens set last_used_at = now() where token_hash = $1', [hashToken(token)])
    await caughtUp()
  }
  // The opposite: the bookkeeping falls due on the token's next request, which the standby cannot write.
  const lastUseDue = async (token: string) => {
    await query(ownerUrl, `update crm.tokens set last_used_at = now() - interval '2 minutes' where token_hash = $1`, [hashToken(token)])
    await caughtUp()
  }
  const replicaReads = (service: TestServer) => service.readRouting?.report()[0].reads ?? 0
  const exported = async (service: TestServer, token: string, type: string, body: unknown = { fields: ['id', 'name'] }) => {
    const answer = await service.request('POST', `/api/${type}/export`, { token, body })
    return { ...answer, lines: answer.status === 200 ? answer.text.split('\r\n').filter((line) => line !== '') : [] }
  }

  const a = await createTenant(ownerUrl, {
    slug: 'export-a',
    members: { 'admin@a.test': 'admin', 'member@a.test': 'member', 'revoked@a.test': 'admin' },
  })
  const b = await createTenant(ownerUrl, { slug: 'export-b', members: { 'admin@b.test': 'admin' } })
  const admin = a.members['admin@a.test']
  const tokenB = b.members['admin@b.test'].token
  const dealsOnly = await withOwner(ownerUrl, (client) => mintToken(client, admin.id, { scopes: ['deals:read'] }))
  await caughtUp()
  // A cap far above any lag here: the standby answers whatever it has replayed.
  const wide = await serve(3_600_000)
  t.equal(wide.readRouting?.report()[0].hot_standby_feedback, true, 'the check read hot_standby_feedback')

  await t.test('an export is served by the standby, without what the standby has not replayed', async (t) => {
    t.equal((await wide.request('POST', '/api/companies', { token: admin.token, body: { name: 'Replayed Ltd' } })).status, 201)
    await caughtUp()
    await wide.readRouting?.check()
    // The token's first request authenticates in full on the primary; its exports then resume on the standby.
    t.equal((await wide.request('GET', '/api/companies', { token: admin.token })).status, 200)
    await usedJustNow(admin.token)
    const before = longReads(wide)
    const first = await exported(wide, admin.token, 'companies')
    t.equal(first.status, 200)
    t.same(
      first.lines.slice(1).map((line) => line.split(',')[1]),
      ['Replayed Ltd'],
    )
    t.equal(longReads(wide), before + 1, 'the standby answered the export')
    await pauseReplay()
    t.teardown(resumeReplay)
    // Written behind the API's back: this process does not know the user wrote it.
    await withOwner(ownerUrl, (client) =>
      client.query(`insert into crm.companies (workspace_id, owner_id, name) values ($1, $2, 'Unreplayed Ltd')`, [a.id, admin.id]),
    )
    const paused = await exported(wide, admin.token, 'companies')
    t.same(
      paused.lines.slice(1).map((line) => line.split(',')[1]),
      ['Replayed Ltd'],
      'the paused standby answered: the row it has not replayed is not there',
    )
    t.equal(longReads(wide), before + 2)
    const ready = await wide.request('GET', '/readyz')
    t.equal(ready.body.replicas[0].long_reads, before + 2, '/readyz counts the exports the standby answered')
    await resumeReplay()
    await caughtUp()
  })

  await t.test('workspaces and scopes stay apart on an export from the standby', async (t) => {
    const secret = await wide.request('POST', '/api/contacts', { token: admin.token, body: { first_name: 'Secret', email: 's@a.test' } })
    t.equal(secret.status, 201)
    await caughtUp()
    await wide.readRouting?.check()
    const member = a.members['member@a.test'].token
    for (const token of [tokenB, dealsOnly, member]) {
      t.equal((await wide.request('GET', '/api/deals', { token })).status, 200)
      await usedJustNow(token)
    }
    const before = longReads(wide)
    const logged = wide.logLines.length
    for (let i = 0; i < 3; i++) {
      const foreign = await exported(wide, tokenB, 'contacts', { fields: ['id', 'first_name'] })
      t.equal(foreign.status, 200)
      t.same(foreign.lines, ['id,first_name'], 'another workspace exports nothing of it')
      const scoped = await exported(wide, dealsOnly, 'contacts')
      t.equal(scoped.status, 403, 'a deals:read token exports no contact')
      t.equal(scoped.body.code, 'insufficient_scope')
      const refused = await exported(wide, member, 'contacts')
      t.equal(refused.status, 403, 'a member without the export grant is refused')
      const deals = await exported(wide, dealsOnly, 'deals')
      t.equal(deals.status, 200, 'the deals:read token exports deals')
    }
    // A token's last-used bookkeeping falls due once a minute, and the standby cannot write it: such
    // an export is left to the primary (on a slow machine this loop can cross that minute). So is
    // one whose connection to the standby is not made within its timeout on a loaded machine, or
    // whose user's last write (the Secret contact above) the standby has not replayed within the cap:
    // the primary answers those, fresh. Every other export, refusals included, is the standby's.
    const fallbacks = wide.logLines.slice(logged).filter((line) => line.includes('a long read was left to the primary'))
    const bookkeeping = fallbacks.filter((line) => line.includes('read-only transaction'))
    const unreached = fallbacks.filter(
      (line) => /timeout|connect|not known to have replayed/i.test(line) && !line.includes('read-only transaction'),
    )
    t.same(
      fallbacks.filter((line) => !bookkeeping.includes(line) && !unreached.includes(line)),
      [],
      'only the last-used bookkeeping (or a standby not reached in time) left an export to the primary',
    )
    t.ok(bookkeeping.length <= 3, 'the bookkeeping at most once for each of the three tokens')
    t.ok(fallbacks.length <= 6, 'the standby answered most of them', { fallbacks })
    t.equal(longReads(wide), before + 12 - fallbacks.length, 'the standby answered all the others, refusals included')
    const own = await exported(wide, admin.token, 'contacts', { fields: ['id', 'first_name'] })
    t.ok(own.lines.includes(`${secret.body.data.id},Secret`), 'its own workspace exports it')
  })

  await t.test('an export right after a create shows it, every time', async (t) => {
    const before = longReads(wide)
    let seen = 0
    for (let i = 0; i < 40; i++) {
      const created = await wide.request('POST', '/api/deals', { token: admin.token, body: { name: `Export deal ${i}` } })
      if (created.status !== 201) t.fail(`create ${i}: ${created.status} ${created.text}`)
      // Another user's read on the standby brings this process news of its replay position.
      await wide.request('GET', '/api/deals', { token: tokenB })
      const answer = await exported(wide, admin.token, 'deals', { fields: ['id'], filter: { name: `Export deal ${i}` } })
      if (answer.status === 200 && answer.lines.includes(created.body.data.id)) seen++
    }
    t.equal(seen, 40, 'each deal is in the export right after its creation')
    t.comment(`${longReads(wide) - before} of 40 exports answered by the standby`)
    t.ok(longReads(wide) > before, 'some of them on the standby')

    // With replay paused the standby cannot have the write: the export goes to the primary.
    await pauseReplay()
    t.teardown(resumeReplay)
    const created = await wide.request('POST', '/api/deals', { token: admin.token, body: { name: 'While paused' } })
    const paused = longReads(wide)
    const answer = await exported(wide, admin.token, 'deals', { fields: ['id'], filter: { name: 'While paused' } })
    t.ok(answer.lines.includes(created.body.data.id), 'a write the paused standby has not replayed is exported by the primary')
    t.equal(longReads(wide), paused, 'not by the standby')
    await resumeReplay()
    await caughtUp()
  })

  await t.test('the last-used bookkeeping a standby cannot write leaves the export to the primary', async (t) => {
    t.equal((await wide.request('GET', '/api/deals', { token: admin.token })).status, 200)
    await lastUseDue(admin.token)
    await wide.readRouting?.check()
    const before = longReads(wide)
    const answer = await exported(wide, admin.token, 'companies')
    t.equal(answer.status, 200, 'the export is answered')
    t.equal(longReads(wide), before, 'by the primary')
    // The answer ends before the export's transaction commits: wait for the commit, not for time.
    await until('the primary wrote the bookkeeping', async () => {
      const { rows } = await query(
        ownerUrl,
        `select last_used_at > now() - interval '1 minute' as fresh from crm.tokens where token_hash = $1`,
        [hashToken(admin.token)],
      )
      return rows[0].fresh
    })
    t.pass('which wrote the bookkeeping')
    t.ok(
      wide.logLines.some((line) => line.includes('a long read was left to the primary') && line.includes('read-only transaction')),
      'the fallback is logged with its reason',
    )
  })

  await t.test('an export the standby leaves to the primary counts once against the rate limit', async (t) => {
    const remaining = (answer: { headers: Headers }) => Number(answer.headers.get('ratelimit-remaining'))
    // Refused after authentication: a write the standby has not replayed.
    await pauseReplay()
    t.teardown(resumeReplay)
    const created = await wide.request('POST', '/api/deals', { token: admin.token, body: { name: 'Counted once' } })
    t.equal(created.status, 201)
    const afterWrite = await exported(wide, admin.token, 'deals', { fields: ['id'], filter: { name: 'Counted once' } })
    t.ok(afterWrite.lines.includes(created.body.data.id), 'the primary answered the export')
    t.equal(remaining(afterWrite), remaining(created) - 1, 'one request less, not two')
    await resumeReplay()
    await caughtUp()
    // Refused by authentication itself: the last-used bookkeeping a standby cannot write.
    const read = await wide.request('GET', '/api/deals', { token: admin.token })
    await lastUseDue(admin.token)
    await wide.readRouting?.check()
    const before = longReads(wide)
    const due = await exported(wide, admin.token, 'companies')
    t.equal(due.status, 200)
    t.equal(longReads(wide), before, 'the primary answered the export')
    t.equal(remaining(due), remaining(read) - 1, 'one request less, not two')
  })

  await t.test('past the cap, exports go to the primary, where a revoked token is refused', async (t) => {
    const tight = await serve(500)
    const revoked = a.members['revoked@a.test']
    t.equal((await tight.request('GET', '/api/companies', { token: admin.token })).status, 200)
    t.equal((await tight.request('GET', '/api/companies', { token: revoked.token })).status, 200)
    await usedJustNow(revoked.token)
    const before = longReads(tight)
    t.equal((await exported(tight, revoked.token, 'companies')).status, 200)
    t.equal(longReads(tight), before + 1, 'the token exports on the standby')
    await pauseReplay()
    t.teardown(resumeReplay)
    await withOwner(ownerUrl, async (client) => {
      await client.query(`insert into crm.companies (workspace_id, owner_id, name) values ($1, $2, 'Primary only Ltd')`, [a.id, admin.id])
      await client.query('update crm.tokens set revoked_at = now() where token_hash = $1', [hashToken(revoked.token)])
    })
    const changedAt = (await query(ownerUrl, 'select pg_current_wal_lsn() as lsn')).rows[0].lsn
    await until('the export comes from the primary', async () => {
      const answer = await exported(tight, admin.token, 'companies')
      return answer.lines.some((line) => line.endsWith(',Primary only Ltd'))
    })
    const refused = await exported(tight, revoked.token, 'companies')
    t.equal(refused.status, 401, 'the revoked token is refused')
    t.equal(refused.body.code, 'token_revoked')
    const behind = (await query(standbyAdmin, 'select pg_last_wal_replay_lsn() < $1::pg_lsn as behind', [changedAt])).rows[0].behind
    t.equal(behind, true, 'while the standby still has not replayed the revocation: the primary answered')
    await resumeReplay()
    await caughtUp()
  })

  await t.test('a standby without hot_standby_feedback serves reads but no export', async (t) => {
    let feedbackOff = false
    const restart = async (extra: string[]) => {
      feedbackOff = extra.length > 0
      stopCluster(standby)
      startCluster(standby, extra)
      await caughtUp()
      await until('the standby serves', async () => {
        await wide.readRouting?.check()
        return wide.readRouting?.report()[0].state === 'serving'
      })
    }
    await restart(['-c hot_standby_feedback=off'])
    t.teardown(() => (feedbackOff ? restart([]) : undefined))
    t.equal(wide.readRouting?.report()[0].hot_standby_feedback, false, 'the check read it off')
    const before = { reads: replicaReads(wide), exports: longReads(wide) }
    t.equal((await wide.request('GET', '/api/companies', { token: admin.token })).status, 200)
    t.equal((await exported(wide, admin.token, 'companies')).status, 200)
    t.ok(replicaReads(wide) > before.reads, 'the list is read on the standby')
    t.equal(longReads(wide), before.exports, 'the export on the primary')
    await restart([])
    t.equal(wide.readRouting?.report()[0].hot_standby_feedback, true)
    await usedJustNow(admin.token)
    t.equal((await exported(wide, admin.token, 'companies')).status, 200)
    t.equal(longReads(wide), before.exports + 1, 'with it on again, the standby serves exports')
  })

  await t.test('conflicts with replay: before the answer the primary runs the export, after it the transfer fails', async (t) => {
    const deals = 80_000
    // Loaded without the outbox triggers: this test is about reading. Long names make the file far
    // larger than what the sockets between the API and a client that stops reading can hold.
    await withOwner(ownerUrl, async (client) => {
      await client.query('set session_replication_role = replica')
      await client.query(
        `insert into crm.deals (workspace_id, owner_id, created_by, updated_by, name, stage)
         select $1, $2, $2, $2, 'Bulk ' || g || repeat(' padding', 20), 'lead' from generate_series(1, ${deals}) g`,
        [b.id, b.members['admin@b.test'].id],
      )
    })
    // The standby cancels a conflicting read at once instead of after 30 s.
    await query(standbyAdmin, 'alter system set max_standby_streaming_delay = 0')
    await query(standbyAdmin, 'select pg_reload_conf()')
    t.teardown(async () => {
      await query(standbyAdmin, 'alter system reset max_standby_streaming_delay')
      await query(standbyAdmin, 'select pg_reload_conf()')
    })
    await until('the standby reloaded its settings', async () => {
      return (
        (await query(standbyAdmin, `select setting from pg_settings where name = 'max_standby_streaming_delay'`)).rows[0].setting === '0'
      )
    })
    await caughtUp()
    await wide.readRouting?.check()
    /** An ACCESS EXCLUSIVE lock taken and released on the primary: replayed, it takes the lock on the standby too. */
    const lockOnPrimary = (table: string) =>
      withOwner(ownerUrl, async (client) => {
        await client.query('begin')
        await client.query(`lock table ${table} in access exclusive mode`)
        await client.query('commit')
      })
    const conflicts = async () =>
      Number(
        (await query(standbyAdmin, `select confl_lock from pg_stat_database_conflicts where datname = current_database()`)).rows[0]
          .confl_lock,
      )

    // Before the answer: the standby's export waits for a lock replay holds on crm.deals (an
    // ACCESS EXCLUSIVE lock on the primary, in a transaction left open); a second such lock, on a
    // table the export's authentication has read, makes replay cancel the export. The primary
    // then runs it, once the first lock is gone.
    const before = longReads(wide)
    const conflictsBefore = await conflicts()
    const holder = new pg.Client({ connectionString: ownerUrl })
    await holder.connect()
    await holder.query('begin')
    await holder.query('lock table crm.deals in access exclusive mode')
    const lockedAt = (await query(ownerUrl, 'select pg_current_wal_insert_lsn() as lsn')).rows[0].lsn
    await until('the standby holds the lock', async () => {
      return (await query(standbyAdmin, 'select pg_last_wal_replay_lsn() >= $1::pg_lsn as ok', [lockedAt])).rows[0].ok
    })
    const pending = exported(wide, tokenB, 'deals')
    await until('the export waits for the lock on the standby', async () => {
      const { rows } = await query(
        standbyAdmin,
        `select count(*)::int as n from pg_locks where relation = 'crm.deals'::regclass and not granted`,
      )
      return rows[0].n > 0
    })
    await lockOnPrimary('crm.memberships')
    await until('the export is left to the primary', async () =>
      wide.logLines.some((line) => line.includes('a long read was left to the primary') && line.includes('conflict with recovery')),
    )
    await holder.query('commit')
    await holder.end()
    const whole = await pending
    t.equal(whole.status, 200, 'the client sees an answer')
    t.equal(whole.lines.length, deals + 1, 'the whole file, from the primary')
    t.equal(longReads(wide), before, 'not from the standby')
    // The cancelled backend reports the conflict itself, with its other statistics: at once when it
    // exits, or once idle for a while when its connection goes back to the pool (a refused
    // transaction keeps its connection, docs/decisions.md).
    await until('replay cancelled the standby export (pg_stat_database_conflicts)', async () => (await conflicts()) > conflictsBefore)
    t.pass('replay cancelled the standby export (pg_stat_database_conflicts)')

    // After the answer began: the client reads the first bytes and stops; replay meets the
    // export's lock again and ends its transaction on the standby; the response is cut.
    await caughtUp()
    await wide.readRouting?.check()
    const response = await fetch(`${wide.url}/api/deals/export`, {
      method: 'POST',
      headers: { authorization: `Bearer ${tokenB}`, 'content-type': 'application/json' },
      body: JSON.stringify({ fields: ['id', 'name'] }),
    })
    t.equal(response.status, 200)
    const reader = (response.body as ReadableStream<Uint8Array>).getReader()
    let bytes = (await reader.read()).value?.length ?? 0
    await until('the standby export waits on its reader, its transaction open', async () => {
      const { rows } = await query(
        standbyAdmin,
        `select count(*)::int as n from pg_stat_activity where state = 'idle in transaction' and query like 'fetch forward%'`,
      )
      return rows[0].n > 0
    })
    const midConflicts = await conflicts()
    await lockOnPrimary('crm.deals')
    await caughtUp()
    let failed: unknown = null
    try {
      for (;;) {
        const { done, value } = await reader.read()
        if (done) break
        bytes += value.length
      }
    } catch (error) {
      failed = error
    }
    t.ok(failed, `the client sees a failed transfer (${(failed as Error)?.message}; ${bytes} bytes arrived)`)
    await until('replay ended the standby export (pg_stat_database_conflicts)', async () => (await conflicts()) > midConflicts)
    t.pass('replay ended the standby export')
    t.ok(
      wide.logLines.some((line) => line.includes('a long read on a standby failed after its answer began')),
      'the cut is logged with its standby',
    )
    // The standby serves the next export.
    await wide.readRouting?.check()
    const next = longReads(wide)
    t.equal((await exported(wide, tokenB, 'companies')).status, 200)
    t.equal(longReads(wide), next + 1, 'the standby serves the next export')
  })
}

const missing = missingStandbyBinaries()
if (missing.length > 0) {
  t.comment(`skipped: ${missing.join(', ')} missing (apt-get install postgresql-15; .ci/run installs it)`)
  t.pass('PostgreSQL 15 server binaries are not installed')
} else {
  t.test('exports on a streaming standby', onStandby)
}
