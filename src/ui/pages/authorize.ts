// The OAuth authorization endpoint (docs/api.md section 4a): GET /oauth/authorize checks the client and
// its redirect URI (an error page when either is wrong, never a redirect), sends a signed-out
// browser through sign-in (and two-factor) and back, and shows the consent: the app, the
// workspace it belongs to, each scope in plain words, Allow and Deny. The form posts back here
// (CSRF-checked like every form); Allow issues a single-use code through crm.oauth_issue_code,
// and both answers go back to the app with `state` and `iss` (RFC 9207).
//
// Anyone can register an app with an https address of their choosing, so a registered address
// proves nothing about it: the browser is sent there only for a signed-in user who may connect
// the app (an active member of its workspace with API access, the people its admins vouch for).
// Everyone else sees the error here (RFC 9700 section 4.11.2): otherwise our origin would be an
// open redirector to any address its registrant likes.
import { createHash, randomBytes } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import Type, { type Static } from 'typebox'
import { type CommonQueryMethods, sql } from '../../db/pool.ts'
import { rowType } from '../../db/typed-rows.ts'
import type { Services } from '../../http/route.ts'
import {
  type AuthorizationRequest,
  type Checked,
  checkRequest,
  clientOfRequest,
  parametersOf,
  redirectBack,
} from '../../oauth/authorization-request.ts'
import { scopeWords } from '../../oauth/scopes.ts'
import type { Form } from '../form.ts'
import { html } from '../html.ts'
import { allowingFormRedirectTo, hiddenCsrf } from '../layout.ts'
import { errorPage, type PageContext, type PageHandler, type PageResult } from '../page-context.ts'
import { query } from '../request.ts'
import { hasSessionCookie } from '../session.ts'

const ClientSchema = Type.Object({
  app_id: Type.String(),
  app_name: Type.String(),
  // Null unless the user may connect the app (sql/definitions/70_oauth.sql).
  workspace_name: Type.Union([Type.String(), Type.Null()]),
  redirect_uri_ok: Type.Boolean(),
  user_may_connect: Type.Boolean(),
})
type Client = Static<typeof ClientSchema>
const CLIENT = rowType(ClientSchema)
const REGISTERED = rowType(Type.Object({ ok: Type.Boolean() }))

const NOT_VALID =
  'This link to connect an app is not valid: the app is not registered here, or it asked to return to an address it did not register. Nothing was shared. Ask the app’s developer for help.'

async function lookUpClient(db: CommonQueryMethods, client: { clientId: string; redirectUri: string }): Promise<Client | null> {
  const found = await db.maybeOne(sql.type(CLIENT)`
    select app_id, app_name, workspace_name, redirect_uri_ok, user_may_connect
      from crm.oauth_authorization_client(${client.clientId}, ${client.redirectUri})`)
  return found?.redirect_uri_ok ? found : null
}

function formParameters(form: Form) {
  return { get: (name: string) => (form.has(name) ? form.get(name) : null), count: (name: string) => (form.has(name) ? 1 : 0) }
}

function notValid(): PageResult {
  return {
    status: 400,
    title: 'Connect an app',
    content: html`<h1>Connect an app</h1><div class="notice error" role="alert">${NOT_VALID}</div>`,
  }
}

type Refusal = Extract<Checked, { ok: false }>

function refusedRequest({ error, description }: Refusal): string {
  return `This link to connect an app is not valid: ${description} (${error}). Nothing was shared. Ask the app’s developer for help.`
}

/**
 * A request the app got wrong: back to the app with the error for a user who may connect it,
 * shown here to anyone else (their browser is never sent to an address nobody vouched for).
 */
function refuse(found: Client, client: { redirectUri: string }, refusal: Refusal, issuer: string): PageResult {
  if (!found.user_may_connect) {
    return {
      status: 400,
      title: `Connect ${found.app_name}`,
      content: html`<h1>Connect ${found.app_name}</h1><div class="notice error" role="alert">${refusedRequest(refusal)}</div>`,
    }
  }
  const { error, description, state } = refusal
  return { redirect: redirectBack(client.redirectUri, { error, error_description: description, state }, issuer) }
}

function consent(context: PageContext, client: Client, request: AuthorizationRequest): PageResult {
  const { frame } = context
  const destination = new URL(request.redirectUri)
  if (!client.user_may_connect) {
    // Neither the workspace's name nor a way back to the app's address: the user is not one of
    // the people the app's workspace vouches for.
    return {
      status: 403,
      title: `Connect ${client.app_name}`,
      content: html`<h1>Connect ${client.app_name}</h1>
<div class="notice error" role="alert">${client.app_name} belongs to a workspace in which you (${frame.user.email}) are not an active member with API access. Only its members can connect it. Nothing was shared.</div>`,
    }
  }
  const hidden = (name: string, value: string | null) => (value === null ? '' : html`<input type="hidden" name="${name}" value="${value}">`)
  return {
    title: `Connect ${client.app_name}`,
    headers: allowingFormRedirectTo(destination.origin),
    content: html`<h1>Connect ${client.app_name}</h1>
<section class="panel stack consent" aria-labelledby="consent-heading">
  <h2 id="consent-heading">${client.app_name} wants to act for you</h2>
  <dl class="stats">
    <dt>You</dt><dd>${frame.user.name} (${frame.user.email})</dd>
    <dt>Workspace</dt><dd>${client.workspace_name}</dd>
  </dl>
  <p>If you allow it, ${client.app_name} will be able to:</p>
  <ul class="scopes">${request.scopes.map((scope) => html`<li><strong>${scopeWords(scope)}</strong> <code>${scope}</code></li>`)}</ul>
  <p class="muted">Never more than your own role allows in this workspace. You can disconnect it at any time on your Security page.</p>
  <form class="actions" method="post" action="/oauth/authorize">
    ${hiddenCsrf(frame.csrf)}
    ${hidden('client_id', request.clientId)}
    ${hidden('redirect_uri', request.redirectUri)}
    ${hidden('response_type', 'code')}
    ${hidden('scope', request.scopes.join(' '))}
    ${hidden('state', request.state)}
    ${hidden('code_challenge', request.codeChallenge)}
    ${hidden('code_challenge_method', 'S256')}
    <button type="submit" name="decision" value="allow">Allow</button>
    <button type="submit" name="decision" value="deny" class="secondary">Deny</button>
  </form>
  <p class="hint muted">Either way you return to <span class="mono">${destination.host}</span>.</p>
</section>`,
  }
}

/** The consent page, for a signed-in user; the request was checked before sign-in and is checked again. */
const showConsent: PageHandler = async (context) => {
  const parameters = parametersOf(context.query)
  const client = clientOfRequest(parameters)
  const found = client && (await lookUpClient(context.db, client))
  if (!client || !found) return notValid()
  const checked = checkRequest(parameters, client)
  if (!checked.ok) return refuse(found, client, checked, context.services.baseUrl)
  return consent(context, found, checked.request)
}

/** Allow or Deny, posted by the consent form. */
export function decideConsent(codeLifetimeSeconds: number): PageHandler {
  return async (context) => {
    const parameters = formParameters(context.form)
    const client = clientOfRequest(parameters)
    const found = client && (await lookUpClient(context.db, client))
    if (!client || !found) return notValid()
    const checked = checkRequest(parameters, client)
    const issuer = context.services.baseUrl
    if (!checked.ok) return refuse(found, client, checked, issuer)
    const { request } = checked
    if (!found.user_may_connect) return consent(context, found, request)
    if (context.form.get('decision') !== 'allow') {
      return { redirect: redirectBack(request.redirectUri, { error: 'access_denied', state: request.state }, issuer) }
    }
    const code = randomBytes(32).toString('base64url')
    await context.db.query(sql.unsafe`
      select crm.oauth_issue_code(${request.clientId}, ${request.redirectUri}, ${sql.array(request.scopes, 'text')}, ${request.codeChallenge},
                                  ${sql.binary(createHash('sha256').update(code).digest())}, ${codeLifetimeSeconds})`)
    return { redirect: redirectBack(request.redirectUri, { code, state: request.state }, issuer) }
  }
}

/**
 * GET /oauth/authorize: the client and redirect URI are checked before anything else (an error
 * page, never a redirect, when they are not the app's). Before sign-in any other problem is shown
 * here too; a valid request, or any request of a browser with a session, goes on to the consent
 * page (through sign-in when needed), which sends errors back only for a user who may connect.
 */
export function authorizationEndpoint(services: Services, consentPage: (req: IncomingMessage, res: ServerResponse) => Promise<void>) {
  return async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const parameters = parametersOf(query(req))
    const client = clientOfRequest(parameters)
    // Before sign-in, as the runtime role: only whether the app has this redirect URI.
    const registered =
      client &&
      (await services.pool.oneFirst(
        sql.type(REGISTERED)`select crm.oauth_client_redirect_ok(${client.clientId}, ${client.redirectUri}) as ok`,
      ))
    if (!client || !registered) return errorPage(res, 400, NOT_VALID)
    const checked = checkRequest(parameters, client)
    if (!checked.ok && !hasSessionCookie(req)) return errorPage(res, 400, refusedRequest(checked))
    return consentPage(req, res)
  }
}

export { showConsent }
