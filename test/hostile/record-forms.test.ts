// The records pages' forms under hostile input (docs/api.md section 12): a megabyte field, NUL
// bytes and 20 concurrent saves of one record answer 4xx pages or the one saved version, never a
// 500, and nothing half-written reaches the table or the outbox.
import t from 'tap'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const server = await startTestServer(t)
const acme = await createTenant(server.databaseUrl, { slug: 'acme', members: { 'ada@acme.test': 'admin' } })
const ada = acme.members['ada@acme.test']
const session = await withOwner(server.databaseUrl, (client) => mintToken(client, ada.id, { kind: 'session' }))
const cookie = `crm_session=${session}`
const csrfOf = (text: string) => /name="csrf" value="([^"]+)"/.exec(text)?.[1] ?? ''
const csrf = csrfOf(await (await fetch(`${server.url}/contacts/new`, { headers: { cookie } })).text())
const post = (path: string, fields: Record<string, string>) =>
  fetch(server.url + path, {
    method: 'POST',
    redirect: 'manual',
    headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ csrf, ...fields }).toString(),
  })
const counts = () =>
  withOwner(server.databaseUrl, async (client) => {
    const { rows } = await client.query(
      `select (select count(*) from crm.contacts)::int as contacts, (select count(*) from crm.events)::int as events`,
    )
    return rows[0] as { contacts: number; events: number }
  })

t.test('a megabyte field and NUL bytes in the new-contact form: a 4xx page, nothing written', async (t) => {
  const before = await counts()
  for (const [label, fields] of [
    ['1 MiB first name', { first_name: 'x'.repeat(1 << 20) }],
    ['NUL in the first name', { first_name: 'Ada\u0000Lovelace' }],
    ['NUL in a custom field key', { first_name: 'Ada', 'custom_fields.ti\u0000er': 'gold' }],
    ['a malformed email', { first_name: 'Ada', email: '\u0000@\u0000' }],
  ] as const) {
    const answer = await post('/contacts/new', fields)
    t.ok(answer.status >= 400 && answer.status < 500, `${label}: ${answer.status}`)
    await answer.text()
  }
  t.same(await counts(), before, 'no contact and no event')
})

t.test('20 concurrent saves of one contact with the same version: one wins, the others see the conflict', async (t) => {
  const created = await server.request('POST', '/api/contacts', { token: ada.token, body: { first_name: 'Race' } })
  const id = created.body.data.id as string
  const edit = await (await fetch(`${server.url}/contacts/${id}/edit`, { headers: { cookie } })).text()
  const version = /name="version" value="([^"]+)"/.exec(edit)?.[1]?.replaceAll('&quot;', '"')
  t.ok(version, 'the edit form carries the version')
  const before = await counts()
  const answers = await Promise.all(
    Array.from({ length: 20 }, (_, index) =>
      post(`/contacts/${id}/edit`, { version: version ?? '', first_name: `Race ${index}` }).then(async (answer) => {
        await answer.text()
        return answer.status
      }),
    ),
  )
  t.equal(answers.filter((status) => status === 303 || status === 302).length, 1, `one save redirects: ${answers.join(' ')}`)
  t.ok(
    answers.every((status) => status < 500),
    'no 500',
  )
  t.same(await counts(), { contacts: before.contacts, events: before.events + 1 }, 'one update and its one event')
})
