// POST /api/token and /api/token/2fa-challenge, with users made by the operator CLI.
import { execFileSync, spawnSync } from 'node:child_process'
import t from 'tap'
import { crm } from '../helpers/cli.ts'
import { withOwner } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

const PASSWORD = 'correct horse battery'
const server = await startTestServer(t)
const url = server.databaseUrl
t.equal(crm(url, ['workspace', 'create', '--slug', 'acme', '--name', 'Acme', '--json']).status, 0)
const ada = crm(url, [
  'user',
  'create',
  '--email',
  'Ada@Example.com',
  '--name',
  'Ada',
  '--password',
  PASSWORD,
  '--workspace',
  'acme',
  '--role',
  'admin',
  '--json',
])
t.equal(ada.status, 0, ada.stderr)
t.equal(ada.json.email, 'ada@example.com', 'email stored lower-case')
// Grace signs in with two-factor. She is made before the first request: the CLI blocks this process
// (spawnSync), and a keep-alive connection left idle across a block longer than the server's
// keep-alive timeout is reset by the server as the next request reuses it.
crm(url, ['user', 'create', '--email', 'grace@example.com', '--name', 'Grace', '--password', PASSWORD, '--workspace', 'acme', '--json'])
const graceTotp = crm(url, ['user', 'totp', 'enable', '--email', 'grace@example.com', '--json'])

const signIn = (email: string, password: string, extra: Record<string, unknown> = {}) =>
  server.request('POST', '/api/token', { body: { email, password, device_name: 'tests', ...extra } })

t.test('a right password gives a bearer token that works', async (t) => {
  const response = await signIn('ADA@example.com', PASSWORD)
  t.equal(response.status, 200)
  t.match(response.body, {
    token: /^crm_[A-Za-z0-9_-]{43}$/,
    token_type: 'Bearer',
    token_id: /^[0-9a-f-]{36}$/,
    expires_at: /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/,
  })
  const lifetimeDays = (Date.parse(response.body.expires_at) - Date.now()) / 86_400_000
  t.ok(lifetimeDays > 13.9 && lifetimeDays <= 14, 'default lifetime 14 days')
  const me = await server.request('GET', '/api/me', { token: response.body.token })
  t.equal(me.status, 200)
  t.equal(me.body.data.user.email, 'ada@example.com')
  await withOwner(url, async (client) => {
    const { rows } = await client.query('select token_hash from crm.tokens where id = $1', [response.body.token_id])
    t.not(rows[0].token_hash.toString(), response.body.token, 'only a hash is stored')
    t.equal(rows[0].token_hash.length, 32)
  })
})

t.test('unknown email and wrong password get the same answer', async (t) => {
  const wrong = await signIn('ada@example.com', 'not the password at all')
  const unknown = await signIn('nobody@example.com', 'not the password at all')
  for (const response of [wrong, unknown]) {
    t.equal(response.status, 401)
    t.equal(response.headers.get('content-type'), 'application/problem+json')
    t.equal(response.body.code, 'invalid_credentials')
  }
  const { request_id: _a, ...wrongBody } = wrong.body
  const { request_id: _b, ...unknownBody } = unknown.body
  t.same(wrongBody, unknownBody)
})

t.test('five failures for one email in 15 minutes give 429 until the window ends', async (t) => {
  const email = 'victim@example.com'
  for (let i = 0; i < 5; i++) t.equal((await signIn(email, 'wrong password!')).status, 401)
  const blocked = await signIn(email, 'wrong password!')
  t.equal(blocked.status, 429)
  t.equal(blocked.body.code, 'too_many_attempts')
  const retryAfter = Number(blocked.headers.get('retry-after'))
  t.ok(retryAfter > 800 && retryAfter <= 900, `Retry-After ${retryAfter} s`)
  await withOwner(url, (client) =>
    client.query(
      "update crm.attempt_counters set window_ends_at = now() - interval '1 second' where purpose = 'sign_in' and subject = $1",
      [email],
    ),
  )
  t.equal((await signIn(email, 'wrong password!')).status, 401, 'allowed again once the window has passed')
})

t.test('bad bodies are 4xx problems', async (t) => {
  t.equal(
    (await server.request('POST', '/api/token', { raw: '{"email":', headers: { 'content-type': 'application/json' } })).body.code,
    'invalid_json',
  )
  const missing = await server.request('POST', '/api/token', { body: { email: 'ada@example.com' } })
  t.equal(missing.status, 422)
  t.match(missing.body.errors, [
    { pointer: '/password', code: 'required' },
    { pointer: '/device_name', code: 'required' },
  ])
  const extra = await signIn('ada@example.com', PASSWORD, { remember: true })
  t.equal(extra.status, 422)
  t.match(extra.body.errors, [{ pointer: '/remember', code: 'unknown_field' }])
  t.equal(
    (await server.request('POST', '/api/token', { raw: 'email=a', headers: { 'content-type': 'application/x-www-form-urlencoded' } }))
      .status,
    415,
  )
})

const oathtool = spawnSync('oathtool', ['--version']).status === 0
t.test(
  'two-factor sign-in with codes from an independent generator (oathtool)',
  { skip: oathtool ? false : 'oathtool is not installed' },
  async (t) => {
    const enabled = graceTotp
    t.equal(enabled.status, 0, enabled.stderr)
    t.match(enabled.json, { otpauth_uri: /^otpauth:\/\/totp\/CRM:grace%40example\.com\?secret=/, secret: /^[A-Z2-7]+$/ })
    t.equal(enabled.json.recovery_codes.length, 10)
    const code = (offset = 'now') => execFileSync('oathtool', ['--totp', '-b', '-N', offset, enabled.json.secret]).toString().trim()

    const first = await signIn('grace@example.com', PASSWORD)
    t.equal(first.status, 200)
    t.match(first.body, { two_factor: true, challenge_token: /\./, expires_at: /Z$/ })
    t.notOk(first.body.token, 'no token before the second step')
    const challenge = first.body.challenge_token

    const wrong = await server.request('POST', '/api/token/2fa-challenge', {
      body: { challenge_token: challenge, code: code('now - 5 minutes') },
    })
    t.equal(wrong.status, 401)
    t.equal(wrong.body.code, 'invalid_2fa_code')
    // One code, taken at a fixed instant, so the replay below is the very same code.
    const usedCode = code(`@${Math.floor(Date.now() / 1000) - 30}`)
    const right = await server.request('POST', '/api/token/2fa-challenge', { body: { challenge_token: challenge, code: usedCode } })
    t.equal(right.status, 200, 'one step back is accepted')
    t.match(right.body, { token: /^crm_/, token_type: 'Bearer' })
    const reused = await server.request('POST', '/api/token/2fa-challenge', { body: { challenge_token: challenge, code: code() } })
    t.equal(reused.body.code, 'challenge_expired', 'a challenge completes once')

    // The same code (or an older step's) does not sign in twice, even in a new challenge.
    const replayChallenge = (await signIn('grace@example.com', PASSWORD)).body.challenge_token
    const replayed = await server.request('POST', '/api/token/2fa-challenge', {
      body: { challenge_token: replayChallenge, code: usedCode },
    })
    t.equal(replayed.status, 401, 'a code already used is refused')
    t.equal(replayed.body.code, 'invalid_2fa_code')
    const older = await server.request('POST', '/api/token/2fa-challenge', {
      body: { challenge_token: replayChallenge, code: code('now - 60 seconds') },
    })
    t.equal(older.status, 401, 'an older step is refused too')
    const newer = await server.request('POST', '/api/token/2fa-challenge', { body: { challenge_token: replayChallenge, code: code() } })
    t.equal(newer.status, 200, 'a later step signs in')
    await withOwner(url, async (client) => {
      const {
        rows: [grace],
      } = await client.query("select id from crm.users where email = 'grace@example.com'")
      const backwards = await client
        .query('update crm.user_totp set last_used_step = last_used_step - 1 where user_id = $1', [grace.id])
        .catch((error: { message: string }) => error)
      t.match(backwards, { message: /a TOTP step is used once/ }, 'the database refuses moving the step back, even for the owner')
    })

    const second = (await signIn('grace@example.com', PASSWORD)).body.challenge_token
    const recovery = enabled.json.recovery_codes[0]
    t.equal(
      (await server.request('POST', '/api/token/2fa-challenge', { body: { challenge_token: second, recovery_code: recovery } })).status,
      200,
    )
    const third = (await signIn('grace@example.com', PASSWORD)).body.challenge_token
    const again = await server.request('POST', '/api/token/2fa-challenge', { body: { challenge_token: third, recovery_code: recovery } })
    t.equal(again.body.code, 'invalid_2fa_code', 'a recovery code works once')

    for (let i = 0; i < 4; i++)
      await server.request('POST', '/api/token/2fa-challenge', { body: { challenge_token: third, code: '000000' } })
    const sixth = await server.request('POST', '/api/token/2fa-challenge', { body: { challenge_token: third, code: code() } })
    t.equal(sixth.status, 429, 'five tries per challenge, then even a right code is refused')
    t.equal(sixth.body.code, 'too_many_attempts')

    const fourth = (await signIn('grace@example.com', PASSWORD)).body.challenge_token
    await withOwner(url, (client) =>
      client.query("update crm.two_factor_challenges set expires_at = now() - interval '1 second' where completed_at is null"),
    )
    t.equal(
      (await server.request('POST', '/api/token/2fa-challenge', { body: { challenge_token: fourth, code: code() } })).body.code,
      'challenge_expired',
    )
    t.equal(
      (await server.request('POST', '/api/token/2fa-challenge', { body: { challenge_token: 'forged.token.value', code: code() } })).body
        .code,
      'challenge_expired',
    )
  },
)
