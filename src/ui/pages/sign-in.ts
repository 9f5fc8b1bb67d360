// Sign in with email and password, then (when two-factor is on) an authentication or recovery
// code. Both steps call the same functions as POST /api/token, asking for a session token.
import type { IncomingMessage, ServerResponse } from 'node:http'
import { completeTwoFactor, signInWithPassword } from '../../auth/sign-in.ts'
import { AttemptLimitError } from '../../errors.ts'
import { clientOf } from '../../http/client-address.ts'
import type { ApiError } from '../../http/problem.ts'
import { toApiError } from '../../http/problem.ts'
import type { Services } from '../../http/route.ts'
import { readForm } from '../form.ts'
import { html } from '../html.ts'
import { errorNotice, hiddenCsrf, redirect, safeReturnPath, sendHtml, signedOutPage } from '../layout.ts'
import { deviceName, query } from '../request.ts'
import {
  CHALLENGE_COOKIE,
  clearCookie,
  csrfToken,
  csrfValid,
  ensurePreSession,
  hasSessionCookie,
  PRE_SESSION_COOKIE,
  readCookie,
  SESSION_COOKIE,
  setCookie,
} from '../session.ts'

const NOTICES: Record<string, string> = {
  'session-ended': 'Your session has ended. Sign in again.',
  'signed-out': 'You are signed out.',
  'challenge-expired': 'The sign-in took too long or the code was tried too often. Sign in again.',
}
const REAUTHENTICATE_NOTICE = 'Confirm it is you: sign in again to go on.'

function startSession(req: IncomingMessage, res: ServerResponse, token: string, expiresAt: string): void {
  setCookie(req, res, SESSION_COOKIE, token, { maxAgeSeconds: (Date.parse(expiresAt) - Date.now()) / 1000 })
  clearCookie(req, res, PRE_SESSION_COOKIE)
  clearCookie(req, res, CHALLENGE_COOKIE, '/sign-in')
}

function passwordForm(
  services: Services,
  req: IncomingMessage,
  res: ServerResponse,
  status: number,
  values: { email?: string; error?: string; notice?: string },
): void {
  ensurePreSession(req, res)
  const next = safeReturnPath(query(req).get('next'), '')
  sendHtml(
    res,
    status,
    signedOutPage(
      'Sign in',
      html`<h1>Sign in</h1>
${values.notice ? html`<div class="notice info" role="status">${values.notice}</div>` : ''}
${errorNotice(values.error)}
<form class="stack panel" method="post" action="/sign-in${next ? `?next=${encodeURIComponent(next)}` : ''}">
  ${hiddenCsrf(csrfToken(services.config.appSecret, req))}
  <div class="field">
    <label for="email">Email</label>
    <input type="email" id="email" name="email" value="${values.email ?? ''}" autocomplete="username" required autofocus${values.error ? html` aria-invalid="true"` : ''}>
  </div>
  <div class="field">
    <label for="password">Password</label>
    <input type="password" id="password" name="password" autocomplete="current-password" required>
  </div>
  <div class="actions"><button type="submit">Sign in</button></div>
</form>
<p>New here? <a href="/sign-up">Sign up</a> and start a 14-day trial.</p>`,
    ),
  )
}

function codeForm(services: Services, req: IncomingMessage, res: ServerResponse, status: number, recovery: boolean, error?: string): void {
  ensurePreSession(req, res)
  const next = safeReturnPath(query(req).get('next'), '')
  const action = `/sign-in/two-factor${next ? `?next=${encodeURIComponent(next)}` : ''}`
  sendHtml(
    res,
    status,
    signedOutPage(
      'Two-factor sign-in',
      html`<h1>Two-factor sign-in</h1>
<p class="lead">${recovery ? 'Enter one of the recovery codes you saved when you turned two-factor on. Each code works once.' : 'Enter the 6-digit code from your authenticator app.'}</p>
${errorNotice(error)}
<form class="stack panel" method="post" action="${action}">
  ${hiddenCsrf(csrfToken(services.config.appSecret, req))}
  ${
    recovery
      ? html`<div class="field">
    <label for="recovery_code">Recovery code</label>
    <input type="text" id="recovery_code" name="recovery_code" autocomplete="off" spellcheck="false" required autofocus>
  </div>`
      : html`<div class="field">
    <label for="code">Authentication code</label>
    <input type="text" id="code" name="code" inputmode="numeric" pattern="[0-9 ]{6,7}" maxlength="7" autocomplete="one-time-code" required autofocus>
  </div>`
  }
  <div class="actions"><button type="submit">Verify</button></div>
</form>
<p>${
        recovery
          ? html`<a href="/sign-in/two-factor${next ? `?next=${encodeURIComponent(next)}` : ''}">Use an authentication code instead</a>`
          : html`<a href="/sign-in/two-factor?method=recovery${next ? `&next=${encodeURIComponent(next)}` : ''}">Use a recovery code instead</a>`
      }</p>
<p><a href="/sign-in">Start over</a></p>`,
    ),
  )
}

function signInRefusal(error: ApiError): string {
  switch (error.code) {
    case 'invalid_credentials':
      return 'The email or password is wrong.'
    case 'too_many_attempts': {
      const minutes = Math.max(1, Math.ceil(Number(error.headers?.['Retry-After'] ?? 60) / 60))
      return `Too many failed sign-ins for this email. Try again in ${minutes} minute${minutes === 1 ? '' : 's'}.`
    }
    case 'user_suspended':
      return 'This account is suspended. Ask your workspace admin for help.'
    case 'validation_failed':
      return 'Enter your email and your password.'
    default:
      return error.message
  }
}

export function signInPages(services: Services) {
  const { config, pool } = services
  const afterSignIn = (req: IncomingMessage) => safeReturnPath(query(req).get('next'), '/')

  return {
    showPassword: async (req: IncomingMessage, res: ServerResponse) => {
      // A signed-in browser is sent on, unless a page asked for a fresh sign-in (turning two-factor
      // on, a long-lived token): the new session replaces this one in the cookie.
      const reauthenticate = query(req).get('reauthenticate') === '1'
      if (hasSessionCookie(req) && !reauthenticate) return redirect(res, afterSignIn(req))
      passwordForm(services, req, res, 200, { notice: reauthenticate ? REAUTHENTICATE_NOTICE : NOTICES[query(req).get('notice') ?? ''] })
    },

    submitPassword: async (req: IncomingMessage, res: ServerResponse) => {
      const form = await readForm(req, services)
      if (!csrfValid(config.appSecret, req, form.get('csrf'))) {
        return passwordForm(services, req, res, 403, { email: form.get('email'), error: 'This form has expired. Please sign in again.' })
      }
      const email = form.get('email').trim()
      const password = form.get('password')
      if (email === '' || password === '')
        return passwordForm(services, req, res, 422, { email, error: 'Enter your email and your password.' })
      try {
        const result = await signInWithPassword(
          pool,
          config,
          {
            email: email.slice(0, 254),
            password: password.slice(0, 1024),
            device_name: deviceName(req),
            client_address: clientOf(req).address,
          },
          'session',
        )
        if ('two_factor' in result) {
          setCookie(req, res, CHALLENGE_COOKIE, result.challenge_token, {
            path: '/sign-in',
            maxAgeSeconds: (Date.parse(result.expires_at) - Date.now()) / 1000,
          })
          const next = safeReturnPath(query(req).get('next'), '')
          return redirect(res, `/sign-in/two-factor${next ? `?next=${encodeURIComponent(next)}` : ''}`)
        }
        startSession(req, res, result.token, result.expires_at)
        return redirect(res, afterSignIn(req))
      } catch (error) {
        const apiError = toApiError(error)
        if (apiError.status >= 500) throw error
        return passwordForm(services, req, res, apiError.status, { email, error: signInRefusal(apiError) })
      }
    },

    showCode: async (req: IncomingMessage, res: ServerResponse) => {
      if (!readCookie(req, CHALLENGE_COOKIE, '/sign-in')) return redirect(res, '/sign-in')
      codeForm(services, req, res, 200, query(req).get('method') === 'recovery')
    },

    submitCode: async (req: IncomingMessage, res: ServerResponse) => {
      const form = await readForm(req, services)
      const challenge = readCookie(req, CHALLENGE_COOKIE, '/sign-in')
      const recovery = form.has('recovery_code')
      if (!challenge) return redirect(res, '/sign-in?notice=challenge-expired')
      if (!csrfValid(config.appSecret, req, form.get('csrf')))
        return codeForm(services, req, res, 403, recovery, 'This form has expired. Please try again.')
      const code = form.get('code').replace(/\s+/g, '')
      const recoveryCode = form.get('recovery_code').trim()
      if (recovery ? recoveryCode === '' : !/^\d{6}$/.test(code)) {
        return codeForm(
          services,
          req,
          res,
          422,
          recovery,
          recovery ? 'Enter one of your recovery codes.' : 'Enter the 6 digits shown in your authenticator app.',
        )
      }
      try {
        const result = await completeTwoFactor(
          pool,
          config,
          {
            challenge_token: challenge,
            ...(recovery ? { recovery_code: recoveryCode.slice(0, 100) } : { code }),
            client_address: clientOf(req).address,
          },
          'session',
        )
        startSession(req, res, result.token, result.expires_at)
        return redirect(res, afterSignIn(req))
      } catch (error) {
        if (error instanceof AttemptLimitError) {
          // The user's codes are spent until the window ends: say so, rather than send them back to
          // the password step, which would only lead here again.
          res.setHeader('Retry-After', String(error.retryAfterSeconds))
          const minutes = Math.ceil(error.retryAfterSeconds / 60)
          return codeForm(
            services,
            req,
            res,
            429,
            recovery,
            `Too many wrong codes for this account. Try again in ${minutes} minute${minutes === 1 ? '' : 's'}.`,
          )
        }
        const apiError = toApiError(error)
        if (apiError.status >= 500) throw error
        if (apiError.code === 'challenge_expired' || apiError.code === 'too_many_attempts') {
          clearCookie(req, res, CHALLENGE_COOKIE, '/sign-in')
          return redirect(res, '/sign-in?notice=challenge-expired')
        }
        const message = recovery
          ? 'That recovery code is not valid or was already used.'
          : 'That code is not right. Check the code in your authenticator app and try again.'
        return codeForm(services, req, res, 401, recovery, message)
      }
    },
  }
}
