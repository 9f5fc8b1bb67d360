// OAuth apps (admins): register an app with its redirect URIs, confidential (a client secret,
// shown once; only its SHA-256 is stored) or public; see who connected each app and revoke it for
// the whole workspace; delete it. Every change goes through the API's own route handlers
// (/api/oauth-apps), so the page and the API share validation and SQL.
import type { Connection, OAuthApp } from '../../oauth/apps.ts'
import { scopeWords } from '../../oauth/scopes.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf, shownOnce, when } from '../layout.ts'
import type { PageContext, PageHandler, PageResult } from '../page-context.ts'
import { setFlash, takeFlash } from '../session.ts'
import { adminOnly, plainRefusal } from './admin-common.ts'

const BASE = '/api/oauth-apps'
type Created = { name: string; client_id: string; client_secret: string | null }
type State = { values?: { name: string; redirect_uris: string; confidential: boolean }; error?: string; created?: Created; done?: string }

const DONE: Record<string, string> = {
  revoked: 'Revoked for the whole workspace: every connection of the app stopped at once.',
  deleted: 'Deleted: the app and every token issued to it are gone.',
}

function connectionList(connections: readonly Connection[]): SafeHtml {
  if (connections.length === 0) return html`<p class="muted">Nobody has connected this app.</p>`
  return html`<ul class="connections">${connections.map(
    (connection) =>
      html`<li><strong>${connection.user.name}</strong> <span class="muted">${connection.user.email}</span>
      · <span title="${connection.scopes.map((scope) => scopeWords(scope)).join('; ')}">${connection.scopes.join(' ')}</span>
      · connected ${when(connection.created_at)}</li>`,
  )}</ul>`
}

function appCard(app: OAuthApp, connections: readonly Connection[], csrf: string): SafeHtml {
  const headingId = `app-${app.id}`
  return html`<article class="card" aria-labelledby="${headingId}">
  <h3 id="${headingId}">${app.name}</h3>
  <dl class="stats">
    <dt>Client ID</dt><dd><code>${app.client_id}</code></dd>
    <dt>Type</dt><dd>${app.confidential ? 'Confidential (server)' : 'Public (native or browser app, no secret)'}</dd>
    ${app.client_secret_last4 ? html`<dt>Secret</dt><dd><span class="mono">…${app.client_secret_last4}</span></dd>` : ''}
    <dt>Redirect URIs</dt><dd>${app.redirect_uris.map((uri) => html`<div class="url">${uri}</div>`)}</dd>
    <dt>Created</dt><dd>${when(app.created_at)}</dd>
  </dl>
  <h4>Connected users (${connections.length})</h4>
  ${connectionList(connections)}
  <div class="actions">
    ${
      connections.length > 0
        ? html`<form method="post" action="/oauth-apps/${app.id}/revoke">
      ${hiddenCsrf(csrf)}
      <button type="submit" class="danger small" aria-label="Revoke ${app.name} for the whole workspace">Revoke for everyone</button>
    </form>`
        : ''
    }
    <form method="post" action="/oauth-apps/${app.id}/delete">
      ${hiddenCsrf(csrf)}
      <button type="submit" class="danger small" aria-label="Delete ${app.name}">Delete</button>
    </form>
  </div>
</article>`
}

async function render(context: PageContext, state: State = {}, status = 200): Promise<PageResult> {
  const gate = adminOnly(context, 'OAuth apps', 'OAuth apps')
  if (gate) return gate
  const { api, frame } = context
  const apps = ((await api('GET', BASE)) as { data: OAuthApp[] }).data
  const connections = await Promise.all(
    apps.map(async (app) => ((await api('GET', `${BASE}/:id/connections`, { params: { id: app.id } })) as { data: Connection[] }).data),
  )
  const values = state.values ?? { name: '', redirect_uris: '', confidential: true }
  return {
    status,
    title: 'OAuth apps',
    content: html`<h1>OAuth apps</h1>
<p class="lead">Apps that act for members of this workspace through OAuth 2.0, within the scopes each member allows.</p>
${state.done ? html`<div class="notice success" role="status">${state.done}</div>` : ''}
${
  state.created
    ? html`<section class="notice success" aria-labelledby="app-created-heading">
  <h2 id="app-created-heading">App “${state.created.name}” registered</h2>
  ${state.created.client_secret ? html`<p>Copy the client secret now: it is shown only once.</p>` : html`<p>A public app has no secret: it proves itself with PKCE.</p>`}
  ${shownOnce('new-client-id', 'Client ID', state.created.client_id)}
  ${state.created.client_secret ? shownOnce('new-client-secret', 'Client secret', state.created.client_secret) : ''}
</section>`
    : ''
}
<section aria-labelledby="apps-heading">
  <h2 id="apps-heading">Registered apps</h2>
  ${apps.length === 0 ? html`<p class="muted">No apps yet.</p>` : html`<div class="cards">${apps.map((app, index) => appCard(app, connections[index], frame.csrf))}</div>`}
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
      <span class="hint" id="app-redirect-uris-hint">One per line, up to 10. HTTPS, or http://127.0.0.1 (any port) for native apps.</span>
    </div>
    <div class="field">
      <label class="check"><input type="checkbox" name="public" value="on"${values.confidential ? '' : html` checked`} aria-describedby="app-public-hint"> Public app (native or browser, without a secret)</label>
      <span class="hint" id="app-public-hint">For native and browser apps, which cannot keep a secret; PKCE protects their codes.</span>
    </div>
    <div class="actions"><button type="submit">Register app</button></div>
  </form>
</section>`,
  }
}

export const showOAuthApps: PageHandler = (context) =>
  render(context, {
    done: DONE[context.query.get('done') ?? ''],
    created: takeFlash<Created>(context.services.config.appSecret, context.req, context.res, 'oauth-app') ?? undefined,
  })

export const registerOAuthApp: PageHandler = async (context) => {
  const { form, attempt } = context
  const values = { name: form.get('name').trim(), redirect_uris: form.get('redirect_uris'), confidential: !form.has('public') }
  const uris = [
    ...new Set(
      values.redirect_uris
        .split(/\r?\n/)
        .map((line) => line.trim())
        .filter((line) => line !== ''),
    ),
  ]
  if (values.name === '') return render(context, { values, error: 'Enter a name for the app.' }, 422)
  if (uris.length === 0) return render(context, { values, error: 'Enter at least one redirect URI.' }, 422)
  const created = await attempt((scope) =>
    scope.api('POST', BASE, { body: { name: values.name, redirect_uris: uris, confidential: values.confidential } }),
  )
  if (!created.ok) {
    const pointer = created.error.errors?.[0]?.pointer ?? ''
    const uri = /^\/redirect_uris\/(\d+)$/.exec(pointer)
    const error = uri
      ? `The redirect URI “${uris[Number(uri[1])]}” ${created.error.errors?.[0]?.message}.`
      : plainRefusal(created.error, { name: 'name', redirect_uris: 'redirect URIs' })
    return render(context, { values, error }, created.error.status)
  }
  const app = (created.value as { data: OAuthApp & { client_secret?: string } }).data
  setFlash(context.services.config.appSecret, context.req, context.res, 'oauth-app', {
    name: app.name,
    client_id: app.client_id,
    client_secret: app.client_secret ?? null,
  })
  return { redirect: '/oauth-apps' }
}

export const revokeOAuthApp: PageHandler = async ({ api, params }) => {
  if (!UUID_PATTERN.test(params.id ?? '')) return { redirect: '/oauth-apps' }
  await api('DELETE', `${BASE}/:id/connections`, { params: { id: params.id.toLowerCase() } })
  return { redirect: '/oauth-apps?done=revoked' }
}

export const deleteOAuthApp: PageHandler = async ({ api, params }) => {
  if (!UUID_PATTERN.test(params.id ?? '')) return { redirect: '/oauth-apps' }
  await api('DELETE', `${BASE}/:id`, { params: { id: params.id.toLowerCase() } })
  return { redirect: '/oauth-apps?done=deleted' }
}
