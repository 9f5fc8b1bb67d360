// The API reference at /docs, rendered in the browser by Scalar's standalone bundle served from
// this process (node_modules/@scalar/api-reference, docs/decisions.md "The reference at /docs"),
// and one page per problem code at /problems/<code>, the `type` URI of every problem answer.
import { readFileSync } from 'node:fs'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type polka from 'polka'
import { PROBLEM_CODES } from '../http/problem-codes.ts'
import { html } from './html.ts'
import { SECURITY_HEADERS, sendHtml } from './layout.ts'

/** The bundle's folder: standalone.js and the chunks it imports on demand, all served from here. */
const BUNDLE_FOLDER = join(dirname(fileURLToPath(import.meta.resolve('@scalar/api-reference'))), 'browser')
const BUNDLE_FILE = /^(chunks\/)?[A-Za-z0-9._-]+\.js$/

/**
 * The page's policy: the service's own, but the renderer writes its styles into <style> elements,
 * so styles may be inline; scripts, fonts and connections stay on this origin.
 */
export const REFERENCE_HEADERS: Record<string, string> = {
  ...SECURITY_HEADERS,
  'Content-Security-Policy': SECURITY_HEADERS['Content-Security-Policy'].replace("style-src 'self'", "style-src 'self' 'unsafe-inline'"),
}

// Scalar's options: the document of this service, no fonts or proxy from scalar.com, no hosted
// API client or agent (the page's connect-src would refuse them anyway).
const START = `Scalar.createApiReference('#reference', ${JSON.stringify({
  url: '/api/openapi.json',
  withDefaultFonts: false,
  hideClientButton: true,
  agent: { disabled: true },
  telemetry: false,
  showDeveloperTools: 'never',
})})\n`

const PAGE = html`<html lang="en">
  <head>
    <meta charset="utf-8" />
    <meta name="viewport" content="width=device-width, initial-scale=1" />
    <title>CRM API reference</title>
  </head>
  <body>
    <div id="reference"></div>
    <script src="/docs/assets/standalone.js"></script>
    <script src="/docs/start.js"></script>
  </body>
</html>`

function sendScript(res: ServerResponse, body: string | Buffer, maxAge: number): void {
  for (const [name, value] of Object.entries(SECURITY_HEADERS)) res.setHeader(name, value)
  res.setHeader('Content-Type', 'text/javascript; charset=utf-8')
  res.setHeader('Cache-Control', `public, max-age=${maxAge}`)
  res.setHeader('Content-Length', Buffer.byteLength(body))
  res.end(body)
}

function notFound(res: ServerResponse): void {
  sendHtml(res, 404, html`<title>Not found</title><p>Not found. The API reference is at <a href="/docs">/docs</a>.</p>`)
}

/** The page of one problem code: what it means, what to do, and the others beside it. */
function problemPage(code: string): ReturnType<typeof html> | null {
  const entry = Object.hasOwn(PROBLEM_CODES, code) ? PROBLEM_CODES[code] : undefined
  if (!entry) return null
  return html`<html lang="en">
  <head><meta charset="utf-8" /><title>${code} (${entry.status}): CRM API</title></head>
  <body>
    <h1><code>${code}</code></h1>
    <p>HTTP status ${entry.status}.</p>
    <h2>What it means</h2>
    <p>${entry.means}</p>
    <h2>What to do</h2>
    <p>${entry.todo}</p>
    <p>Every problem answer carries <code>request_id</code>: quote it when you ask for help. The whole reference: <a href="/docs">/docs</a>.</p>
    <h2>Every code</h2>
    <ul>${Object.entries(PROBLEM_CODES).map(([other, { status }]) => html`<li><a href="/problems/${other}">${other}</a> (${status})</li>`)}</ul>
  </body>
</html>`
}

export function registerReference(app: ReturnType<typeof polka>): void {
  app.get('/docs', async (_req: IncomingMessage, res: ServerResponse) => sendHtml(res, 200, PAGE, REFERENCE_HEADERS))
  app.get('/docs/start.js', async (_req: IncomingMessage, res: ServerResponse) => sendScript(res, START, 300))
  app.get('/docs/assets/*', async (req: IncomingMessage & { params?: Record<string, string> }, res: ServerResponse) => {
    const file = req.params?.['*'] ?? ''
    if (!BUNDLE_FILE.test(file)) return notFound(res)
    let body: Buffer
    try {
      body = readFileSync(join(BUNDLE_FOLDER, file))
    } catch {
      return notFound(res)
    }
    // The bundle's files change only with the package's version: a day's cache.
    sendScript(res, body, 86_400)
  })
  app.get('/problems/:code', async (req: IncomingMessage & { params?: Record<string, string> }, res: ServerResponse) => {
    const page = problemPage(req.params?.code ?? '')
    if (!page) return notFound(res)
    sendHtml(res, 200, page)
  })
}
