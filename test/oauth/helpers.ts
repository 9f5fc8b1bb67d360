// What the OAuth tests share: an app registered through the API, a browser session made in SQL,
// the consent driven over plain HTTP (the browser test clicks it in Chromium instead), PKCE pairs.
import { createHash, randomBytes } from 'node:crypto'
import { mintToken, withOwner } from '../helpers/fixtures.ts'
import type { TestServer } from '../helpers/server.ts'

export type App = { id: string; client_id: string; client_secret?: string; redirect_uris: string[]; confidential: boolean }

export async function registerApp(
  server: TestServer,
  adminToken: string,
  options: { name?: string; redirect_uris?: string[]; confidential?: boolean } = {},
): Promise<App> {
  const response = await server.request('POST', '/api/oauth-apps', {
    token: adminToken,
    body: {
      name: options.name ?? 'Mail merge',
      redirect_uris: options.redirect_uris ?? ['https://app.example/callback', 'http://127.0.0.1/callback'],
      confidential: options.confidential ?? true,
    },
  })
  if (response.status !== 201) throw new Error(`registering an app answered ${response.status}: ${response.text}`)
  return response.body.data
}

/** A browser session of the user (a session token in its cookie). */
export async function sessionCookie(server: TestServer, userId: string): Promise<string> {
  const token = await withOwner(server.databaseUrl, (client) => mintToken(client, userId, { kind: 'session' }))
  return `crm_session=${token}`
}

export function pkcePair(): { verifier: string; challenge: string } {
  const verifier = randomBytes(32).toString('base64url')
  return { verifier, challenge: createHash('sha256').update(verifier).digest('base64url') }
}

export type AuthorizeParameters = {
  client_id: string
  redirect_uri: string
  scope?: string
  state?: string
  code_challenge?: string
  code_challenge_method?: string
  response_type?: string
}

export function authorizePath(parameters: AuthorizeParameters): string {
  const search = new URLSearchParams({ response_type: 'code', code_challenge_method: 'S256', ...parameters } as Record<string, string>)
  for (const [name, value] of [...search]) if (value === '') search.delete(name)
  return `/oauth/authorize?${search}`
}

/** GET /oauth/authorize without following redirects. */
export async function authorize(server: TestServer, parameters: AuthorizeParameters, cookie?: string): Promise<Response> {
  return fetch(server.url + authorizePath(parameters), { redirect: 'manual', headers: cookie ? { cookie } : {} })
}

/** The consent page's answer (Allow or Deny) over plain HTTP: the Location the browser would follow. */
export async function consent(
  server: TestServer,
  cookie: string,
  parameters: AuthorizeParameters,
  decision: 'allow' | 'deny' = 'allow',
): Promise<URL> {
  const page = await authorize(server, parameters, cookie)
  const text = await page.text()
  if (page.status !== 200) throw new Error(`the consent page answered ${page.status}: ${text.slice(0, 300)}`)
  const form = new URLSearchParams()
  for (const match of text.matchAll(/<input type="hidden" name="([a-z_]+)" value="([^"]*)">/g)) {
    form.append(
      match[1],
      match[2].replaceAll('&amp;', '&').replaceAll('&quot;', '"').replaceAll('&#39;', "'").replaceAll('&lt;', '<').replaceAll('&gt;', '>'),
    )
  }
  form.append('decision', decision)
  const answer = await fetch(`${server.url}/oauth/authorize`, {
    method: 'POST',
    redirect: 'manual',
    headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
    body: form,
  })
  const location = answer.headers.get('location')
  if (answer.status !== 303 || !location) throw new Error(`the consent answered ${answer.status}: ${(await answer.text()).slice(0, 300)}`)
  return new URL(location)
}

/** POST /oauth/token (or /oauth/revoke) with a form, as an OAuth client sends it. */
export async function tokenRequest(
  server: TestServer,
  form: Record<string, string>,
  options: { path?: string; basic?: [string, string] } = {},
): Promise<{ status: number; body: any; headers: Headers }> {
  const headers: Record<string, string> = { 'content-type': 'application/x-www-form-urlencoded' }
  if (options.basic) {
    const [id, secret] = options.basic.map((part) => encodeURIComponent(part))
    headers.authorization = `Basic ${Buffer.from(`${id}:${secret}`).toString('base64')}`
  }
  const response = await fetch(server.url + (options.path ?? '/oauth/token'), { method: 'POST', headers, body: new URLSearchParams(form) })
  const text = await response.text()
  return { status: response.status, body: text ? JSON.parse(text) : null, headers: response.headers }
}

/** A code for the app, consented over HTTP. */
export async function codeFor(
  server: TestServer,
  cookie: string,
  app: App,
  options: { scope?: string; redirect_uri?: string } = {},
): Promise<{ code: string; verifier: string; redirect_uri: string }> {
  const { verifier, challenge } = pkcePair()
  const redirect_uri = options.redirect_uri ?? app.redirect_uris[0]
  const location = await consent(server, cookie, {
    client_id: app.client_id,
    redirect_uri,
    scope: options.scope ?? 'contacts:read deals:read offline_access',
    state: 'xyz',
    code_challenge: challenge,
  })
  const code = location.searchParams.get('code')
  if (!code) throw new Error(`no code in ${location.search}`)
  return { code, verifier, redirect_uri }
}

/** The form fields that authenticate the app (client_secret_post, or a public client's id). */
export function clientFields(app: App): Record<string, string> {
  return app.client_secret ? { client_id: app.client_id, client_secret: app.client_secret } : { client_id: app.client_id }
}
