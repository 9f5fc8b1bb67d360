// The web UI's routes, registered on the API's polka app (createApp's `pages` hook): server-
// rendered pages, forms that post and redirect, one stylesheet and one small script.
import { readFileSync } from 'node:fs'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type polka from 'polka'
import { createAuthenticator } from '../auth/authenticate.ts'
import { toApiError } from '../http/problem.ts'
import type { RouteDefinition, Services } from '../http/route.ts'
import { RECORD_TYPES } from '../records/fields.ts'
import { requestPath, SECURITY_HEADERS, safeReturnPath } from './layout.ts'
import { errorPage, type PageHandler, signedInPage } from './page-context.ts'
import { showAuditLog } from './pages/audit-log.ts'
import { authorizationEndpoint, decideConsent, showConsent } from './pages/authorize.ts'
import { moveDeal, showDealBoard } from './pages/deal-board.ts'
import { downloadErrors, showImport, showImports, startImport, uploadImport } from './pages/import-wizard.ts'
import { changeRole, inviteMember, showMembers, suspension, withdrawInvitation } from './pages/members.ts'
import { deleteOAuthApp, registerOAuthApp, revokeOAuthApp, showOAuthApps } from './pages/oauth-apps.ts'
import {
  changeAssociation,
  confirmDelete,
  createFromForm,
  deleteFromForm,
  exportList,
  notFoundInLayout,
  showEditForm,
  showList,
  showNewForm,
  showRecord,
  updateFromForm,
} from './pages/records.ts'
import { createRole, deleteRole, showRole, showRoles, updateRole } from './pages/roles.ts'
import {
  confirmTwoFactor,
  createToken,
  disableTwoFactor,
  revokeAll,
  revokeToken,
  showRecoveryCodes,
  showSecurity,
  showTwoFactor,
  startTwoFactor,
} from './pages/security.ts'
import { signInPages } from './pages/sign-in.ts'
import { signUpPages } from './pages/sign-up.ts'
import { createTeam, deleteTeam, renameTeam, showTeams, teamMembership } from './pages/teams.ts'
import { recoverDeliveries, redeliverDelivery, sendTestEvent, showDeliveries, showDelivery } from './pages/webhook-deliveries.ts'
import { showEvents } from './pages/webhook-events.ts'
import { changeWebhook, createWebhook, showWebhooks } from './pages/webhooks.ts'
import { registerReference } from './reference.ts'
import { clearCookie, SESSION_COOKIE, sessionCredential, setCookie, WORKSPACE_COOKIE } from './session.ts'

type Handler = (req: IncomingMessage, res: ServerResponse) => Promise<void>

function asset(file: string, type: string): Handler {
  const body = readFileSync(new URL(file, import.meta.url))
  return async (_req, res) => {
    for (const [name, value] of Object.entries(SECURITY_HEADERS)) res.setHeader(name, value)
    res.setHeader('Content-Type', type)
    res.setHeader('Cache-Control', 'public, max-age=300')
    res.setHeader('Content-Length', body.length)
    res.end(body)
  }
}

// Everyone, admins too, lands on the records (docs/api.md section 12).
const home: PageHandler = async () => ({ redirect: '/contacts' })

const switchWorkspace: PageHandler = async ({ form, frame, req, res }) => {
  const slug = form.get('workspace')
  const target = frame.workspaces.find((workspace) => workspace.slug === slug)
  if (target) setCookie(req, res, WORKSPACE_COOKIE, target.slug, { maxAgeSeconds: 400 * 86_400 })
  // Pages of the previous workspace (a webhook's id) mean nothing in the next one: go to the section.
  const section = safeReturnPath(form.get('return_to'), '/').split('/').slice(0, 2).join('/') || '/'
  return { redirect: section }
}

const signOut: PageHandler = async ({ api, caller, req, res }) => {
  await api('DELETE', '/api/tokens/:id', { params: { id: caller.tokenId } })
  clearCookie(req, res, SESSION_COOKIE)
  return { redirect: '/sign-in?notice=signed-out' }
}

export function registerPages(app: ReturnType<typeof polka>, services: Services, definitions: RouteDefinition[]): void {
  const authenticate = createAuthenticator(services.config, sessionCredential)
  const page = (handler: PageHandler) => signedInPage(services, definitions, authenticate, handler)
  // Handlers outside a signed-in page still answer in HTML, never with a problem+json.
  const guard =
    (handler: Handler): Handler =>
    async (req, res) => {
      try {
        await handler(req, res)
      } catch (error) {
        const apiError = toApiError(error)
        // The path without its query: an invitation link's query is its secret.
        if (apiError.status >= 500)
          services.logger.error('page failed', { path: requestPath(req), error: error instanceof Error ? error.message : String(error) })
        if (apiError.status === 429 && apiError.headers?.['Retry-After']) res.setHeader('Retry-After', apiError.headers['Retry-After'])
        errorPage(res, apiError.status, apiError.status >= 500 ? 'Something went wrong on our side. Try again shortly.' : apiError.message)
      }
    }
  // Pages that check a password, a code or an invitation's secret count against the per-address limit.
  const limited =
    (handler: Handler): Handler =>
    async (req, res) => {
      services.addressRateLimit(req)
      await handler(req, res)
    }
  const signIn = signInPages(services)
  const signUp = signUpPages(services, definitions)

  app.get('/ui/style.css', asset('./style.css', 'text/css; charset=utf-8'))
  app.get('/ui/app.js', asset('./app.js', 'text/javascript; charset=utf-8'))
  // The deal board's drag and drop: SortableJS as published, from our own origin (the CSP allows no other).
  app.get('/ui/sortable.js', asset(import.meta.resolve('sortablejs'), 'text/javascript; charset=utf-8'))
  app.get('/ui/board.js', asset('./board.js', 'text/javascript; charset=utf-8'))
  registerReference(app)

  app.get('/sign-in', guard(signIn.showPassword))
  app.post('/sign-in', guard(limited(signIn.submitPassword)))
  app.get('/sign-in/two-factor', guard(signIn.showCode))
  app.post('/sign-in/two-factor', guard(limited(signIn.submitCode)))
  app.post('/sign-out', page(signOut))
  app.get('/sign-up', guard(signUp.showSignUp))
  app.post('/sign-up', guard(limited(signUp.submitSignUp)))
  app.get('/invitations/accept', guard(limited(signUp.showAccept)))
  app.post('/invitations/accept', guard(limited(signUp.submitAccept)))

  app.get('/', page(home))

  // The deal board and the import wizard. Static paths: they must be registered before the
  // records' `/:type/:id` routes, which would otherwise take `board` and `import` for an id.
  app.get('/deals/board', page(showDealBoard))
  app.post('/deals/board/:id/move', page(moveDeal))
  app.get('/:type/import', page(showImports))
  app.post('/:type/import', signedInPage(services, definitions, authenticate, uploadImport, { upload: true }))
  app.get('/:type/import/:id', page(showImport))
  app.post('/:type/import/:id', page(startImport))
  app.get('/:type/import/:id/errors.csv', page(downloadErrors))
  app.post('/workspace', page(switchWorkspace))

  app.get('/webhooks', page(showWebhooks))
  app.post('/webhooks', page(createWebhook))
  app.post('/webhooks/:id/pause', page(changeWebhook('pause')))
  app.post('/webhooks/:id/resume', page(changeWebhook('resume')))
  app.get('/webhooks/events', page(showEvents))
  app.get('/webhooks/:id/deliveries', page(showDeliveries))
  app.get('/webhooks/:id/deliveries/:delivery_id', page(showDelivery))
  app.post('/webhooks/:id/deliveries/:delivery_id/redeliver', page(redeliverDelivery))
  app.post('/webhooks/:id/test', page(sendTestEvent))
  app.post('/webhooks/:id/recover', page(recoverDeliveries))

  app.get('/security', page(showSecurity))
  app.post('/security/tokens', page(createToken))
  app.post('/security/tokens/revoke-all', page(revokeAll))
  app.post('/security/tokens/:id/revoke', page(revokeToken))
  app.post('/security/two-factor/start', page(startTwoFactor))
  app.get('/security/two-factor', page(showTwoFactor))
  app.post('/security/two-factor/confirm', page(confirmTwoFactor))
  app.get('/security/two-factor/recovery-codes', page(showRecoveryCodes))
  app.post('/security/two-factor/disable', page(disableTwoFactor))

  app.get('/oauth/authorize', guard(authorizationEndpoint(services, page(showConsent))))
  app.post('/oauth/authorize', page(decideConsent(services.config.oauthCodeTtlSeconds)))

  app.get('/oauth-apps', page(showOAuthApps))
  app.post('/oauth-apps', page(registerOAuthApp))
  app.post('/oauth-apps/:id/revoke', page(revokeOAuthApp))
  app.post('/oauth-apps/:id/delete', page(deleteOAuthApp))

  app.get('/members', page(showMembers))
  app.post('/members/invite', page(inviteMember))
  app.post('/members/invitations/:id/withdraw', page(withdrawInvitation))
  app.post('/members/:user_id/role', page(changeRole))
  app.post('/members/:user_id/suspend', page(suspension('suspend')))
  app.post('/members/:user_id/unsuspend', page(suspension('unsuspend')))

  app.get('/roles', page(showRoles))
  app.post('/roles', page(createRole))
  app.get('/roles/:id', page(showRole))
  app.post('/roles/:id', page(updateRole))
  app.post('/roles/:id/delete', page(deleteRole))

  app.get('/teams', page(showTeams))
  app.get('/audit-log', page(showAuditLog))
  app.post('/teams', page(createTeam))
  app.post('/teams/:id/rename', page(renameTeam))
  app.post('/teams/:id/delete', page(deleteTeam))
  app.post('/teams/:id/members', page(teamMembership('add')))
  app.post('/teams/:id/members/:user_id/remove', page(teamMembership('remove')))

  // Contacts, companies and deals: after every other UI route. Static paths under a type
  // (`new`, `export`, and the board's and the import wizard's `board` and `import`) must be
  // registered before `/:type/:id`, or the record page would take them as an id.
  for (const type of RECORD_TYPES) {
    const base = `/${type.path}`
    app.get(base, page(showList(type.path)))
    app.post(`${base}/export`, page(exportList(type.path)))
    app.get(`${base}/new`, page(showNewForm(type.path)))
    app.post(`${base}/new`, page(createFromForm(type.path)))
    app.get(`${base}/:id`, page(notFoundInLayout(showRecord(type.path))))
    app.get(`${base}/:id/edit`, page(notFoundInLayout(showEditForm(type.path))))
    app.post(`${base}/:id/edit`, page(updateFromForm(type.path)))
    app.get(`${base}/:id/delete`, page(notFoundInLayout(confirmDelete(type.path))))
    app.post(`${base}/:id/delete`, page(deleteFromForm(type.path)))
    app.post(`${base}/:id/associations`, page(changeAssociation(type.path)))
  }
}
