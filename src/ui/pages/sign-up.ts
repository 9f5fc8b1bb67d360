// Sign up (a new user with a new workspace) and Accept invitation, both before sign-in. They call
// the same functions as POST /api/signup and POST /api/invitations/accept, then start a browser
// session with the sign-in function (kind session); the API token those functions issue is
// revoked at once through DELETE /api/tokens/{id}, since nobody in a browser ever sees it.
import type { IncomingMessage, ServerResponse } from 'node:http'
import { createAuthenticator } from '../../auth/authenticate.ts'
import { signInWithPassword, type TokenBody } from '../../auth/sign-in.ts'
import type { ApiError } from '../../http/problem.ts'
import { toApiError } from '../../http/problem.ts'
import { type RouteDefinition, type Services, validateBody } from '../../http/route.ts'
import { acceptInvitation, type InvitationPreview, previewInvitation } from '../../members/invitations.ts'
import { signUp } from '../../members/signup.ts'
import { apiCaller } from '../api-calls.ts'
import { readForm } from '../form.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf, redirect, sendHtml, signedOutPage } from '../layout.ts'
import { deviceName, query } from '../request.ts'
import {
  clearCookie,
  csrfToken,
  csrfValid,
  ensurePreSession,
  hasSessionCookie,
  PRE_SESSION_COOKIE,
  readCookie,
  SESSION_COOKIE,
  setCookie,
  WORKSPACE_COOKIE,
} from '../session.ts'
import { plainRefusal } from './admin-common.ts'

type Request = IncomingMessage & { requestId?: string }

function field(id: string, label: string, input: SafeHtml, hint?: string): SafeHtml {
  return html`<div class="field">
    <label for="${id}">${label}</label>
    ${input}
    ${hint ? html`<span class="hint" id="${id}-hint">${hint}</span>` : ''}
  </div>`
}

const PASSWORD_HINT = 'At least 10 characters, and not your email.'

type SignUpValues = { email: string; name: string; workspace_name: string }

type Invitation = InvitationPreview

export function signUpPages(services: Services, definitions: RouteDefinition[]) {
  const { config, pool } = services

  /** Signs the browser in with the password just chosen, and revokes the API token the call issued. */
  async function startSession(
    req: Request,
    res: ServerResponse,
    email: string,
    password: string,
    issued: TokenBody,
    slug: string,
  ): Promise<boolean> {
    const session = await signInWithPassword(pool, config, { email, password, device_name: deviceName(req) }, 'session')
    await revokeIssued(req, res, issued)
    if ('two_factor' in session) return false
    setCookie(req, res, SESSION_COOKIE, session.token, { maxAgeSeconds: (Date.parse(session.expires_at) - Date.now()) / 1000 })
    setCookie(req, res, WORKSPACE_COOKIE, slug, { maxAgeSeconds: 400 * 86_400 })
    clearCookie(req, res, PRE_SESSION_COOKIE)
    return true
  }

  function signUpForm(req: IncomingMessage, res: ServerResponse, status: number, values: SignUpValues, error?: string): void {
    ensurePreSession(req, res)
    sendHtml(
      res,
      status,
      signedOutPage(
        'Sign up',
        html`<h1>Sign up</h1>
<p class="lead">Create your workspace. You will be its admin, and the 14-day trial starts now.</p>
${errorNotice(error)}
<form class="stack panel" method="post" action="/sign-up">
  ${hiddenCsrf(csrfToken(config.appSecret, req))}
  ${field('name', 'Your name', html`<input type="text" id="name" name="name" value="${values.name}" maxlength="255" autocomplete="name" required autofocus>`)}
  ${field('email', 'Email', html`<input type="email" id="email" name="email" value="${values.email}" maxlength="254" autocomplete="username" required>`)}
  ${field('password', 'Password', html`<input type="password" id="password" name="password" maxlength="1024" autocomplete="new-password" required aria-describedby="password-hint">`, PASSWORD_HINT)}
  ${field('workspace_name', 'Workspace name', html`<input type="text" id="workspace_name" name="workspace_name" value="${values.workspace_name}" maxlength="255" autocomplete="organization" required>`, 'Usually your company or team.')}
  <div class="actions"><button type="submit">Sign up</button></div>
</form>
<p>Already have an account? <a href="/sign-in">Sign in</a></p>`,
      ),
    )
  }

  function signUpRefusal(error: ApiError, email: string): string {
    if (error.code === 'duplicate') return `There is already an account for ${email}. Sign in instead, or use another email.`
    return plainRefusal(error, { email: 'the email', password: 'the password', name: 'your name', workspace_name: 'the workspace name' })
  }

  async function findInvitation(token: string): Promise<Invitation | null> {
    if (token === '' || token.length > 200) return null
    // Read-only preview for the page (who is invited where); acceptInvitation re-checks everything.
    return previewInvitation(pool, token)
  }

  function acceptPage(
    req: IncomingMessage,
    res: ServerResponse,
    status: number,
    token: string,
    invitation: Invitation | null,
    values: { name?: string; error?: string } = {},
  ): void {
    ensurePreSession(req, res)
    const csrf = csrfToken(config.appSecret, req)
    const here = `/invitations/accept?token=${encodeURIComponent(token)}`
    let body: SafeHtml
    if (!invitation)
      body = html`<div class="notice error" role="alert">This invitation link is not valid. Check that you copied the whole link, or ask for a new invitation.</div>`
    else if (invitation.accepted)
      body = html`<div class="notice info" role="status">This invitation was already accepted. <a href="/sign-in">Sign in</a> to use the workspace.</div>`
    else if (invitation.expired)
      body = html`<div class="notice error" role="alert">This invitation has expired. Ask an admin of ${invitation.workspace_name} for a new one.</div>`
    else {
      const intro = html`<p class="lead">You are invited to join <strong>${invitation.workspace_name}</strong> as <strong>${invitation.role}</strong>, with the email <strong>${invitation.email}</strong>.</p>`
      if (invitation.has_account && !hasSessionCookie(req)) {
        body = html`${intro}${errorNotice(values.error)}
<div class="panel"><p>You already have an account for ${invitation.email}. Sign in, and you will come back here to accept.</p>
<p><a class="button" href="/sign-in?next=${encodeURIComponent(here)}">Sign in to accept</a></p></div>`
      } else if (invitation.has_account) {
        body = html`${intro}${errorNotice(values.error)}
<form class="stack panel" method="post" action="/invitations/accept">
  ${hiddenCsrf(csrf)}
  <input type="hidden" name="token" value="${token}">
  <p>You are signed in. Accepting adds ${invitation.workspace_name} to your workspaces.</p>
  <div class="actions"><button type="submit">Accept invitation</button></div>
</form>`
      } else {
        body = html`${intro}${errorNotice(values.error)}
<form class="stack panel" method="post" action="/invitations/accept">
  ${hiddenCsrf(csrf)}
  <input type="hidden" name="token" value="${token}">
  ${field('name', 'Your name', html`<input type="text" id="name" name="name" value="${values.name ?? ''}" maxlength="255" autocomplete="name" required autofocus>`)}
  ${field('email', 'Email', html`<input type="email" id="email" value="${invitation.email}" readonly autocomplete="username">`)}
  ${field('password', 'Choose a password', html`<input type="password" id="password" name="password" maxlength="1024" autocomplete="new-password" required aria-describedby="password-hint">`, PASSWORD_HINT)}
  <div class="actions"><button type="submit">Accept invitation</button></div>
</form>`
      }
    }
    sendHtml(res, status, signedOutPage('Accept invitation', html`<h1>Accept invitation</h1>${body}`))
  }

  return {
    showSignUp: async (req: IncomingMessage, res: ServerResponse) => {
      signUpForm(req, res, 200, { email: '', name: '', workspace_name: '' })
    },

    submitSignUp: async (req: Request, res: ServerResponse) => {
      const form = await readForm(req, services)
      const values = { email: form.get('email').trim(), name: form.get('name').trim(), workspace_name: form.get('workspace_name').trim() }
      const password = form.get('password')
      if (!csrfValid(config.appSecret, req, form.get('csrf')))
        return signUpForm(req, res, 403, values, 'This form has expired. Please try again.')
      const missing = [
        values.name === '' && 'your name',
        values.email === '' && 'your email',
        password === '' && 'a password',
        values.workspace_name === '' && 'a workspace name',
      ].filter(Boolean)
      if (missing.length) return signUpForm(req, res, 422, values, `Enter ${missing.join(', ')}.`)
      const definition = definitions.find((candidate) => candidate.method === 'POST' && candidate.path === '/api/signup')
      try {
        // The API route's body schema first (email shape, lengths), then the sign-up itself.
        if (definition?.body) validateBody(definition.body, { ...values, password })
        const issued = await signUp(pool, config, { ...values, password })
        if (!(await startSession(req, res, values.email, password, issued, issued.workspace_slug))) return redirect(res, '/sign-in')
        return redirect(res, '/members?welcome=1')
      } catch (error) {
        const apiError = toApiError(error)
        if (apiError.status >= 500) throw error
        return signUpForm(req, res, apiError.status, values, signUpRefusal(apiError, values.email))
      }
    },

    showAccept: async (req: IncomingMessage, res: ServerResponse) => {
      const token = query(req).get('token') ?? ''
      const invitation = await findInvitation(token)
      acceptPage(req, res, invitation && !invitation.accepted && !invitation.expired ? 200 : 404, token, invitation)
    },

    submitAccept: async (req: Request, res: ServerResponse) => {
      const form = await readForm(req, services)
      const token = form.get('token')
      const invitation = await findInvitation(token)
      if (!csrfValid(config.appSecret, req, form.get('csrf')))
        return acceptPage(req, res, 403, token, invitation, { name: form.get('name'), error: 'This form has expired. Please try again.' })
      if (!invitation || invitation.accepted || invitation.expired) return acceptPage(req, res, 404, token, invitation)
      const session = hasSessionCookie(req) && invitation.has_account ? (readCookie(req, SESSION_COOKIE) ?? null) : null
      const name = form.get('name').trim()
      const password = form.get('password')
      if (session === null && (name === '' || password === ''))
        return acceptPage(req, res, 422, token, invitation, { name, error: 'Enter your name and choose a password.' })
      try {
        const issued = await acceptInvitation(
          pool,
          config,
          session === null ? { token, name: name.slice(0, 255), password } : { token },
          session,
        )
        if (session !== null) {
          // The signed-in user keeps their session; only the API token the acceptance issued goes.
          await revokeIssued(req, res, issued)
          setCookie(req, res, WORKSPACE_COOKIE, invitation.slug, { maxAgeSeconds: 400 * 86_400 })
          return redirect(res, '/')
        }
        if (!(await startSession(req, res, invitation.email, password, issued, invitation.slug))) return redirect(res, '/sign-in')
        return redirect(res, '/')
      } catch (error) {
        const apiError = toApiError(error)
        if (apiError.status >= 500) throw error
        if (apiError.status === 401)
          return redirect(res, `/sign-in?next=${encodeURIComponent(`/invitations/accept?token=${encodeURIComponent(token)}`)}`)
        const message =
          apiError.status === 403
            ? `This invitation was sent to ${invitation.email}, but you are signed in with another account. Sign out, then open the link again.`
            : apiError.code === 'duplicate' && /already a member/.test(apiError.message)
              ? `You are already a member of ${invitation.workspace_name}.`
              : plainRefusal(apiError, { password: 'the password', name: 'your name', token: 'the invitation link' })
        return acceptPage(req, res, apiError.status, token, invitation, { name, error: message })
      }
    },
  }

  /** The API token signUp and acceptInvitation issue is of no use in a browser: revoke it through the API. */
  async function revokeIssued(req: Request, res: ServerResponse, issued: TokenBody): Promise<void> {
    try {
      await pool.transaction(async (db) => {
        const bearer = { headers: { authorization: `Bearer ${issued.token}` } } as unknown as IncomingMessage
        const caller = await createAuthenticator(config)(db, bearer, req.requestId ?? '')
        await apiCaller(
          definitions,
          services,
          db,
          caller,
          req,
          res,
          req.requestId ?? '',
        )('DELETE', '/api/tokens/:id', { params: { id: issued.token_id } })
      })
    } catch (error) {
      services.logger.warn('ui: could not revoke the API token issued for a browser sign-up or acceptance', {
        error: error instanceof Error ? error.message : String(error),
      })
    }
  }
}
