// The page frame (header, navigation, workspace switcher), small shared pieces, and the response
// helpers that put the security headers on every page.
import type { IncomingMessage, ServerResponse } from 'node:http'
import { html, type SafeHtml } from './html.ts'

export type Workspace = { slug: string; name: string; role: string; plan: string; current: boolean }

export type Frame = {
  title: string
  csrf: string
  path: string
  user: { email: string; name: string }
  isAdmin: boolean
  workspaces: Workspace[]
}

export const SECURITY_HEADERS: Record<string, string> = {
  'Content-Security-Policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  'X-Frame-Options': 'DENY',
  'X-Content-Type-Options': 'nosniff',
  'Referrer-Policy': 'same-origin',
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Permissions-Policy': 'camera=(), microphone=(), geolocation=()',
}

export function sendHtml(res: ServerResponse, status: number, body: SafeHtml, headers: Record<string, string> = {}): void {
  const text = '<!doctype html>\n' + body.text
  res.statusCode = status
  for (const [name, value] of Object.entries({ ...SECURITY_HEADERS, ...headers })) res.setHeader(name, value)
  res.setHeader('Cache-Control', 'no-store')
  res.setHeader('Content-Type', 'text/html; charset=utf-8')
  res.setHeader('Content-Length', Buffer.byteLength(text))
  res.end(text)
}

/**
 * The security headers with a form-action that also allows `origin`: browsers apply form-action
 * to the redirects that follow a form post, and the OAuth consent form's answer redirects to the app.
 */
export function allowingFormRedirectTo(origin: string): Record<string, string> {
  return {
    'Content-Security-Policy': SECURITY_HEADERS['Content-Security-Policy'].replace("form-action 'self'", `form-action 'self' ${origin}`),
  }
}

/** 303 after a form post, so reloading the next page does not post again. */
export function redirect(res: ServerResponse, location: string): void {
  for (const [name, value] of Object.entries(SECURITY_HEADERS)) res.setHeader(name, value)
  res.statusCode = 303
  res.setHeader('Location', location)
  res.setHeader('Cache-Control', 'no-store')
  res.end()
}

/** Any origin of our own: a return path is kept only when it resolves to this origin. */
const RETURN_PATH_BASE = new URL('http://return-path.invalid/')

// Browsers drop tabs and line breaks from a URL and read \ as /, so "/\t/evil.example" and
// "/\\evil.example" mean //evil.example; none of these belong in a path of ours.
const NOT_IN_A_PATH = /[\u0000-\u001f\u007f\\]/

/**
 * Only same-origin paths, so a `next` parameter cannot send the browser elsewhere: the value is
 * parsed against a base URL and kept only when it stays on that origin, and refused when its
 * percent-decoded form would leave it (%2F%2F, %5C, encoded line breaks).
 */
export function safeReturnPath(value: string | undefined | null, fallback = '/'): string {
  if (!value?.startsWith('/') || value.startsWith('//') || NOT_IN_A_PATH.test(value)) return fallback
  let url: URL
  let decodedPath: string
  try {
    url = new URL(value, RETURN_PATH_BASE)
    decodedPath = decodeURIComponent(url.pathname)
  } catch {
    return fallback
  }
  if (url.origin !== RETURN_PATH_BASE.origin || decodedPath.startsWith('//') || NOT_IN_A_PATH.test(decodedPath)) return fallback
  return `${url.pathname}${url.search}${url.hash}`
}

function head(title: string): SafeHtml {
  return html`<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title} · CRM</title>
<link rel="stylesheet" href="/ui/style.css">
<script src="/ui/app.js" defer></script>
</head>`
}

export function signedOutPage(title: string, content: SafeHtml): SafeHtml {
  return html`<html lang="en">
${head(title)}
<body>
<a class="skip" href="#main">Skip to content</a>
<header class="top"><div class="bar"><a class="brand" href="/">CRM</a></div></header>
<main id="main" class="narrow">
${content}
</main>
</body>
</html>`
}

export function appPage(frame: Frame, content: SafeHtml): SafeHtml {
  // Records first: every member works with them; the administration pages follow.
  const links = [
    { href: '/contacts', label: 'Contacts' },
    { href: '/companies', label: 'Companies' },
    { href: '/deals', label: 'Deals' },
    ...(frame.isAdmin
      ? [
          { href: '/members', label: 'Members' },
          { href: '/roles', label: 'Roles' },
          { href: '/teams', label: 'Teams' },
          { href: '/webhooks', label: 'Webhooks' },
          { href: '/oauth-apps', label: 'OAuth apps' },
          { href: '/audit-log', label: 'Audit log' },
        ]
      : []),
    { href: '/security', label: 'Security' },
  ]
  const current = frame.workspaces.find((workspace) => workspace.current)
  return html`<html lang="en">
${head(frame.title)}
<body>
<a class="skip" href="#main">Skip to content</a>
<header class="top"><div class="bar">
  <a class="brand" href="/">CRM</a>
  <nav aria-label="Main"><ul>
    ${links.map((link) => html`<li><a href="${link.href}"${frame.path.startsWith(link.href) ? html` aria-current="page"` : ''}>${link.label}</a></li>`)}
  </ul></nav>
  <div class="who">
    ${
      frame.workspaces.length > 1
        ? html`<form method="post" action="/workspace">
      <input type="hidden" name="csrf" value="${frame.csrf}">
      <input type="hidden" name="return_to" value="${frame.path}">
      <label for="workspace-switch">Workspace</label>
      <select id="workspace-switch" name="workspace">
        ${frame.workspaces.map((workspace) => html`<option value="${workspace.slug}"${workspace.current ? html` selected` : ''}>${workspace.name}</option>`)}
      </select>
      <button class="small secondary" type="submit">Switch</button>
    </form>`
        : html`<span>${current?.name ?? ''}</span>`
    }
    <span>${frame.user.email}</span>
    <form method="post" action="/sign-out">
      <input type="hidden" name="csrf" value="${frame.csrf}">
      <button class="small secondary" type="submit">Sign out</button>
    </form>
  </div>
</div></header>
<main id="main">
${content}
</main>
</body>
</html>`
}

export function errorNotice(message: string | null | undefined): SafeHtml {
  return message ? html`<div class="notice error" role="alert">${message}</div>` : html``
}

/** A value shown once (a secret, a token), with a copy button that needs JavaScript. */
export function shownOnce(id: string, label: string, value: string): SafeHtml {
  return html`<div class="field">
    <label for="${id}">${label}</label>
    <div class="once">
      <input type="text" id="${id}" value="${value}" readonly spellcheck="false" autocomplete="off">
      <button type="button" class="secondary" data-copy="${id}" hidden>Copy</button>
    </div>
    <span id="${id}-status" class="muted" role="status"></span>
  </div>`
}

/** `2026-11-22 03:00 UTC` in a <time> element; a dash for null. */
export function when(value: string | null | undefined, fallback = '—'): SafeHtml {
  if (!value) return html`${fallback}`
  const date = new Date(value)
  if (Number.isNaN(date.getTime())) return html`${value}`
  return html`<time datetime="${date.toISOString()}">${date.toISOString().slice(0, 16).replace('T', ' ')} UTC</time>`
}

export function hiddenCsrf(csrf: string): SafeHtml {
  return html`<input type="hidden" name="csrf" value="${csrf}">`
}

export function requestPath(req: IncomingMessage): string {
  return (req.url ?? '/').split('?')[0]
}
