// Turning two-factor on and creating a token that lasts more than a day need a sign-in within the
// last 10 minutes: a stolen session cookie or token cannot lock its owner out with its own TOTP
// secret, nor mint a 365-day token, nor refresh its proof by minting a short token first. Over
// HTTP (the API and the pages) and in SQL as the runtime role, since the database decides.
import pg from 'pg'
import t from 'tap'
import { hashToken } from '../../src/auth/tokens.ts'
import { ensureRuntimeRole } from '../../src/db/runtime-role.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant, mintToken, TEST_PASSWORD } from '../helpers/fixtures.ts'
import { startTestServer, TEST_APP_SECRET } from '../helpers/server.ts'
import { setPassword } from '../ui/browser.ts'

const server = await startTestServer(t)
const owner = await ownerClient(t, server.databaseUrl)
const tenant = await createTenant(server.databaseUrl, { slug: 'recent', members: { 'ada@recent.test': 'admin' } })
const ada = tenant.members['ada@recent.test']
await setPassword(server.databaseUrl, 'ada@recent.test', TEST_PASSWORD)

/** A token or session of Ada's whose sign-in was `minutesAgo` minutes ago. */
async function credential(kind: 'token' | 'session', minutesAgo: number): Promise<string> {
  const token = await mintToken(owner, ada.id, { kind })
  await owner.query(`update crm.tokens set authenticated_at = now() - make_interval(mins => $2) where token_hash = $1`, [
    hashToken(token),
    minutesAgo,
  ])
  return token
}

const createToken = (token: string, days: number) =>
  server.request('POST', '/api/tokens', { token, body: { name: `for ${days} days`, expires_in_days: days } })

t.test('POST /api/tokens past a day needs a recent sign-in, and a short token does not renew it', async (t) => {
  const stolen = await credential('token', 11)
  const long = await createToken(stolen, 365)
  t.equal(long.status, 403)
  t.equal(long.body.code, 'reauthentication_required')
  t.equal(long.headers.get('content-type'), 'application/problem+json')
  t.equal((await createToken(stolen, 2)).status, 403, 'two days are past the bound too')
  const short = await createToken(stolen, 1)
  t.equal(short.status, 201, 'a token of a day is made')
  t.equal((await createToken(short.body.token, 365)).status, 403, 'and inherits the old sign-in: no long token through it')

  const recent = await credential('token', 9)
  t.equal((await createToken(recent, 365)).status, 201, 'a sign-in 9 minutes ago is recent')

  // The API's own way to a recent sign-in: the password again.
  const signedIn = await server.request('POST', '/api/token', {
    body: { email: 'ada@recent.test', password: TEST_PASSWORD, device_name: 'laptop' },
  })
  t.equal(signedIn.status, 200)
  t.equal((await createToken(signedIn.body.token, 365)).status, 201, 'after signing in again')
})

t.test('the pages: two-factor and long tokens ask for a fresh sign-in, which the sign-in page gives', async (t) => {
  const session = await credential('session', 30)
  const cookie = `crm_session=${session}`
  const page = await fetch(`${server.url}/security`, { headers: { cookie } })
  const csrf = /name="csrf" value="([^"]+)"/.exec(await page.text())?.[1] ?? ''
  const post = (path: string, form: Record<string, string>) =>
    fetch(server.url + path, {
      method: 'POST',
      redirect: 'manual',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ csrf, ...form }).toString(),
    })
  const twoFactor = await post('/security/two-factor/start', {})
  t.equal(twoFactor.status, 403)
  t.match(
    await twoFactor.text(),
    /To turn on two-factor sign-in, confirm it is you: <a href="\/sign-in\?reauthenticate=1&amp;next=%2Fsecurity">sign in again<\/a>/,
  )
  t.equal((await owner.query('select count(*)::int as n from crm.user_totp where user_id = $1', [ada.id])).rows[0].n, 0, 'no secret stored')
  const token = await post('/security/tokens', { name: 'Backup', expires_in_days: '365' })
  t.equal(token.status, 403)
  t.match(await token.text(), /To create a token that lasts more than a day, confirm it is you/)
  const signInAgain = await fetch(`${server.url}/sign-in?reauthenticate=1&next=%2Fsecurity`, { headers: { cookie }, redirect: 'manual' })
  t.equal(signInAgain.status, 200, 'the sign-in page shows its form to a signed-in browser that must confirm')
  t.match(await signInAgain.text(), /Confirm it is you/)
})

t.test('in SQL, as the runtime role with an old session: no long token, no two-factor', async (t) => {
  const runtime = new pg.Client({ connectionString: await ensureRuntimeRole(server.databaseUrl, TEST_APP_SECRET) })
  await runtime.connect()
  t.teardown(() => runtime.end())
  const as = async (token: string, text: string, values: unknown[] = []) => {
    await runtime.query('begin')
    try {
      const { rows } = await runtime.query(
        `select a.failure, set_config('role', 'crm_api', true) from crm.authenticate($1, 'recent', 'ui', 600) a`,
        [hashToken(token)],
      )
      if (rows[0].failure !== null) throw new Error(`authentication failed: ${rows[0].failure}`)
      return await runtime.query(text, values).then(
        (result) => ({ rows: result.rows, code: null as string | null, hint: null as string | null }),
        (error: pg.DatabaseError) => ({ rows: [], code: error.code ?? null, hint: error.hint ?? null }),
      )
    } finally {
      await runtime.query('rollback')
    }
  }
  const insert = `insert into crm.tokens (user_id, kind, name, token_hash, expires_at)
    values ($1, 'token', 'by hand', $2, now() + $3::interval) returning authenticated_at < now() - interval '20 minutes' as inherited`
  const old = await credential('session', 30)
  t.same(await as(old, insert, [ada.id, hashToken('x1'), '30 days']), { rows: [], code: 'CR403', hint: 'reauthentication_required' })
  t.same(await as(old, insert, [ada.id, hashToken('x2'), '1 day']), { rows: [{ inherited: true }], code: null, hint: null })
  const enable = `select crm.start_totp_enrollment('\\x00'::bytea), crm.confirm_totp_enrollment(array[]::bytea[], 1)`
  t.same(await as(old, enable), { rows: [], code: 'CR403', hint: 'reauthentication_required' }, 'two-factor stays off')
  const fresh = await credential('session', 1)
  t.equal((await as(fresh, enable)).code, null, 'a recent sign-in turns it on')
  t.equal((await as(fresh, insert, [ada.id, hashToken('x3'), '365 days'])).code, null, 'and makes a long token')
})
