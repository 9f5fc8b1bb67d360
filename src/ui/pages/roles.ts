// Roles (admins): every role of the workspace, and a grid of resource × action with a scope
// (none / own / team / all) per cell to create a custom role or change one. Built-in roles are
// shown read-only. The grid becomes the `grants` list of /api/roles, whose handlers (and the
// database's triggers) decide what is allowed: a built-in role is never changed, a role in use
// is not deleted.
import { ApiError } from '../../http/problem.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf } from '../layout.ts'
import type { PageContext, PageHandler, PageResult } from '../page-context.ts'
import { setFlash, takeFlash } from '../session.ts'
import { adminOnly, plainRefusal } from './admin-common.ts'

type Role = { id: string; name: string; is_admin: boolean; is_builtin: boolean; grants: string[]; member_count: number }

export const RESOURCES = [
  { value: 'contacts', label: 'Contacts' },
  { value: 'companies', label: 'Companies' },
  { value: 'deals', label: 'Deals' },
] as const
export const ACTIONS = [
  { value: 'view', label: 'View' },
  { value: 'create', label: 'Create' },
  { value: 'update', label: 'Update' },
  { value: 'delete', label: 'Delete' },
  { value: 'import', label: 'Import' },
  { value: 'export', label: 'Export' },
] as const
const SCOPES = [
  { value: 'none', label: 'None' },
  { value: 'own', label: 'Own' },
  { value: 'team', label: 'Team' },
  { value: 'all', label: 'All' },
] as const

type Values = { name: string; is_admin: boolean; grants: string[] }
type State = { values?: Values; error?: string }

const LABELS = { name: 'the name', grants: 'the permissions', is_admin: 'the admin choice' }

function scopeOf(grants: string[], resource: string, action: string): string {
  return grants.find((grant) => grant.startsWith(`${resource}:${action}:`))?.split(':')[2] ?? 'none'
}

/** The grid: one scope choice per resource and action; read-only for built-in roles. */
function grid(prefix: string, grants: string[], editable: boolean): SafeHtml {
  return html`<div class="table-scroll"><table class="grid">
  <caption class="sr-only">Permissions: which records of each kind this role may use, per action</caption>
  <thead><tr><th scope="col">Resource</th>${ACTIONS.map((action) => html`<th scope="col">${action.label}</th>`)}</tr></thead>
  <tbody>
  ${RESOURCES.map(
    (resource) => html`<tr>
    <th scope="row">${resource.label}</th>
    ${ACTIONS.map((action) => {
      const scope = scopeOf(grants, resource.value, action.value)
      const id = `${prefix}-${resource.value}-${action.value}`
      if (!editable) return html`<td class="scope-${scope}">${SCOPES.find((choice) => choice.value === scope)?.label ?? scope}</td>`
      return html`<td class="scope-${scope}">
      <label class="sr-only" for="${id}">${resource.label}: ${action.label.toLowerCase()}</label>
      <select id="${id}" name="grant-${resource.value}-${action.value}">
        ${SCOPES.map((choice) => html`<option value="${choice.value}"${choice.value === scope ? html` selected` : ''}>${choice.label}</option>`)}
      </select>
    </td>`
    })}
  </tr>`,
  )}
  </tbody>
</table></div>
<p class="hint muted">Own: records the member owns. Team: records owned by anyone sharing a team with them. All: every record of the workspace.${
    editable ? ' For Create and Import, the scope says whose records the member may create.' : ''
  }</p>`
}

function roleForm(csrf: string, action: string, prefix: string, values: Values, submit: string): SafeHtml {
  return html`<form class="stack" method="post" action="${action}">
  ${hiddenCsrf(csrf)}
  <div class="field">
    <label for="${prefix}-name">Name</label>
    <input type="text" id="${prefix}-name" name="name" value="${values.name}" maxlength="63" pattern="[a-z][a-z0-9_]*" required aria-describedby="${prefix}-name-hint">
    <span class="hint" id="${prefix}-name-hint">Lower-case letters, digits and _, starting with a letter (for example sales_rep).</span>
  </div>
  ${grid(prefix, values.grants, true)}
  <label class="check"><input type="checkbox" name="is_admin" value="on"${values.is_admin ? html` checked` : ''}> Admin: may also manage members, roles, teams, invitations and webhooks</label>
  <div class="actions"><button type="submit">${submit}</button></div>
</form>`
}

/** The grid's choices as API grants (cells left at None grant nothing). */
function valuesOf(context: PageContext): Values {
  const { form } = context
  const grants: string[] = []
  for (const resource of RESOURCES) {
    for (const action of ACTIONS) {
      const scope = form.get(`grant-${resource.value}-${action.value}`)
      if (scope === 'own' || scope === 'team' || scope === 'all') grants.push(`${resource.value}:${action.value}:${scope}`)
    }
  }
  return { name: form.get('name').trim(), is_admin: form.get('is_admin') === 'on', grants }
}

function roleKind(role: Role): SafeHtml {
  return html`${role.is_builtin ? html`<span class="tag">built-in</span>` : html`<span class="tag">custom</span>`}${role.is_admin ? html` <span class="tag">admin</span>` : ''}`
}

async function renderList(context: PageContext, state: State, status = 200): Promise<PageResult> {
  const denied = adminOnly(context, 'Roles', 'roles')
  if (denied) return denied
  const { api, frame, services, req, res } = context
  const roles = (await api('GET', '/api/roles')).data as Role[]
  const notice = takeFlash<string>(services.config.appSecret, req, res, 'roles')
  return {
    status,
    title: 'Roles',
    content: html`<h1>Roles</h1>
<p class="lead">A role says which contacts, companies and deals its members may view, create, update, delete, import and export.</p>
${notice ? html`<div class="notice success" role="status">${notice}</div>` : ''}
<section aria-labelledby="roles-heading">
  <h2 id="roles-heading">Roles of this workspace</h2>
  <table>
    <thead><tr><th scope="col">Role</th><th scope="col">Kind</th><th scope="col">Members</th><th scope="col">Permissions</th></tr></thead>
    <tbody>
    ${roles.map(
      (role) => html`<tr>
      <th scope="row"><a href="/roles/${role.id}">${role.name}</a></th>
      <td>${roleKind(role)}</td>
      <td>${role.member_count}</td>
      <td class="grants">${role.grants.length ? role.grants.map((grant) => html`<code>${grant}</code> `) : html`<span class="muted">none</span>`}</td>
    </tr>`,
    )}
    </tbody>
  </table>
</section>
<section class="panel" aria-labelledby="new-role">
  <h2 id="new-role">New role</h2>
  ${errorNotice(state.error)}
  ${roleForm(frame.csrf, '/roles', 'new-role', state.values ?? { name: '', is_admin: false, grants: [] }, 'Create role')}
</section>`,
  }
}

async function renderRole(context: PageContext, state: State, status = 200): Promise<PageResult> {
  const denied = adminOnly(context, 'Roles', 'roles')
  if (denied) return denied
  const { api, frame, params } = context
  const id = (params.id ?? '').toLowerCase()
  if (!UUID_PATTERN.test(id)) throw new ApiError(404, 'not_found', 'Not found', 'No such role.')
  const role = (await api('GET', '/api/roles/:id', { params: { id } })).data as Role
  const title = `Role ${role.name}`
  return {
    status,
    title,
    content: html`<p><a href="/roles">← All roles</a></p>
<h1>${title}</h1>
<p class="lead">${roleKind(role)} Held by ${role.member_count} member${role.member_count === 1 ? '' : 's'}.</p>
${errorNotice(state.error)}
${
  role.is_builtin
    ? html`<section class="panel" aria-labelledby="grid-heading">
  <h2 id="grid-heading">Permissions</h2>
  ${role.is_admin ? html`<p>Admins have every permission on every record, and manage members, roles, teams, invitations and webhooks.</p>` : ''}
  ${grid('role', role.grants, false)}
  <p class="muted">Built-in roles cannot be changed. To adjust them, create a custom role on the <a href="/roles">Roles</a> page.</p>
</section>`
    : html`<section class="panel" aria-labelledby="grid-heading">
  <h2 id="grid-heading">Permissions</h2>
  ${roleForm(frame.csrf, `/roles/${role.id}`, 'role', state.values ?? { name: role.name, is_admin: role.is_admin, grants: role.grants }, 'Save role')}
</section>
<section aria-labelledby="delete-heading">
  <h2 id="delete-heading">Delete this role</h2>
  <form method="post" action="/roles/${role.id}/delete" class="actions">
    ${hiddenCsrf(frame.csrf)}
    <span class="muted">Only a role that no member or pending invitation holds can be deleted.</span>
    <button type="submit" class="danger">Delete role</button>
  </form>
</section>`
}`,
  }
}

export const showRoles: PageHandler = (context) => renderList(context, {})

export const showRole: PageHandler = (context) => renderRole(context, {})

export const createRole: PageHandler = async (context) => {
  const values = valuesOf(context)
  if (values.name === '') return renderList(context, { values, error: 'Enter a name for the role.' }, 422)
  const created = await context.attempt((scope) => scope.api('POST', '/api/roles', { body: values }))
  if (!created.ok) return renderList(context, { values, error: plainRefusal(created.error, LABELS) }, created.error.status)
  setFlash(
    context.services.config.appSecret,
    context.req,
    context.res,
    'roles',
    `Role ${values.name} created. Assign it on the Members page.`,
  )
  return { redirect: '/roles' }
}

export const updateRole: PageHandler = async (context) => {
  const values = valuesOf(context)
  const id = (context.params.id ?? '').toLowerCase()
  if (!UUID_PATTERN.test(id)) throw new ApiError(404, 'not_found', 'Not found', 'No such role.')
  if (values.name === '') return renderRole(context, { values, error: 'Enter a name for the role.' }, 422)
  const updated = await context.attempt((scope) => scope.api('PATCH', '/api/roles/:id', { params: { id }, body: values }))
  if (!updated.ok) return renderRole(context, { values, error: plainRefusal(updated.error, LABELS) }, updated.error.status)
  setFlash(
    context.services.config.appSecret,
    context.req,
    context.res,
    'roles',
    `Role ${values.name} saved. It applies on each member's next request.`,
  )
  return { redirect: '/roles' }
}

export const deleteRole: PageHandler = async (context) => {
  const id = (context.params.id ?? '').toLowerCase()
  if (!UUID_PATTERN.test(id)) throw new ApiError(404, 'not_found', 'Not found', 'No such role.')
  const deleted = await context.attempt((scope) => scope.api('DELETE', '/api/roles/:id', { params: { id } }))
  if (!deleted.ok) return renderRole(context, { error: plainRefusal(deleted.error, LABELS) }, deleted.error.status)
  setFlash(context.services.config.appSecret, context.req, context.res, 'roles', 'Role deleted.')
  return { redirect: '/roles' }
}
