// The import wizard's past imports, a page at a time (docs/api.md section 12): the newest twenty,
// then an "Older imports" link through the API's cursor, each import listed once across the pages,
// and a cursor edited by hand answered 400 with the newest imports, never a 500.
import t from 'tap'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { upload } from '../imports/helpers.ts'

const server = await startTestServer(t)
const acme = await createTenant(server.databaseUrl, { slug: 'acme', members: { 'ada@acme.test': 'admin' } })
const ada = acme.members['ada@acme.test']
const UPLOADS = 23
const uploadStatuses: number[] = []
for (let index = 0; index < UPLOADS; index++) {
  uploadStatuses.push(
    (await upload(server, ada.token, 'contacts', `first_name,email\nAda,ada${index}@acme.test\n`, `file-${index}.csv`)).status,
  )
}
const session = await withOwner(server.databaseUrl, (client) => mintToken(client, ada.id, { kind: 'session' }))
const page = async (path: string) => {
  const answer = await fetch(server.url + path, { headers: { cookie: `crm_session=${session}` } })
  return { status: answer.status, text: await answer.text() }
}
const filesOf = (text: string) => [...text.matchAll(/>(file-\d+\.csv)</g)].map((match) => match[1])
const olderLink = (text: string) => /href="(\/contacts\/import\?cursor=[^"]+)">Older imports</.exec(text)?.[1]?.replaceAll('&amp;', '&')

t.test('the past imports come a page at a time, each once, newest first', async (t) => {
  t.same(uploadStatuses, Array(UPLOADS).fill(201), 'every upload is received')
  const first = await page('/contacts/import')
  t.equal(first.status, 200)
  t.same(
    filesOf(first.text),
    Array.from({ length: 20 }, (_, index) => `file-${UPLOADS - 1 - index}.csv`),
    'the newest twenty',
  )
  t.notMatch(first.text, 'Newest imports', 'the first page links to no newer one')
  const link = olderLink(first.text)
  t.ok(link, 'the first page links to the older imports')
  const second = await page(link ?? '')
  t.equal(second.status, 200)
  t.same(filesOf(second.text), ['file-2.csv', 'file-1.csv', 'file-0.csv'], 'the rest, oldest last')
  t.match(second.text, 'href="/contacts/import">Newest imports<', 'a link back to the newest')
  t.notOk(olderLink(second.text), 'the last page links to no older one')
})

t.test('a cursor edited by hand is said on the page, with the newest imports', async (t) => {
  for (const cursor of ['not-a-cursor', '%00', 'x'.repeat(5000)]) {
    const answer = await page(`/contacts/import?cursor=${encodeURIComponent(cursor)}`)
    t.equal(answer.status, 400, `cursor ${cursor.slice(0, 12)} is refused`)
    t.match(answer.text, 'role="alert"', 'the refusal is said')
    t.equal(filesOf(answer.text).length, 20, 'the newest imports are shown in its place')
  }
})
