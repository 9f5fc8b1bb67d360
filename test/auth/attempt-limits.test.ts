// Attempt limits claimed before the check: concurrent wrong passwords for one email (known or not)
// get only the allowance checked, and wrong two-factor codes count per user across challenges and
// the UI's two-factor-off form.
import { generateSync } from 'otplib'
import t from 'tap'
import { crm } from '../helpers/cli.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant, mintToken, withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'
import { setPassword } from '../ui/browser.ts'

const PASSWORD = 'correct horse battery'
const server = await startTestServer(t)
const url = server.databaseUrl
const acme = await createTenant(url, {
  slug: 'acme',
  members: { 'ada@acme.test': 'admin', 'grace@acme.test': 'member', 'linus@acme.test': 'member', 'alan@acme.test': 'member' },
})
for (const email of Object.keys(acme.members)) await setPassword(url, email, PASSWORD)

const signIn = (email: string, password: string) =>
  server.request('POST', '/api/token', { body: { email, password, device_name: 'tests' } })
const submitCode = (challenge_token: string, code: string) =>
  server.request('POST', '/api/token/2fa-challenge', { body: { challenge_token, code } })
function statuses(responses: { status: number }[]): Record<number, number> {
  const counts: Record<number, number> = {}
  for (const response of responses) counts[response.status] = (counts[response.status] ?? 0) + 1
  return counts
}
const withoutRequestId = ({ request_id: _, ...body }: Record<string, unknown>) => body

/** Ends the current window of a counter, as 15 minutes passing would. */
const endWindow = (purpose: string, subject: string) =>
  withOwner(url, (client) =>
    client.query("update crm.attempt_counters set window_ends_at = now() - interval '1 second' where purpose = $1 and subject = $2", [
      purpose,
      subject,
    ]),
  )
const attemptsOf = (purpose: string, subject: string) =>
  withOwner(url, async (client) => {
    const { rows } = await client.query('select attempts from crm.attempt_counters where purpose = $1 and subject = $2', [purpose, subject])
    return rows[0]?.attempts as number | undefined
  })

/** Whether the answer's Retry-After points into the 15-minute window. */
const retryAfterInWindow = (response: { headers: Headers }) => {
  const seconds = Number(response.headers.get('retry-after'))
  return seconds > 0 && seconds <= 900
}

t.test('20 concurrent wrong passwords for one email: 5 are checked, 15 refused at once; then the right one waits', async (t) => {
  const email = 'grace@acme.test'
  const responses = await Promise.all(Array.from({ length: 20 }, () => signIn(email, 'not the password!')))
  t.same(statuses(responses), { 401: 5, 429: 15 }, 'exactly the allowance of 5 reaches the password check')
  for (const refused of responses.filter((r) => r.status === 429)) t.equal(refused.body.code, 'too_many_attempts')
  t.ok(retryAfterInWindow(responses.find((r) => r.status === 429)!), 'Retry-After within the window')

  const right = await signIn(email, PASSWORD)
  t.equal(right.status, 429, 'the right password is not checked either while the window lasts')
  t.equal(right.body.code, 'too_many_attempts')
  t.ok(retryAfterInWindow(right), 'Retry-After within the window')

  await endWindow('sign_in', email)
  const after = await signIn(email, PASSWORD)
  t.equal(after.status, 200, 'the right password signs in once the window has ended')
  t.match(after.body, { token: /^crm_/ })
  t.equal(await attemptsOf('sign_in', email), 0, 'a right password gives its attempt back: it is no failure')
})

t.test('an unknown email answers like a wrong password, and its attempts are claimed the same way', async (t) => {
  const wrong = await signIn('linus@acme.test', 'not the password!')
  const email = 'nobody@acme.test'
  const responses = await Promise.all(Array.from({ length: 10 }, () => signIn(email, 'not the password!')))
  t.same(statuses(responses), { 401: 5, 429: 5 })
  for (const refused of responses.filter((r) => r.status === 401)) {
    t.same(withoutRequestId(refused.body), withoutRequestId(wrong.body), 'the same body as a wrong password')
    t.equal(refused.headers.get('content-type'), wrong.headers.get('content-type'))
  }
  t.equal(await attemptsOf('sign_in', email), 5)
})

const enableTwoFactor = (email: string): string => {
  const enabled = crm(url, ['user', 'totp', 'enable', '--email', email, '--json'])
  t.equal(enabled.status, 0, enabled.stderr)
  return enabled.json.secret
}
const codeFor = (secret: string, offsetSeconds = 0) => generateSync({ secret, epoch: Math.floor(Date.now() / 1000) + offsetSeconds })
/** A code of ten minutes ago: well formed, and wrong. */
const wrongCodeFor = (secret: string) => codeFor(secret, -600)
const challengeFor = async (email: string): Promise<string> => {
  const response = await signIn(email, PASSWORD)
  if (response.body?.challenge_token === undefined) throw new Error(`no challenge for ${email}: ${response.text}`)
  return response.body.challenge_token
}

/** The UI's security page for a session of the user: its form token, and the two-factor-off form. */
async function securityPage(userId: string) {
  const session = await withOwner(url, (client) => mintToken(client, userId, { kind: 'session' }))
  const cookie = `crm_session=${session}`
  const page = await fetch(`${server.url}/security`, { headers: { cookie } })
  const csrf = /name="csrf" value="([^"]+)"/.exec(await page.text())?.[1] ?? ''
  return {
    turnOff: async (code: string) => {
      const response = await fetch(`${server.url}/security/two-factor/disable`, {
        method: 'POST',
        redirect: 'manual',
        headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ csrf, code }).toString(),
      })
      return { status: response.status, headers: response.headers, text: await response.text() }
    },
  }
}
/** The UI's sign-in for the user up to its two-factor step, which it returns. */
async function uiTwoFactorStep(email: string) {
  const jar = new Map<string, string>()
  const keep = (response: Response) => {
    for (const header of response.headers.getSetCookie()) {
      const [name, value] = header.split(';')[0].split('=')
      if (value) jar.set(name, value)
      else jar.delete(name)
    }
  }
  const post = async (path: string, fields: Record<string, string>) => {
    const response = await fetch(`${server.url}${path}`, {
      method: 'POST',
      redirect: 'manual',
      headers: {
        cookie: [...jar].map(([name, value]) => `${name}=${value}`).join('; '),
        'content-type': 'application/x-www-form-urlencoded',
      },
      body: new URLSearchParams(fields).toString(),
    })
    keep(response)
    return { status: response.status, headers: response.headers, text: await response.text() }
  }
  const form = await fetch(`${server.url}/sign-in`)
  keep(form)
  const csrf = /name="csrf" value="([^"]+)"/.exec(await form.text())?.[1] ?? ''
  const password = await post('/sign-in', { csrf, email, password: PASSWORD })
  if (password.headers.get('location') !== '/sign-in/two-factor') throw new Error(`no two-factor step for ${email}: ${password.status}`)
  return (code: string) => post('/sign-in/two-factor', { csrf, code })
}
const twoFactorOn = (userId: string) =>
  withOwner(
    url,
    async (client) => (await client.query('select confirmed_at from crm.user_totp where user_id = $1', [userId])).rowCount === 1,
  )

t.test('10 wrong codes across challenges: every further code is refused, even a right one, in the API and the UI', async (t) => {
  const ada = acme.members['ada@acme.test']
  const secret = enableTwoFactor(ada.email)
  for (const tries of [4, 4, 2]) {
    const challenge = await challengeFor(ada.email)
    for (let i = 0; i < tries; i++) t.equal((await submitCode(challenge, wrongCodeFor(secret))).body.code, 'invalid_2fa_code')
  }
  const challenge = await challengeFor(ada.email)
  const right = await submitCode(challenge, codeFor(secret))
  t.equal(right.status, 429, 'the 11th code is refused although it is right')
  t.equal(right.body.code, 'too_many_attempts')
  t.ok(retryAfterInWindow(right), 'Retry-After within the window')

  const ui = await securityPage(ada.id)
  const turnOff = await ui.turnOff(codeFor(secret))
  t.equal(turnOff.status, 429, 'turning two-factor off in the UI is refused by the same count')
  t.ok(retryAfterInWindow(turnOff), 'Retry-After within the window')
  t.match(turnOff.text, /Too many wrong codes\. Try again in \d+ minutes?\. Two-factor sign-in is still on\./)
  t.ok(await twoFactorOn(ada.id), 'two-factor stays on')

  const uiSignIn = await (await uiTwoFactorStep(ada.email))(codeFor(secret))
  t.equal(uiSignIn.status, 429, "the UI sign-in's two-factor step is refused by the same count")
  t.ok(retryAfterInWindow(uiSignIn), 'Retry-After within the window')
  t.match(uiSignIn.text, /Too many wrong codes for this account\. Try again in \d+ minutes?\./)
  t.notOk(
    uiSignIn.headers.getSetCookie().some((cookie) => cookie.startsWith('crm_session=crm_')),
    'no session',
  )

  await endWindow('two_factor', ada.id)
  const after = await submitCode(await challengeFor(ada.email), codeFor(secret))
  t.equal(after.status, 200, 'a right code signs in once the window has ended')
  t.equal(await attemptsOf('two_factor', ada.id), 0, 'a right code gives its attempt back')
})

t.test('wrong codes on the UI two-factor-off form, even concurrent, count for sign-in too', async (t) => {
  const alan = acme.members['alan@acme.test']
  const secret = enableTwoFactor(alan.email)
  const ui = await securityPage(alan.id)
  const responses = await Promise.all(Array.from({ length: 15 }, () => ui.turnOff(wrongCodeFor(secret))))
  t.same(statuses(responses), { 422: 10, 429: 5 }, 'exactly the allowance of 10 is checked')
  t.equal((await ui.turnOff(codeFor(secret))).status, 429, 'a right code is refused too')
  t.ok(await twoFactorOn(alan.id))

  const signInCode = await submitCode(await challengeFor(alan.email), codeFor(secret))
  t.equal(signInCode.status, 429, 'the API sign-in shares the count')
  t.equal(signInCode.body.code, 'too_many_attempts')

  await endWindow('two_factor', alan.id)
  const off = await ui.turnOff(codeFor(secret))
  t.equal(off.status, 303, 'a right code turns two-factor off once the window has ended')
  t.equal(off.headers.get('location'), '/security?done=two-factor-off')
  t.notOk(await twoFactorOn(alan.id))
  t.equal(await attemptsOf('two_factor', alan.id), undefined, 'turning two-factor off ends its count')
})

t.test('housekeeping removes the counters whose window has ended', async (t) => {
  const email = 'gone@acme.test'
  t.equal((await signIn(email, 'not the password!')).status, 401)
  await endWindow('sign_in', email)
  const { rows } = await withOwner(url, (client) =>
    client.query("select removed from crm.housekeeping(30) where step = 'crm.prune_attempt_counters'"),
  )
  t.ok(Number(rows[0].removed) >= 1, 'crm.prune_attempt_counters is a housekeeping step')
  t.equal(await attemptsOf('sign_in', email), undefined)
})

t.test('a refusal inside a window that a later-starting transaction opened waits no longer than the window', async (t) => {
  // The earlier transaction's now() is before the window's start; counted from it, the seconds
  // left came to 901 (the flake of the concurrent sign-ins above).
  const subject = 'late-window@acme.test'
  const earlier = await ownerClient(t, url)
  const later = await ownerClient(t, url)
  await earlier.query('begin')
  await earlier.query('select now()')
  await later.query(`select crm.claim_attempt('sign_in', $1) from generate_series(1, 5)`, [subject])
  const { rows } = await earlier.query(`select allowed, retry_after_seconds from crm.claim_attempt('sign_in', $1)`, [subject])
  await earlier.query('rollback')
  t.equal(rows[0].allowed, false, 'the sixth attempt is refused')
  t.ok(
    rows[0].retry_after_seconds >= 1 && rows[0].retry_after_seconds <= 900,
    `Retry-After ${rows[0].retry_after_seconds} s within the window`,
  )
})
