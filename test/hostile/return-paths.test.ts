// Return paths (`next` after sign-in, `return_to` after switching workspace) stay on this origin,
// whatever encoding a hostile link uses to look like a path.
import t from 'tap'
import { safeReturnPath } from '../../src/ui/layout.ts'
import { startTestServer } from '../helpers/server.ts'

const BYPASSES = [
  '/\t/evil.example',
  '/%09/evil.example',
  '/\\evil.example',
  '\\\\evil.example',
  '//evil.example',
  '/%2F/evil.example',
  '/%2f%2fevil.example',
  '/%5Cevil.example',
  '/%0d%0aLocation:https://evil.example',
  '/\r\nLocation:https://evil.example',
  'javascript:alert(1)',
  'https://evil.example',
  '/%E0%A4%A', // percent-encoding that is not UTF-8
]

t.test('bypass forms fall back', async (t) => {
  for (const value of BYPASSES) t.equal(safeReturnPath(value, '/fallback'), '/fallback', JSON.stringify(value))
})

t.test('a path on this origin survives with its query string and fragment', async (t) => {
  t.equal(safeReturnPath('/webhooks?status=paused&page=2#list'), '/webhooks?status=paused&page=2#list')
  t.equal(safeReturnPath('/members'), '/members')
  t.equal(safeReturnPath('/security?name=a%20b'), '/security?name=a%20b')
})

t.test('the sign-in page sends a signed-in browser only to a path of its own', async (t) => {
  const server = await startTestServer(t)
  // A cookie of the right shape is enough for the sign-in page to send the browser on.
  const cookie = `crm_session=crm_${'a'.repeat(43)}`
  for (const value of BYPASSES) {
    const response = await fetch(`${server.url}/sign-in?next=${encodeURIComponent(value)}`, { redirect: 'manual', headers: { cookie } })
    t.equal(response.headers.get('location'), '/', JSON.stringify(value))
  }
  const good = await fetch(`${server.url}/sign-in?next=${encodeURIComponent('/webhooks?status=paused')}`, {
    redirect: 'manual',
    headers: { cookie },
  })
  t.equal(good.headers.get('location'), '/webhooks?status=paused')
})
