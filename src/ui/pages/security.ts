// Security: the user's API tokens and browser sessions (revoke one, revoke all), new API tokens
// shown once, and two-factor enrollment with a QR code, a confirming code and recovery codes.

import Type, { type Static } from 'typebox'
import { PERSONAL_TOKEN_SCOPES, SCOPE_DESCRIPTIONS } from '../../auth/scopes.ts'
import { open } from '../../auth/secret-box.ts'
import { hashRecoveryCode, newRecoveryCodes, newTotpSecret, otpauthUri, sealTotpSecret, totpKey, totpStep } from '../../auth/two-factor.ts'
import { sql } from '../../db/pool.ts'
import { Bytes, rowType } from '../../db/typed-rows.ts'
import { ApiError } from '../../http/problem.ts'
import { scopeWords } from '../../oauth/scopes.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import { html, type SafeHtml, trusted } from '../html.ts'
import { errorNotice, hiddenCsrf, shownOnce, when } from '../layout.ts'
import type { PageContext, PageHandler, PageResult } from '../page-context.ts'
import { qrSvg } from '../qr-code.ts'
import { clearCookie, SESSION_COOKIE, setFlash, takeFlash } from '../session.ts'

const EXPIRY_CHOICES = [
  { days: 7, label: '7 days' },
  { days: 14, label: '14 days' },
  { days: 30, label: '30 days' },
  { days: 90, label: '90 days' },
  { days: 365, label: '1 year' },
]
/** A token's documented default lifetime (docs/api.md section 3), the same in the UI as in the API. */
const DEFAULT_EXPIRY_DAYS = 14

type TokenRow = {
  id: string
  kind: 'token' | 'session' | 'oauth'
  name: string
  app: { id: string; name: string } | null
  scopes: string[] | null
  created_at: string
  last_used_at: string | null
  expires_at: string
  current: boolean
}
const TotpSchema = Type.Object({ secret_encrypted: Bytes, confirmed: Type.Boolean(), recovery_codes_left: Type.Integer() })
type Totp = Static<typeof TotpSchema>
const TotpRow = rowType(TotpSchema)
const ClaimRow = rowType(Type.Object({ allowed: Type.Boolean(), retry_after_seconds: Type.Integer() }))
const DisabledRow = rowType(Type.Object({ disabled: Type.Boolean() }))
const RecentRow = rowType(Type.Object({ recent: Type.Boolean() }))

/** Where a session too old for what it asked signs in again, and comes back here. */
const SIGN_IN_AGAIN = '/sign-in?reauthenticate=1&next=%2Fsecurity'

/** Whether this session comes from a sign-in recent enough to turn two-factor on (the database decides, crm.signed_in_recently). */
async function signedInRecently(context: PageContext): Promise<boolean> {
  return context.db.oneFirst(sql.type(RecentRow)`select crm.signed_in_recently() as recent`)
}

/** The notice of a refusal for want of a recent sign-in: what to do about it. */
function signInAgain(what: string): SafeHtml {
  return html`<div class="notice error" role="alert">To ${what}, confirm it is you: <a href="${SIGN_IN_AGAIN}">sign in again</a>, then come back here. You signed in more than 10 minutes ago.</div>`
}

const DONE: Record<string, string> = {
  revoked: 'Revoked. It stops working at once.',
  'two-factor-off': 'Two-factor sign-in is off.',
}

async function myTotp(context: PageContext): Promise<Totp | null> {
  return context.db.maybeOne(sql.type(TotpRow)`select secret_encrypted, confirmed, recovery_codes_left from crm.my_totp()`)
}

function tokenTable(tokens: TokenRow[], csrf: string): SafeHtml {
  if (tokens.length === 0) return html`<p class="muted">No active tokens or sessions.</p>`
  return html`<table>
  <caption class="sr-only">API tokens and browser sessions</caption>
  <thead><tr><th scope="col">Name</th><th scope="col">Type</th><th scope="col">Scopes</th><th scope="col">Created</th><th scope="col">Last used</th><th scope="col">Expires</th><th scope="col"><span class="sr-only">Actions</span></th></tr></thead>
  <tbody>
  ${tokens.map(
    (token) => html`<tr>
    <th scope="row">${token.name}${token.current ? html` <span class="tag">this browser</span>` : ''}</th>
    <td>${token.kind === 'session' ? 'Browser session' : token.kind === 'oauth' ? 'App access' : 'API token'}</td>
    <td>${token.scopes ? token.scopes.map((scope) => html`<span class="tag">${scope}</span> `) : html`<span class="muted">Full role</span>`}</td>
    <td>${when(token.created_at)}</td>
    <td>${when(token.last_used_at, 'Never')}</td>
    <td>${when(token.expires_at)}</td>
    <td><form method="post" action="/security/tokens/${token.id}/revoke">${hiddenCsrf(csrf)}<button type="submit" class="danger small" aria-label="Revoke ${token.name}">Revoke</button></form></td>
  </tr>`,
  )}
  </tbody>
</table>`
}

/** Apps the user connected through OAuth (one row per authorization), each with Disconnect. */
function connectedApps(apps: TokenRow[], csrf: string): SafeHtml {
  if (apps.length === 0) return html`<p class="muted">No apps are connected. An app you allow on its consent page appears here.</p>`
  return html`<table>
  <caption class="sr-only">Connected apps</caption>
  <thead><tr><th scope="col">App</th><th scope="col">Allowed</th><th scope="col">Connected</th><th scope="col">Last used</th><th scope="col"><span class="sr-only">Actions</span></th></tr></thead>
  <tbody>
  ${apps.map(
    (app) => html`<tr>
    <th scope="row">${app.name}</th>
    <td>${(app.scopes ?? []).map((scope) => html`<span class="tag" title="${scopeWords(scope)}">${scope}</span> `)}</td>
    <td>${when(app.created_at)}</td>
    <td>${when(app.last_used_at, 'Never')}</td>
    <td><form method="post" action="/security/tokens/${app.id}/revoke">${hiddenCsrf(csrf)}<button type="submit" class="danger small" aria-label="Disconnect ${app.name}">Disconnect</button></form></td>
  </tr>`,
  )}
  </tbody>
</table>`
}
type NewToken = { name: string; value: string; expires_at: string; scopes?: string[] | null }

type State = {
  /** The token form or two-factor set-up was refused for want of a recent sign-in. */
  reauthenticate?: 'token' | 'two-factor'
  tokenError?: string
  tokenName?: string
  tokenScopes?: string[]
  newToken?: NewToken
  twoFactorError?: string
}

async function render(context: PageContext, state: State = {}, status = 200): Promise<PageResult> {
  const { api, frame, query } = context
  const listed = (await api('GET', '/api/tokens')).data as TokenRow[]
  const tokens = listed.filter((token) => token.kind !== 'oauth')
  const apps = listed.filter((token) => token.kind === 'oauth')
  const totp = await myTotp(context)
  const done = DONE[query.get('done') ?? '']
  const twoFactorOn = totp?.confirmed === true
  return {
    status,
    title: 'Security',
    content: html`<h1>Security</h1>
${done ? html`<div class="notice success" role="status">${done}</div>` : ''}
${
  state.newToken
    ? html`<section class="notice success" aria-labelledby="token-heading">
  <h2 id="token-heading">API token “${state.newToken.name}” created</h2>
  <p>Copy it now: it is shown only once. It expires on ${when(state.newToken.expires_at)}. Send it as <code>Authorization: Bearer …</code>.
  ${state.newToken.scopes ? html`It is limited to ${state.newToken.scopes.map((scope) => html`<code>${scope}</code> `)}.` : 'It may do everything your role allows.'}</p>
  ${shownOnce('new-token', 'Token', state.newToken.value)}
</section>`
    : ''
}
<section aria-labelledby="tokens-heading">
  <h2 id="tokens-heading">Tokens and sessions</h2>
  ${tokenTable(tokens, frame.csrf)}
  <form class="actions" method="post" action="/security/tokens/revoke-all">
    ${hiddenCsrf(frame.csrf)}
    <button type="submit" class="danger" aria-describedby="revoke-all-hint">Revoke all</button>
    <span class="hint muted" id="revoke-all-hint">Stops every API token, disconnects every app and signs out every browser, this one included.</span>
  </form>
</section>
<section aria-labelledby="apps-heading">
  <h2 id="apps-heading">Connected apps</h2>
  ${connectedApps(apps, frame.csrf)}
</section>
<div class="two-col">
<section class="panel" aria-labelledby="new-token-heading">
  <h2 id="new-token-heading">New API token</h2>
  ${state.reauthenticate === 'token' ? signInAgain('create a token that lasts more than a day') : errorNotice(state.tokenError)}
  <form class="stack" method="post" action="/security/tokens">
    ${hiddenCsrf(frame.csrf)}
    <div class="field">
      <label for="token-name">Name</label>
      <input type="text" id="token-name" name="name" value="${state.tokenName ?? ''}" maxlength="200" required aria-describedby="token-name-hint">
      <span class="hint" id="token-name-hint">Say where it is used, for example “ERP sync”.</span>
    </div>
    <fieldset class="checks" aria-describedby="token-scopes-hint">
      <legend>Scopes</legend>
      ${PERSONAL_TOKEN_SCOPES.map(
        (scope) =>
          html`<label title="${SCOPE_DESCRIPTIONS[scope]}"><input type="checkbox" name="scope-${scope}" value="on"${state.tokenScopes?.includes(scope) ? html` checked` : ''}> <code>${scope}</code></label>`,
      )}
    </fieldset>
    <span class="hint" id="token-scopes-hint">Limit what the token may do within your role. None checked: everything your role allows.</span>
    <div class="field">
      <label for="token-expiry">Expires in</label>
      <select id="token-expiry" name="expires_in_days">
        ${EXPIRY_CHOICES.map((choice) => html`<option value="${choice.days}"${choice.days === DEFAULT_EXPIRY_DAYS ? html` selected` : ''}>${choice.label}</option>`)}
      </select>
    </div>
    <div class="actions"><button type="submit">Create token</button></div>
  </form>
</section>
<section class="panel" aria-labelledby="two-factor-heading">
  <h2 id="two-factor-heading">Two-factor sign-in</h2>
  ${state.reauthenticate === 'two-factor' ? signInAgain('turn on two-factor sign-in') : errorNotice(state.twoFactorError)}
  ${
    twoFactorOn
      ? html`<p>Two-factor sign-in is <strong>on</strong>. ${totp.recovery_codes_left} recovery code${totp.recovery_codes_left === 1 ? '' : 's'} left.</p>
  <form class="stack" method="post" action="/security/two-factor/disable">
    ${hiddenCsrf(frame.csrf)}
    <div class="field">
      <label for="disable-code">Authentication code</label>
      <input type="text" id="disable-code" name="code" inputmode="numeric" pattern="[0-9 ]{6,7}" maxlength="7" autocomplete="one-time-code" required>
    </div>
    <div class="actions"><button type="submit" class="danger">Turn off two-factor</button></div>
  </form>`
      : html`<p>Two-factor sign-in is <strong>off</strong>. With it on, signing in also needs a code from an authenticator app.</p>
  <form method="post" action="/security/two-factor/start">
    ${hiddenCsrf(frame.csrf)}
    <button type="submit">Set up two-factor</button>
  </form>`
  }
</section>
</div>`,
  }
}

export const showSecurity: PageHandler = (context) =>
  render(context, {
    newToken: takeFlash<NewToken>(context.services.config.appSecret, context.req, context.res, 'token') ?? undefined,
  })

export const createToken: PageHandler = async (context) => {
  const { form, attempt } = context
  const name = form.get('name').trim()
  const days = Number(form.get('expires_in_days'))
  // One checkbox per scope (named scope-<scope>), so the form needs no repeated fields.
  const scopes = PERSONAL_TOKEN_SCOPES.filter((scope) => form.get(`scope-${scope}`) === 'on')
  const again = { tokenName: name, tokenScopes: scopes }
  if (name === '') return render(context, { ...again, tokenError: 'Enter a name for the token.' }, 422)
  if (name.length > 200) return render(context, { ...again, tokenError: 'The name is too long (at most 200 characters).' }, 422)
  if (!EXPIRY_CHOICES.some((choice) => choice.days === days))
    return render(context, { ...again, tokenError: 'Choose when the token expires.' }, 422)
  // The API's own route: the same validation and the same rules (a scoped session could only give its scopes).
  const created = await attempt(({ api }) =>
    api<{ token: string; expires_at: string }>('POST', '/api/tokens', {
      body: { name, expires_in_days: days, ...(scopes.length > 0 ? { scopes } : {}) },
    }),
  )
  if (!created.ok) {
    const reauthenticate = created.error.code === 'reauthentication_required' ? 'token' : undefined
    return render(context, { ...again, tokenError: created.error.message, reauthenticate }, created.error.status)
  }
  setFlash(context.services.config.appSecret, context.req, context.res, 'token', {
    name,
    value: created.value.token,
    expires_at: created.value.expires_at,
    scopes: scopes.length > 0 ? scopes : null,
  })
  return { redirect: '/security' }
}

export const revokeToken: PageHandler = async ({ api, params, caller, req, res }) => {
  if (!UUID_PATTERN.test(params.id ?? '')) throw new ApiError(404, 'not_found', 'Not found', 'No such token or session.')
  await api('DELETE', '/api/tokens/:id', { params: { id: params.id.toLowerCase() } })
  if (params.id.toLowerCase() === caller.tokenId) {
    clearCookie(req, res, SESSION_COOKIE)
    return { redirect: '/sign-in?notice=signed-out' }
  }
  return { redirect: '/security?done=revoked' }
}

export const revokeAll: PageHandler = async ({ api, req, res }) => {
  await api('DELETE', '/api/tokens')
  clearCookie(req, res, SESSION_COOKIE)
  return { redirect: '/sign-in?notice=signed-out' }
}

// ---------------------------------------------------------------------------------------------
// Two-factor enrollment

export const startTwoFactor: PageHandler = async (context) => {
  const totp = await myTotp(context)
  if (totp?.confirmed) return { redirect: '/security' }
  // Asked before the QR code is shown; the database refuses the confirmation itself all the same.
  if (!(await signedInRecently(context))) return render(context, { reauthenticate: 'two-factor' }, 403)
  const secret = newTotpSecret()
  await context.db.query(
    sql.unsafe`select crm.start_totp_enrollment(${sql.binary(sealTotpSecret(context.services.config.appSecret, secret))})`,
  )
  return { redirect: '/security/two-factor' }
}

async function enrollmentPage(context: PageContext, error?: string, status = 200): Promise<PageResult> {
  const totp = await myTotp(context)
  if (!totp || totp.confirmed) return { redirect: '/security' }
  const secret = open(totpKey(context.services.config.appSecret), totp.secret_encrypted)
  const uri = otpauthUri(context.frame.user.email, secret)
  const grouped = secret.replace(/(.{4})/g, '$1 ').trim()
  return {
    status,
    title: 'Set up two-factor sign-in',
    content: html`<h1>Set up two-factor sign-in</h1>
<div class="two-col">
<section class="panel" aria-labelledby="scan-heading">
  <h2 id="scan-heading">1. Scan the QR code</h2>
  <p>Scan it with an authenticator app (1Password, Google Authenticator, Aegis, …).</p>
  ${trusted(qrSvg(uri, 'QR code for your authenticator app'))}
  <p>Cannot scan? Enter this key instead: <code id="totp-secret">${grouped}</code></p>
</section>
<section class="panel" aria-labelledby="confirm-heading">
  <h2 id="confirm-heading">2. Enter a code</h2>
  ${errorNotice(error)}
  <form class="stack" method="post" action="/security/two-factor/confirm">
    ${hiddenCsrf(context.frame.csrf)}
    <div class="field">
      <label for="confirm-code">Authentication code</label>
      <input type="text" id="confirm-code" name="code" inputmode="numeric" pattern="[0-9 ]{6,7}" maxlength="7" autocomplete="one-time-code" required autofocus>
    </div>
    <div class="actions"><button type="submit">Turn on two-factor</button> <a href="/security">Cancel</a></div>
  </form>
</section>
</div>`,
  }
}

export const showTwoFactor: PageHandler = (context) => enrollmentPage(context)

export const confirmTwoFactor: PageHandler = async (context) => {
  const totp = await myTotp(context)
  if (!totp || totp.confirmed) return { redirect: '/security' }
  const code = context.form.get('code').replace(/\s+/g, '')
  const step = totpStep(context.services.config.appSecret, totp.secret_encrypted, code)
  if (step === null) {
    return enrollmentPage(context, 'That code is not right. Enter the 6-digit code your app shows now.', 422)
  }
  if (!(await signedInRecently(context))) return render(context, { reauthenticate: 'two-factor' }, 403)
  const codes = newRecoveryCodes()
  // The code's step is used up, as at sign-in: it cannot turn two-factor off again a moment later.
  await context.db.query(sql.unsafe`select crm.confirm_totp_enrollment(${sql.array(codes.map(hashRecoveryCode), 'bytea')}, ${step})`)
  setFlash(context.services.config.appSecret, context.req, context.res, 'recovery-codes', codes)
  return { redirect: '/security/two-factor/recovery-codes' }
}

export const showRecoveryCodes: PageHandler = async (context) => {
  const codes = takeFlash<string[]>(context.services.config.appSecret, context.req, context.res, 'recovery-codes')
  if (!codes) return { redirect: '/security' }
  return {
    title: 'Two-factor sign-in is on',
    content: html`<h1>Two-factor sign-in is on</h1>
<section class="panel" aria-labelledby="codes-heading">
  <h2 id="codes-heading">Recovery codes</h2>
  <p>Save these codes somewhere safe: they are shown only once. Each one signs you in once if you lose your authenticator.</p>
  <ol class="codes" id="recovery-codes">${codes.map((code) => html`<li>${code}</li>`)}</ol>
  <div class="actions">
    <button type="button" class="secondary" data-copy="recovery-codes" hidden>Copy</button>
    <span id="recovery-codes-status" class="muted" role="status"></span>
    <a href="/security">Done</a>
  </div>
</section>`,
  }
}

export const disableTwoFactor: PageHandler = async (context) => {
  const totp = await myTotp(context)
  if (!totp?.confirmed) return { redirect: '/security' }
  const code = context.form.get('code').replace(/\s+/g, '')
  // The same per-user count as the two-factor step of sign-in, claimed before the check: a stolen
  // session must not guess its way to turning two-factor off.
  const claim = await context.db.one(sql.type(ClaimRow)`select allowed, retry_after_seconds from crm.claim_my_two_factor_attempt()`)
  if (!claim.allowed) {
    context.res.setHeader('Retry-After', String(claim.retry_after_seconds))
    const minutes = Math.ceil(claim.retry_after_seconds / 60)
    return render(
      context,
      {
        twoFactorError: `Too many wrong codes. Try again in ${minutes} minute${minutes === 1 ? '' : 's'}. Two-factor sign-in is still on.`,
      },
      429,
    )
  }
  const step = totpStep(context.services.config.appSecret, totp.secret_encrypted, code)
  if (step === null) {
    return render(context, { twoFactorError: 'That code is not right. Two-factor sign-in is still on.' }, 422)
  }
  // A code is accepted once (docs/api.md section 3): one already used, at sign-in or here, is refused.
  const disabled = await context.db.oneFirst(sql.type(DisabledRow)`select crm.disable_totp(${step}) as disabled`)
  if (!disabled) {
    return render(
      context,
      { twoFactorError: 'That code was used already. Wait for the next code of your app. Two-factor sign-in is still on.' },
      422,
    )
  }
  return { redirect: '/security?done=two-factor-off' }
}
