// The deal board's move form, the record page's association form and each step of the import
// wizard under hostile input (docs/api.md section 12): fast-check combines a megabyte field, NUL
// bytes, unknown and repeated field names, another workspace's ids, a record the user may view but
// not edit, a stale version, a missing or foreign CSRF token and a type that is not one of the
// three. Only the one well-formed combination writes; every other answers a 4xx page (never a 500)
// and leaves the records, their associations, the imports and the outbox as they were.
import fc from 'fast-check'
import t from 'tap'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const acme = await createTenant(server.databaseUrl, { slug: 'acme', members: { 'ada@acme.test': 'admin', 'rex@acme.test': 'read_only' } })
const globex = await createTenant(server.databaseUrl, { slug: 'globex', members: { 'gus@globex.test': 'admin' } })
const ada = acme.members['ada@acme.test']
const gus = globex.members['gus@globex.test']
const api = (token: string, method: string, path: string, body?: unknown) => server.request(method, path, { token, body })

const deal = (await api(ada.token, 'POST', '/api/deals', { name: 'Atlas renewal', amount: '100.00' })).body.data.id as string
const contact = (await api(ada.token, 'POST', '/api/contacts', { first_name: 'Ada' })).body.data.id as string
const company = (await api(ada.token, 'POST', '/api/companies', { name: 'Initech' })).body.data.id as string
const foreignDeal = (await api(gus.token, 'POST', '/api/deals', { name: 'Globex deal' })).body.data.id as string
const foreignContact = (await api(gus.token, 'POST', '/api/contacts', { first_name: 'Gus' })).body.data.id as string
const foreignCompany = (await api(gus.token, 'POST', '/api/companies', { name: 'Globex' })).body.data.id as string

const csrfOf = (text: string) => /name="csrf" value="([^"]+)"/.exec(text)?.[1] ?? ''
async function browserOf(userId: string) {
  const session = await withOwner(server.databaseUrl, (client) => mintToken(client, userId, { kind: 'session' }))
  const cookie = `crm_session=${session}`
  const csrf = csrfOf(await (await fetch(`${server.url}/contacts/${contact}`, { headers: { cookie } })).text())
  return { cookie, csrf }
}
const adaBrowser = await browserOf(ada.id)
const rexBrowser = await browserOf(acme.members['rex@acme.test'].id)
t.ok(adaBrowser.csrf && rexBrowser.csrf, 'both sessions have a CSRF token')

type Fields = [string, string][]
const MEGABYTE = 'x'.repeat(1 << 20)

/** Posts the fields in order (a name may repeat) as a browser of `who` would. */
async function post(who: { cookie: string }, path: string, fields: Fields): Promise<{ status: number; location: string | null }> {
  const body = new URLSearchParams()
  for (const [name, value] of fields) body.append(name, value)
  const answer = await fetch(server.url + path, {
    method: 'POST',
    redirect: 'manual',
    headers: { cookie: who.cookie, 'content-type': 'application/x-www-form-urlencoded' },
    body: body.toString(),
  })
  await answer.text()
  return { status: answer.status, location: answer.headers.get('location') }
}

/** What a hostile form may change: every record, association, import and event, as text. */
const snapshot = () =>
  withOwner(server.databaseUrl, async (client) => {
    const { rows } = await client.query(`select
      (select count(*) from crm.events)::int as events,
      (select string_agg(id || ':' || stage || ':' || updated_at, ',' order by id) from crm.deals) as deals,
      (select string_agg(concat_ws('>', contact_id, company_id, deal_id), ',' order by id) from crm.associations) as links,
      (select string_agg(id || ':' || status || ':' || coalesce(mapping::text, '-') || ':' || dry_run, ',' order by id) from crm.imports) as imports`)
    return rows[0] as Record<string, unknown>
  })

/** The well-formed value most of the time, so that runs often spoil a single field of the form. */
const mostly = <T>(valid: T, ...hostile: T[]) =>
  fc.oneof(
    { weight: 2 * hostile.length, arbitrary: fc.constant(valid) },
    { weight: hostile.length, arbitrary: fc.constantFrom(...hostile) },
  )
/** The CSRF field: the session's own, none, or another session's (a valid token of someone else). */
const csrfChoice = mostly('valid', 'missing', 'foreign')
const csrfField = (choice: string): Fields =>
  choice === 'valid' ? [['csrf', adaBrowser.csrf]] : choice === 'foreign' ? [['csrf', rexBrowser.csrf]] : []
/** Something added to the form: an unknown field, or a field of the form a second time. */
const extraChoice = (repeatable: string[]) =>
  fc.oneof(
    { weight: 8, arbitrary: fc.constant<Fields>([]) },
    fc.constant<Fields>([['is_admin', 'true']]),
    fc.constant<Fields>([['workspace_id', globex.id]]),
    fc.constant<Fields>([[MEGABYTE.slice(0, 1000), 'x']]),
    fc.constantFrom(...repeatable).map((name): Fields => [[name, 'lost']]),
  )
/**
 * The extra fields that stay hostile on this form: a repeat of a field the form left out would
 * only fill it in (`stage=lost` where the stage was missing is a well-formed move), so it is dropped.
 */
const hostileExtra = (form: Fields, extra: Fields, repeatable: string[]): Fields =>
  extra.filter(([name]) => !repeatable.includes(name) || form.some(([present]) => present === name))
const spoiled = (name: string, choice: string): Fields =>
  choice === 'missing' ? [] : [[name, choice === 'nul' ? 'lead\u0000' : choice === 'megabyte' ? MEGABYTE : 'Robert"); drop table x;--']]

async function expectRefusedOrWritten(
  t: { pass: (message: string) => void },
  label: string,
  valid: boolean,
  send: () => Promise<{ status: number; location: string | null }>,
) {
  const before = await snapshot()
  const answer = await send()
  if (answer.status >= 500) throw new Error(`${label}: ${answer.status}`)
  if (valid) {
    if (answer.status !== 303) throw new Error(`${label}: the well-formed form answered ${answer.status}`)
    return
  }
  if (answer.status < 400) throw new Error(`${label}: answered ${answer.status} ${answer.location}`)
  const after = await snapshot()
  if (JSON.stringify(after) !== JSON.stringify(before)) throw new Error(`${label}: ${answer.status} but something was written`)
  t.pass(label)
}

const BOARD_REPEATABLE = ['stage', 'version', 'csrf']
t.test('the deal board move form: only the well-formed move of an editable deal at its version writes', async (t) => {
  const versionOf = async (id: string, token: string) => (await api(token, 'GET', `/api/deals/${id}`)).headers.get('etag') ?? ''
  const stale = await versionOf(deal, ada.token)
  await api(ada.token, 'PATCH', `/api/deals/${deal}`, { name: 'Atlas renewal 2' })
  await fc.assert(
    fc.asyncProperty(
      fc.record({
        target: mostly('own', 'foreign', 'view-only', 'malformed'),
        csrf: csrfChoice,
        version: mostly('current', 'stale', 'missing', 'nul', 'megabyte', 'garbage'),
        stage: mostly('valid', 'missing', 'nul', 'megabyte', 'garbage'),
        extra: extraChoice(BOARD_REPEATABLE),
      }),
      async (choice) => {
        const current = (await api(ada.token, 'GET', `/api/deals/${deal}`)).body.data.stage as string
        const id = choice.target === 'foreign' ? foreignDeal : choice.target === 'malformed' ? `${deal}x` : deal
        const who = choice.target === 'view-only' ? rexBrowser : adaBrowser
        const version = await versionOf(deal, ada.token)
        const form: Fields = [
          ...(choice.target === 'view-only' ? (choice.csrf === 'valid' ? [['csrf', rexBrowser.csrf]] : []) : csrfField(choice.csrf)),
          ...(choice.version === 'current'
            ? [['version', version]]
            : choice.version === 'stale'
              ? [['version', stale]]
              : spoiled('version', choice.version)),
          ...(choice.stage === 'valid' ? [['stage', current === 'won' ? 'lost' : 'won']] : spoiled('stage', choice.stage)),
        ] as Fields
        const extra = hostileExtra(form, choice.extra, BOARD_REPEATABLE)
        const fields: Fields = [...form, ...extra]
        const valid =
          choice.target === 'own' &&
          choice.csrf === 'valid' &&
          choice.version === 'current' &&
          choice.stage === 'valid' &&
          extra.length === 0
        await expectRefusedOrWritten(t, JSON.stringify(choice), valid, () => post(who, `/deals/board/${id}/move`, fields))
      },
    ),
    { numRuns: 80 },
  )
})

t.test('the association form: only a well-formed link or unlink of an editable record writes', async (t) => {
  await fc.assert(
    fc.asyncProperty(
      fc.record({
        target: mostly('own', 'foreign', 'view-only', 'malformed'),
        csrf: csrfChoice,
        type: mostly('companies', 'contacts', 'users', 'missing', 'nul', 'megabyte'),
        change: fc.oneof(fc.constantFrom('add', 'remove'), mostly('add', 'both', 'neither')),
        other: mostly('own', 'foreign', 'nul', 'megabyte', 'garbage'),
        extra: extraChoice(['type', 'add', 'remove']),
      }),
      async (choice) => {
        const id = choice.target === 'foreign' ? foreignContact : choice.target === 'malformed' ? 'contact-1' : contact
        const who = choice.target === 'view-only' ? rexBrowser : adaBrowser
        const other =
          choice.other === 'own'
            ? company
            : choice.other === 'foreign'
              ? foreignCompany
              : choice.other === 'nul'
                ? `${company}\u0000`
                : choice.other === 'megabyte'
                  ? MEGABYTE
                  : 'not-an-id'
        const type = choice.type === 'nul' ? 'companies\u0000' : choice.type === 'megabyte' ? MEGABYTE : choice.type
        const fields: Fields = [
          ...(choice.target === 'view-only' ? (choice.csrf === 'valid' ? [['csrf', rexBrowser.csrf]] : []) : csrfField(choice.csrf)),
          ...(choice.type === 'missing' ? [] : [['type', type]]),
          ...(choice.change === 'add' || choice.change === 'both' ? [['add', other]] : []),
          ...(choice.change === 'remove' || choice.change === 'both' ? [['remove', other]] : []),
          ...choice.extra,
        ] as Fields
        // Unlinking a company that is not linked is refused too (422), so a well-formed remove
        // writes only while the earlier runs have left the two linked.
        const linked = await withOwner(server.databaseUrl, async (client) => {
          const { rows } = await client.query(
            'select exists (select from crm.associations where contact_id = $1 and company_id = $2) as linked',
            [contact, company],
          )
          return rows[0].linked as boolean
        })
        const valid =
          choice.target === 'own' &&
          choice.csrf === 'valid' &&
          choice.type === 'companies' &&
          (choice.change === 'add' || (choice.change === 'remove' && linked)) &&
          choice.other === 'own' &&
          choice.extra.length === 0
        await expectRefusedOrWritten(t, JSON.stringify(choice), valid, () => post(who, `/contacts/${id}/associations`, fields))
      },
    ),
    { numRuns: 80 },
  )
})

const BOUNDARY = 'wizardboundary'
const multipart = (csv: string) =>
  Buffer.from(
    `--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="people.csv"\r\nContent-Type: text/csv\r\n\r\n${csv}\r\n--${BOUNDARY}--\r\n`,
  )

t.test(
  'the wizard upload: only a well-formed file with the CSRF token, of one of the three types, by an importer, is stored',
  async (t) => {
    await fc.assert(
      fc.asyncProperty(
        fc.record({
          who: mostly('importer', 'view-only'),
          csrf: csrfChoice,
          type: mostly('contacts', 'users', 'contacts%00'),
          file: mostly('valid', 'nul', 'megabyte-header', 'empty', 'not-multipart'),
        }),
        async (choice) => {
          const who = choice.who === 'view-only' ? rexBrowser : adaBrowser
          const csrf = choice.who === 'view-only' && choice.csrf === 'valid' ? [['csrf', rexBrowser.csrf]] : csrfField(choice.csrf)
          const csv =
            choice.file === 'nul'
              ? 'First Name,Email\nAda\u0000,ada@example.com\n'
              : choice.file === 'megabyte-header'
                ? `${MEGABYTE},Email\nAda,ada@example.com\n`
                : choice.file === 'empty'
                  ? ''
                  : 'First Name,Email\nAda,ada@example.com\n'
          const valid = choice.who === 'importer' && choice.csrf === 'valid' && choice.type === 'contacts' && choice.file === 'valid'
          const before = await snapshot()
          const answer = await fetch(`${server.url}/${choice.type}/import?${new URLSearchParams(csrf as Fields)}`, {
            method: 'POST',
            redirect: 'manual',
            headers: {
              cookie: who.cookie,
              'content-type': choice.file === 'not-multipart' ? 'application/json' : `multipart/form-data; boundary=${BOUNDARY}`,
            },
            body: choice.file === 'not-multipart' ? '{"file": "x"}' : multipart(csv),
          })
          await answer.text()
          const label = JSON.stringify(choice)
          if (answer.status >= 500) throw new Error(`${label}: ${answer.status}`)
          if (valid) {
            if (answer.status !== 303) throw new Error(`${label}: the well-formed upload answered ${answer.status}`)
            return
          }
          if (answer.status < 400) throw new Error(`${label}: answered ${answer.status}`)
          if (JSON.stringify(await snapshot()) !== JSON.stringify(before)) throw new Error(`${label}: something was written`)
        },
      ),
      { numRuns: 60 },
    )
    t.pass('every upload refused or stored as expected')
  },
)

t.test('the wizard mapping, options and confirm step: a hostile form starts no job and changes no import', async (t) => {
  const upload = async (token: string) =>
    (
      await server.request('POST', '/api/contacts/import/upload', {
        token,
        headers: { 'content-type': 'text/csv' },
        body: 'First Name,Email\nAda,ada@example.com\n',
      })
    ).body.data.id as string
  const own = await upload(ada.token)
  const foreign = await upload(gus.token)
  await fc.assert(
    fc.asyncProperty(
      fc
        .record({
          target: mostly('own', 'foreign', 'view-only', 'malformed', 'other-type'),
          csrf: csrfChoice,
          mapping: mostly('valid', 'unknown-field', 'workspace_id', 'nul', 'megabyte', 'beyond-columns', 'repeated'),
          dryRun: fc.oneof(fc.constantFrom('true', 'false'), mostly('true', 'maybe', 'missing', 'repeated')),
          extra: extraChoice(['map_0', 'dry_run']),
        })
        // The well-formed form starts a job; the wizard's browser test walks that path.
        .filter(
          (choice) =>
            !(
              choice.target === 'own' &&
              choice.csrf === 'valid' &&
              choice.mapping === 'valid' &&
              (choice.dryRun === 'true' || choice.dryRun === 'false') &&
              choice.extra.length === 0
            ),
        ),
      async (choice) => {
        const who = choice.target === 'view-only' ? rexBrowser : adaBrowser
        const path =
          choice.target === 'foreign'
            ? `/contacts/import/${foreign}`
            : choice.target === 'malformed'
              ? `/contacts/import/${own}0`
              : choice.target === 'other-type'
                ? `/deals/import/${own}`
                : `/contacts/import/${own}`
        const mapping: Fields =
          choice.mapping === 'valid'
            ? [
                ['map_0', 'first_name'],
                ['map_1', 'email'],
              ]
            : choice.mapping === 'unknown-field'
              ? [['map_0', 'shoe_size']]
              : choice.mapping === 'workspace_id'
                ? [['map_0', 'workspace_id']]
                : choice.mapping === 'nul'
                  ? [['map_0', 'first_name\u0000']]
                  : choice.mapping === 'megabyte'
                    ? [['map_0', MEGABYTE]]
                    : choice.mapping === 'beyond-columns'
                      ? [
                          ['map_0', 'first_name'],
                          ['map_7', 'email'],
                        ]
                      : [
                          ['map_0', 'first_name'],
                          ['map_0', 'email'],
                        ]
        const fields: Fields = [
          ...(choice.target === 'view-only' ? (choice.csrf === 'valid' ? [['csrf', rexBrowser.csrf]] : []) : csrfField(choice.csrf)),
          ...mapping,
          ...(choice.dryRun === 'missing'
            ? []
            : choice.dryRun === 'repeated'
              ? [
                  ['dry_run', 'true'],
                  ['dry_run', 'false'],
                ]
              : [['dry_run', choice.dryRun]]),
          ...choice.extra,
        ] as Fields
        await expectRefusedOrWritten(t, JSON.stringify(choice), false, () => post(who, path, fields))
      },
    ),
    { numRuns: 80 },
  )
})
