// How a signed-in page runs: the form is read and its CSRF token checked first, then one
// transaction authenticates the session cookie through crm.authenticate (so revocation,
// suspension and the rate limit apply as for API tokens) and runs the page as crm_api.
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Authenticator } from '../auth/authenticate.ts'
import type { Caller } from '../auth/caller.ts'
import { type DatabaseTransactionConnection, sql, transactionKeepingConnection } from '../db/pool.ts'
import { AuthenticationError, RateLimitedError, UnavailableError } from '../errors.ts'
import { CSV_BODY_LIMIT, type ReceivedFile } from '../http/body.ts'
import { sameClientAs } from '../http/client-address.ts'
import { type ApiError, toApiError } from '../http/problem.ts'
import type { RouteDefinition, Services } from '../http/route.ts'
import { type ReceivedUpload, receiveUpload } from '../http/upload-receipts.ts'
import { type ApiCall, apiCaller } from './api-calls.ts'
import { EMPTY_FORM, type Form, readForm } from './form.ts'
import { html, type SafeHtml } from './html.ts'
import { appPage, type Frame, redirect, requestPath, sendHtml, signedOutPage, type Workspace } from './layout.ts'
import { query as queryOf } from './request.ts'
import { clearCookie, csrfToken, csrfValid, hasSessionCookie, readCookie, SESSION_COOKIE, WORKSPACE_COOKIE } from './session.ts'

export type Attempt<T> = { ok: true; value: T } | { ok: false; error: ApiError }

export type PageContext = {
  req: IncomingMessage
  res: ServerResponse
  services: Services
  db: DatabaseTransactionConnection
  caller: Caller
  api: ApiCall
  frame: Frame
  form: Form
  params: Record<string, string>
  query: URLSearchParams
  /** An upload page's body, received whole into a temporary file (signedInPage's `upload` option). */
  bodyFile?: ReceivedFile
  /** Runs a change in a savepoint (use the db and api it passes): a refusal comes back as a value and the page still renders. */
  attempt: <T>(fn: (scope: { db: DatabaseTransactionConnection; api: ApiCall }) => Promise<T>) => Promise<Attempt<T>>
}

/** `sent`: the handler wrote the response itself (a streamed export, an import's errors.csv). */
export type PageResult =
  | { redirect: string }
  | { sent: true }
  | { status?: number; title: string; content: SafeHtml; headers?: Record<string, string> }
export type PageHandler = (context: PageContext) => Promise<PageResult>

type Request = IncomingMessage & { params?: Record<string, string>; requestId?: string; callerId?: string }

export function errorPage(res: ServerResponse, status: number, message: string): void {
  sendHtml(
    res,
    status,
    signedOutPage(
      'Something went wrong',
      html`<h1>${status === 404 ? 'Not found' : 'Something went wrong'}</h1>
<div class="notice error" role="alert">${message}</div>
<p><a href="/">Back to the start page</a></p>`,
    ),
  )
}

/**
 * `upload`: the POST is a file (a multipart/form-data form, as the API's upload takes it), not a
 * form: its CSRF token comes in the query string and is checked before a byte of the body is read.
 */
export function signedInPage(
  services: Services,
  definitions: RouteDefinition[],
  authenticate: Authenticator,
  handler: PageHandler,
  options: { upload?: boolean } = {},
) {
  return async (incoming: IncomingMessage, res: ServerResponse): Promise<void> => {
    const req = incoming as Request
    const path = requestPath(req)
    const requestId = req.requestId ?? ''
    let upload: ReceivedUpload | undefined
    try {
      let form = EMPTY_FORM
      if (req.method === 'POST' && options.upload) {
        if (!hasSessionCookie(req)) return redirect(res, '/sign-in?notice=session-ended')
        if (!csrfValid(services.config.appSecret, req, queryOf(req).get('csrf') ?? undefined))
          return errorPage(res, 403, 'This form has expired. Reload the page and try again.')
        // Under the receipts of the API's uploads (per address, per process, the temporary files' cap).
        upload = await receiveUpload(services.uploadReceipts, req, {
          limit: CSV_BODY_LIMIT,
          idleTimeoutMs: services.config.bodyIdleTimeoutMs,
        })
      } else if (req.method === 'POST') {
        // Without a session there is nothing to post to: the form is not read.
        if (!hasSessionCookie(req)) return redirect(res, '/sign-in?notice=session-ended')
        // Read before the session is checked (the CSRF token is in it), under receipts of their own:
        // forms with a made-up cookie cannot hold those of sign-in or of the API's callers.
        form = await readForm(req, services, services.sessionFormReceipts)
        if (!csrfValid(services.config.appSecret, req, form.get('csrf'))) {
          if (!hasSessionCookie(req)) return redirect(res, '/sign-in?notice=session-ended')
          return errorPage(res, 403, 'This form has expired. Reload the page and try again.')
        }
      }
      if (!hasSessionCookie(req))
        return redirect(res, req.method === 'GET' ? `/sign-in?next=${encodeURIComponent(req.url ?? '/')}` : '/sign-in')

      const slug = readCookie(req, WORKSPACE_COOKIE)
      const authRequest = {
        headers: { cookie: req.headers.cookie, ...(slug ? { 'x-tenant-slug': slug } : {}) },
      } as unknown as IncomingMessage
      // The same client as the page's request: over https its cookies go by their prefixed names.
      sameClientAs(authRequest, req)
      const result = await transactionKeepingConnection(services.pool, async (db) => {
        const caller = await authenticate(db, authRequest, requestId)
        // Pages act with the user's whole authority (new tokens, two-factor, consent to an app):
        // only a session signed in here may. A personal or app token copied into the cookie is not one.
        if (caller.tokenKind !== 'session') throw new AuthenticationError('token_invalid', 'Sign in to use the pages')
        req.callerId = caller.userId
        const api = apiCaller(definitions, services, db, caller, req, res, requestId)
        const me = (await api('GET', '/api/me')).data as { user: { email: string; name: string }; role: { is_admin: boolean } }
        const workspaces = (await api('GET', '/api/workspaces')).data as Workspace[]
        const frame: Frame = {
          title: '',
          csrf: csrfToken(services.config.appSecret, req),
          path,
          user: me.user,
          isAdmin: me.role.is_admin,
          workspaces,
        }
        const attempt = async <T>(fn: (scope: { db: DatabaseTransactionConnection; api: ApiCall }) => Promise<T>): Promise<Attempt<T>> => {
          try {
            return {
              ok: true,
              value: await db.transaction(async (savepoint) =>
                fn({ db: savepoint, api: apiCaller(definitions, services, savepoint, caller, req, res, requestId) }),
              ),
            }
          } catch (error) {
            const apiError = toApiError(error)
            if (apiError.status >= 500) throw error
            return { ok: false, error: apiError }
          }
        }
        const query = queryOf(req)
        const outcome = await handler({
          req,
          res,
          services,
          db,
          caller,
          api,
          frame,
          form,
          params: req.params ?? {},
          query,
          attempt,
          bodyFile: upload?.file,
        })
        return { outcome, frame }
      }).catch(async (error: unknown) => {
        if (req.callerId && !(error instanceof RateLimitedError)) {
          await services.pool.query(sql.unsafe`select crm.count_request(${req.callerId})`).catch(() => {})
        }
        throw error
      })
      // A form's write holds the user's API reads to the primary until a standby has it (src/db/request/read-replicas.ts).
      if (req.method === 'POST' && req.callerId) await services.readRouting?.noteWrite(req.callerId)
      if ('redirect' in result.outcome) return redirect(res, result.outcome.redirect)
      if ('sent' in result.outcome) return
      result.frame.title = result.outcome.title
      sendHtml(res, result.outcome.status ?? 200, appPage(result.frame, result.outcome.content), result.outcome.headers)
    } catch (error) {
      const apiError = toApiError(error)
      if (apiError.status === 401) {
        clearCookie(req, res, SESSION_COOKIE)
        return redirect(res, '/sign-in?notice=session-ended')
      }
      if (apiError.code === 'workspace_not_found') {
        clearCookie(req, res, WORKSPACE_COOKIE)
        return redirect(res, req.method === 'GET' ? (req.url ?? '/') : '/')
      }
      if (apiError.status === 429) {
        return errorPage(res, 429, `Too many requests. Wait ${apiError.headers?.['Retry-After'] ?? 'a few'} seconds and try again.`)
      }
      // A bound of the process reached (uploads being received, their temporary files): busy, not broken.
      if (error instanceof UnavailableError && !error.cause) {
        res.setHeader('Retry-After', String(error.retryAfterSeconds))
        return errorPage(res, 503, `${error.message}.`)
      }
      if (apiError.status >= 500) {
        const cause = apiError.cause ?? error
        services.logger.error('page failed', {
          request_id: requestId,
          path,
          error: cause instanceof Error ? `${cause.name}: ${cause.message}` : String(cause),
          stack: cause instanceof Error ? cause.stack : undefined,
        })
        return errorPage(res, apiError.status, `Something went wrong on our side. Quote this reference if you report it: ${requestId}`)
      }
      return errorPage(res, apiError.status, apiError.message)
    } finally {
      await upload?.release()
    }
  }
}

/** Field problems of a refused API call, named by the form's labels, in plain words. */
export function describeRefusal(error: ApiError, labels: Record<string, string>): string {
  const fields = (error.errors ?? [])
    .map((problem) => labels[problem.pointer.split('/')[1] ?? ''] ?? null)
    .filter((label): label is string => label !== null)
  if (error.code === 'validation_failed' && fields.length > 0) return `Check ${[...new Set(fields)].join(' and ')}: ${error.message}.`
  return error.message.endsWith('.') ? error.message : `${error.message}.`
}
