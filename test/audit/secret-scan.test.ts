// The secret scan every test file's database passes before it is dropped (test/helpers/secrets.ts):
// a secret planted in an audit entry or an event's actor, as a superuser past the triggers that
// shape them, is found and named, by its format or by its value, wherever it sits in the text.
import { createHash, randomBytes } from 'node:crypto'
import fc from 'fast-check'
import t from 'tap'
import { newRecoveryCodes, newTotpSecret } from '../../src/auth/two-factor.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant, TEST_PASSWORD } from '../helpers/fixtures.ts'
import { assertNoSecretsInAudit, rememberSecret, secretsInDatabase } from '../helpers/secrets.ts'

const url = await createTestDatabase(t)
const superuser = await ownerClient(t, url)
const tenant = await createTenant(url, { members: { 'ada@scan.test': 'admin', 'bob@scan.test': 'member' } })
const ada = tenant.members['ada@scan.test']

/** Writes `details` into a new entry past the append-only and chaining triggers, runs `fn`, removes the entry. */
async function withPlantedEntry<T>(details: unknown, fn: () => Promise<T>): Promise<T> {
  await superuser.query('set session_replication_role = replica')
  const {
    rows: [entry],
  } = await superuser.query(
    `insert into crm.audit_log (workspace_id, seq, action, actor_via, target_type, details, prev_hash, hash)
     select $1, coalesce(max(seq), 0) + 1, 'token.created', 'api', 'user', $2, $3, $3 from crm.audit_log where workspace_id = $1
     returning seq`,
    [tenant.id, JSON.stringify(details), randomBytes(32)],
  )
  try {
    return await fn()
  } finally {
    await superuser.query('delete from crm.audit_log where workspace_id = $1 and seq = $2', [tenant.id, entry.seq])
    await superuser.query('set session_replication_role = origin')
  }
}

t.test('the entries the fixtures wrote hold no secret', async (t) => {
  const { rows } = await superuser.query('select count(*)::int as n from crm.audit_log where workspace_id = $1', [tenant.id])
  t.ok(rows[0].n > 0, 'there are entries to scan')
  t.same(await secretsInDatabase(url), [])
})

t.test('a token planted in an entry fails the scan, naming the entry', async (t) => {
  await withPlantedEntry({ name: `deploy key ${ada.token}` }, async () => {
    const found = await secretsInDatabase(url)
    t.match(found, [{ table: 'crm.audit_log', workspace: tenant.id, action: 'token.created', secret: 'bearer token' }])
    await t.rejects(
      assertNoSecretsInAudit(url),
      /SECRET IN AUDIT: bearer token in crm\.audit_log \(workspace [0-9a-f-]+, entry \d+, token\.created\)/,
    )
    t.notMatch(String(await assertNoSecretsInAudit(url).catch((error) => error)), ada.token, 'the message does not repeat the token')
  })
  t.same(await secretsInDatabase(url), [], 'clean again once it is gone')
})

t.test('any secret a helper issued, anywhere in an entry or an actor, is found', async (t) => {
  const secrets = [
    ['bearer token', ada.token],
    ['webhook secret', `whsec_${randomBytes(32).toString('base64')}`],
    ['OAuth client secret', `crmsec_${randomBytes(32).toString('base64url')}`],
    ['password hash', 'scrypt$16384$8$1$c2FsdA$a2V5'],
    ['SHA-256 digest (a stored token)', createHash('sha256').update(ada.token).digest('hex')],
    ['a secret a test helper issued or saw', newTotpSecret()],
    ['a secret a test helper issued or saw', newRecoveryCodes()[0]],
    ['a secret a test helper issued or saw', TEST_PASSWORD],
  ] as const
  for (const [, value] of secrets) rememberSecret(value)
  // Text around the secret that cannot itself spell one (no letters of the formats' prefixes).
  const filler = fc.string({ unit: fc.constantFrom(' ', '.', ',', '0', '1', '{', '"', 'é'), maxLength: 20 })
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom(...secrets),
      filler,
      filler,
      fc.constantFrom('details', 'nested', 'actor'),
      async ([kind, secret], before, after, where) => {
        const text = `${before}${secret}${after}`
        if (where === 'actor') {
          await superuser.query('set session_replication_role = replica')
          const {
            rows: [event],
          } = await superuser.query(
            `insert into crm.events (workspace_id, event, record_type, record_id, data, actor)
             values ($1, 'contact.created', 'contact', gen_random_uuid(), '{"object": {}}', jsonb_build_object('type', 'user', 'via', $2::text))
             returning id`,
            [tenant.id, text],
          )
          try {
            const found = await secretsInDatabase(url)
            return found.length === 1 && found[0].table === 'crm.events' && found[0].entry === event.id && found[0].secret === kind
          } finally {
            await superuser.query('delete from crm.events where id = $1', [event.id])
            await superuser.query('set session_replication_role = origin')
          }
        }
        const details = where === 'details' ? { name: text } : { previous: { names: ['x', text] } }
        return withPlantedEntry(details, async () => {
          const found = await secretsInDatabase(url)
          return found.length === 1 && found[0].table === 'crm.audit_log' && found[0].secret === kind
        })
      },
    ),
    { numRuns: 60 },
  )
  t.same(await secretsInDatabase(url), [])
})
