// A server given in READ_REPLICA_URLS that is not a standby of the primary is never read: here a
// standby of another cluster (its own primary and `pg_basebackup -R` copy, the same schema and the
// same runtime role), in recovery, with hot_standby_feedback on and a replay position past the
// primary's own, so that replay positions alone would not keep it out: without the identity check
// it served, and the reads went to it (its reads counted).
// Skipped when the PostgreSQL 15 binaries are missing (.ci/run installs postgresql-15).
import t from 'tap'
import { notAStandbyOf } from '../../src/db/request/read-replicas.ts'
import { createTenant, withOwner } from '../helpers/fixtures.ts'
import { startTestServer, TEST_APP_SECRET } from '../helpers/server.ts'
import { missingStandbyBinaries, query, startStandbyPair } from '../helpers/standby.ts'

t.test('the identity rule', async (t) => {
  const primary = { cluster: '7000000000000000001', timeline: 2 }
  t.equal(notAStandbyOf(primary, { ...primary, standby: true }), null, 'a standby of this cluster on its timeline')
  t.equal(notAStandbyOf(primary, { ...primary, timeline: 1, standby: true }), null, 'one whose last restartpoint predates a promotion')
  t.match(notAStandbyOf(primary, { cluster: '7000000000000000002', timeline: 2, standby: true }), /system identifier/)
  t.match(notAStandbyOf(primary, { ...primary, timeline: 3, standby: true }), /timeline 3/, 'one following a sibling promoted away')
})

const missing = missingStandbyBinaries()
if (missing.length > 0) {
  t.comment(`skipped: ${missing.join(', ')} missing (apt-get install postgresql-15; .ci/run installs it)`)
} else {
  t.test('a standby of another cluster is refused and never read', async (t) => {
    const foreign = await startStandbyPair(TEST_APP_SECRET, { walStartSegment: '000000010000010000000000' })
    t.teardown(foreign.stop)
    // The same workspace exists on both clusters, with other rows on the foreign one.
    const server = await startTestServer(t, { env: { RATE_LIMIT_PER_MINUTE: '1000000' } })
    const ours = await createTenant(server.databaseUrl, { slug: 'ours', members: { 'ada@ours.test': 'admin' } })
    const theirs = await createTenant(foreign.ownerUrl, { slug: 'ours', members: { 'ada@ours.test': 'admin' } })
    await withOwner(foreign.ownerUrl, (client) =>
      client.query(`insert into crm.contacts (workspace_id, owner_id, first_name) values ($1, $2, 'Foreign')`, [
        theirs.id,
        theirs.members['ada@ours.test'].id,
      ]),
    )
    // The foreign standby's replay position past our primary's, so that positions alone would let it
    // serve: the foreign cluster starts its WAL at 0x100/0 (1 TiB), beyond anything a test run writes.
    const ourLsn = (await query(server.databaseUrl, 'select pg_current_wal_insert_lsn() as lsn')).rows[0].lsn
    const { rows } = await query(foreign.ownerUrl, 'select pg_current_wal_insert_lsn() > $1::pg_lsn as past', [ourLsn])
    t.ok(rows[0].past, 'the foreign cluster is past our WAL position')
    await foreign.caughtUp()

    const routed = await startTestServer(t, {
      databaseUrl: server.databaseUrl,
      env: { READ_REPLICA_URLS: foreign.replicaUrl, READ_REPLICA_MAX_LAG_MS: '3600000', RATE_LIMIT_PER_MINUTE: '1000000' },
    })
    // Two whole checks (the first may run before the primary's identity is known): by then a
    // standby would be serving.
    await routed.readRouting?.check()
    await routed.readRouting?.check()
    const token = ours.members['ada@ours.test'].token
    for (let i = 0; i < 5; i++) {
      const list = await routed.request('GET', '/api/contacts?limit=200', { token })
      t.same(list.body.data, [], `read ${i + 1}: our primary answered (no foreign row)`)
      const exported = await routed.request('POST', '/api/contacts/export', { token, body: { format: 'ndjson' } })
      t.equal(exported.text, '', `export ${i + 1}: our primary answered`)
    }
    const report = routed.readRouting?.report()[0]
    t.equal(report?.state, 'refused', 'the foreign standby is refused')
    t.equal(report?.reads, 0, 'no read went to the foreign standby')
    t.equal(report?.long_reads, 0, 'nor any export')
    t.equal((await routed.request('GET', '/readyz')).body.replicas[0].state, 'refused', '/readyz says refused')
    t.ok(
      routed.logLines.some((line) => line.includes('"to":"refused"') && line.includes('system identifier')),
      'the refusal is logged with its reason',
    )
  })
}
