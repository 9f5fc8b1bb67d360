// OAuth apps (admins): register an app with its redirect URIs and get a client id and a client
// secret (shown once; only its SHA-256 is stored), list and delete the workspace's apps.
import { createHash, randomBytes } from 'node:crypto'
import Type, { type Static } from 'typebox'
import { sql } from '../../db/pool.ts'
import { IdRow, rowType } from '../../db/typed-rows.ts'
import { ApiError } from '../../http/problem.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf, shownOnce, when } from '../layout.ts'
import type { PageContext, PageHandler, PageResult } from '../page-context.ts'
import { setFlash, takeFlash } from '../session.ts'

const OAuthAppSchema = Type.Object({
  id: Type.String(),
  name: Type.String(),
  client_id: Type.String(),
  client_secret_last4: Type.String(),
  redirect_uris: Type.Array(Type.String()),
  created_at: Type.String(),
})
type OAuthApp = Static<typeof OAuthAppSchema>
const OAuthAppRow = rowType(OAuthAppSchema)
type State = {
  values?: { name: string; redirect_uris: string }
  error?: string
  created?: { name: string; client_id: string; client_secret: string }
}

/** Same rule as the CHECK in sql/000007_ui.sql, checked first for a message in plain words. */
export function redirectUriProblem(uri: string): string | null {
  let url: URL
  try {
    url = new URL(uri)
  } catch {
    return `“${uri}” is not an absolute URL`
  }
  if (uri.includes('#')) return `“${uri}” must not contain a fragment (#)`
  if (/\s/.test(uri) || uri.length > 2000) return `“${uri}” is not a valid redirect URI`
  if (url.username || url.password) return `“${uri}” must not contain a user name or password`
  if (url.protocol === 'https:') return null
  if (url.protocol === 'http:' && ['localhost', '127.0.0.1', '[::1]'].includes(url.hostname)) return null
  return `“${uri}” must use https (plain http is allowed only for localhost)`
}

function appCard(app: OAuthApp, csrf: string): SafeHtml {
  const headingId = `app-${app.id}`
  return html`<article class="card" aria-labelledby="${headingId}">
  <h3 id="${headingId}">${app.name}</h3>
  <dl class="stats">
    <dt>Client ID</dt><dd><code>${app.client_id}</code></dd>
    <dt>Secret</dt><dd><span class="mono">…${app.client_secret_last4}</span></dd>
    <dt>Redirect URIs</dt><dd>${app.redirect_uris.map((uri) => html`<div class="url">${uri}</div>`)}</dd>
    <dt>Created</dt><dd>${when(app.created_at)}</dd>
  </dl>
  <form class="actions" method="post" action="/oauth-apps/${app.id}/delete">
    ${hiddenCsrf(csrf)}
    <button type="submit" class="danger small" aria-label="Delete ${app.name}">Delete</button>
  </form>
</article>`
}

async function render(context: PageContext, state: State = {}, status = 200): Promise<PageResult> {
  const { caller, db, frame } = context
  if (!caller.isAdmin) {
    return {
      status: 403,
      title: 'OAuth apps',
      content: html`<h1>OAuth apps</h1><div class="notice info" role="status">Only workspace admins register OAuth apps.</div>`,
    }
  }
  const apps = await db.any(sql.type(OAuthAppRow)`
    select id, name, client_id, client_secret_last4, redirect_uris, created_at
      from crm.oauth_apps where workspace_id = (select crm.current_workspace_id()) order by id`)
  const values = state.values ?? { name: '', redirect_uris: '' }
  return {
    status,
    title: 'OAuth apps',
    content: html`<h1>OAuth apps</h1>
<p class="lead">Apps that act for users of this workspace through OAuth 2.0.</p>
${
  state.created
    ? html`<section class="notice success" aria-labelledby="app-created-heading">
  <h2 id="app-created-heading">App “${state.created.name}” registered</h2>
  <p>Copy the client secret now: it is shown only once.</p>
  ${shownOnce('new-client-id', 'Client ID', state.created.client_id)}
  ${shownOnce('new-client-secret', 'Client secret', state.created.client_secret)}
</section>`
    : ''
}
<section aria-labelledby="apps-heading">
  <h2 id="apps-heading">Registered apps</h2>
  ${apps.length === 0 ? html`<p class="muted">No apps yet.</p>` : html`<div class="cards">${apps.map((app) => appCard(app, frame.csrf))}</div>`}
</section>
<section class="panel" aria-labelledby="register-heading">
  <h2 id="register-heading">Register an app</h2>
  ${errorNotice(state.error)}
  <form class="stack" method="post" action="/oauth-apps">
    ${hiddenCsrf(frame.csrf)}
    <div class="field">
      <label for="app-name">Name</label>
      <input type="text" id="app-name" name="name" value="${values.name}" maxlength="100" required>
    </div>
    <div class="field">
      <label for="app-redirect-uris">Redirect URIs</label>
      <textarea id="app-redirect-uris" name="redirect_uris" rows="3" required aria-describedby="app-redirect-uris-hint">${values.redirect_uris}</textarea>
      <span class="hint" id="app-redirect-uris-hint">One per line, up to 10. HTTPS, or http://localhost for development.</span>
    </div>
    <div class="actions"><button type="submit">Register app</button></div>
  </form>
</section>`,
  }
}

export const showOAuthApps: PageHandler = (context) =>
  render(context, {
    created:
      takeFlash<{ name: string; client_id: string; client_secret: string }>(
        context.services.config.appSecret,
        context.req,
        context.res,
        'oauth-app',
      ) ?? undefined,
  })

export const registerOAuthApp: PageHandler = async (context) => {
  const { form, attempt, caller } = context
  if (!caller.isAdmin) return render(context)
  const values = { name: form.get('name').trim(), redirect_uris: form.get('redirect_uris') }
  const uris = [
    ...new Set(
      values.redirect_uris
        .split(/\r?\n/)
        .map((line) => line.trim())
        .filter((line) => line !== ''),
    ),
  ]
  let error: string | null = null
  if (values.name === '') error = 'Enter a name for the app.'
  else if (values.name.length > 100) error = 'The name is too long (at most 100 characters).'
  else if (uris.length === 0) error = 'Enter at least one redirect URI.'
  else if (uris.length > 10) error = 'Enter at most 10 redirect URIs.'
  else error = uris.map(redirectUriProblem).find((problem) => problem !== null) ?? null
  if (error) return render(context, { values, error: error.endsWith('.') ? error : `${error}.` }, 422)

  const clientId = `crmapp_${randomBytes(16).toString('base64url')}`
  const clientSecret = `crmsec_${randomBytes(32).toString('base64url')}`
  const created = await attempt((scope) =>
    scope.db.query(sql.unsafe`
      insert into crm.oauth_apps (name, client_id, client_secret_hash, client_secret_last4, redirect_uris)
      values (${values.name}, ${clientId}, ${sql.binary(createHash('sha256').update(clientSecret).digest())}, ${clientSecret.slice(-4)}, ${sql.array(uris, 'text')})`),
  )
  if (!created.ok)
    return render(context, { values, error: `The app could not be registered: ${created.error.message}.` }, created.error.status)
  setFlash(context.services.config.appSecret, context.req, context.res, 'oauth-app', {
    name: values.name,
    client_id: clientId,
    client_secret: clientSecret,
  })
  return { redirect: '/oauth-apps' }
}

export const deleteOAuthApp: PageHandler = async ({ db, params }) => {
  if (!UUID_PATTERN.test(params.id ?? '')) throw new ApiError(404, 'not_found', 'Not found', 'No such app.')
  const deleted = await db.maybeOne(sql.type(IdRow)`
    delete from crm.oauth_apps where workspace_id = (select crm.current_workspace_id()) and id = ${params.id.toLowerCase()} returning id`)
  if (deleted === null) throw new ApiError(404, 'not_found', 'Not found', 'No such app.')
  return { redirect: '/oauth-apps' }
}
