// Members (admins): the list with role, teams and status, the seat count, a role selector,
// Suspend / Unsuspend, and Invite member (the accept link is shown once to the admin; it is also
// mailed when SMTP_URL is set). Every change goes through the handlers of /api/members and
// /api/invitations, so the seat limit, the last-admin rule and the admin gate are theirs.
import { ApiError } from '../../http/problem.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import type { ApiCall } from '../api-calls.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf, shownOnce, when } from '../layout.ts'
import type { PageContext, PageHandler, PageResult } from '../page-context.ts'
import { setFlash, takeFlash } from '../session.ts'
import { adminOnly, plainRefusal } from './admin-common.ts'

export type Member = {
  user_id: string
  email: string
  name: string
  role: string
  teams: string[]
  suspended_at: string | null
  joined_at: string
}
type Seats = { used: number; limit: number | null }
type Invitation = { id: string; email: string; role: string; teams: string[]; status: 'pending' | 'expired'; expires_at: string }
type Role = { id: string; name: string; is_admin: boolean }
type Team = { id: string; name: string }

type Flash = { kind: 'invited'; email: string; accept_url: string } | { kind: 'notice'; message: string }
type State = { error?: string; invite?: { email: string; role: string; teams: string[] } }

function seatLine(seats: Seats): SafeHtml {
  return html`<p class="seats" id="seats">Seats: <strong>${seats.used}</strong> used of <strong>${seats.limit === null ? 'unlimited' : seats.limit}</strong>${
    seats.limit !== null && seats.used >= seats.limit ? html` <span class="badge paused">Full</span>` : ''
  }</p>`
}

function memberRow(member: Member, roles: Role[], csrf: string, self: string): SafeHtml {
  const suspended = member.suspended_at !== null
  const who = member.name || member.email
  return html`<tr>
  <th scope="row">${member.name}${member.user_id === self ? html` <span class="tag">you</span>` : ''}</th>
  <td>${member.email}</td>
  <td>
    <form class="inline" method="post" action="/members/${member.user_id}/role">
      ${hiddenCsrf(csrf)}
      <label class="sr-only" for="role-${member.user_id}">Role of ${who}</label>
      <select id="role-${member.user_id}" name="role">
        ${roles.map((role) => html`<option value="${role.name}"${role.name === member.role ? html` selected` : ''}>${role.name}</option>`)}
      </select>
      <button type="submit" class="secondary small" aria-label="Save role of ${who}">Save</button>
    </form>
  </td>
  <td>${member.teams.length ? member.teams.join(', ') : html`<span class="muted">—</span>`}</td>
  <td>${suspended ? html`<span class="badge paused">Suspended</span> <span class="muted small">since ${when(member.suspended_at)}</span>` : html`<span class="badge active">Active</span>`}</td>
  <td>
    <form method="post" action="/members/${member.user_id}/${suspended ? 'unsuspend' : 'suspend'}">
      ${hiddenCsrf(csrf)}
      <button type="submit" class="${suspended ? 'secondary' : 'danger'} small" aria-label="${suspended ? 'Unsuspend' : 'Suspend'} ${who}">${suspended ? 'Unsuspend' : 'Suspend'}</button>
    </form>
  </td>
</tr>`
}

function inviteForm(csrf: string, roles: Role[], teams: Team[], state: State): SafeHtml {
  const values = state.invite ?? { email: '', role: 'member', teams: [] }
  return html`<section class="panel" aria-labelledby="invite-heading">
  <h2 id="invite-heading">Invite member</h2>
  ${errorNotice(state.error)}
  <form class="stack" method="post" action="/members/invite">
    ${hiddenCsrf(csrf)}
    <div class="two-col">
      <div class="field">
        <label for="invite-email">Email</label>
        <input type="email" id="invite-email" name="email" value="${values.email}" maxlength="254" required>
      </div>
      <div class="field">
        <label for="invite-role">Role</label>
        <select id="invite-role" name="role">
          ${roles.map((role) => html`<option value="${role.name}"${role.name === values.role ? html` selected` : ''}>${role.name}</option>`)}
        </select>
      </div>
    </div>
    ${
      teams.length
        ? html`<fieldset class="checks"><legend>Teams</legend>
      ${teams.map((team) => html`<label><input type="checkbox" name="team-${team.id}" value="on"${values.teams.includes(team.id) ? html` checked` : ''}> ${team.name}</label>`)}
    </fieldset>`
        : html`<p class="muted">No teams yet: <a href="/teams">create teams</a> to add the new member to them.</p>`
    }
    <div class="actions"><button type="submit">Invite member</button></div>
  </form>
</section>`
}

function invitationsTable(invitations: Invitation[], csrf: string): SafeHtml {
  if (invitations.length === 0) return html`<p class="muted">No pending invitations.</p>`
  return html`<table>
  <thead><tr><th scope="col">Email</th><th scope="col">Role</th><th scope="col">Teams</th><th scope="col">Status</th><th scope="col"><span class="sr-only">Actions</span></th></tr></thead>
  <tbody>
  ${invitations.map(
    (invitation) => html`<tr>
    <th scope="row">${invitation.email}</th>
    <td>${invitation.role}</td>
    <td>${invitation.teams.join(', ') || html`<span class="muted">—</span>`}</td>
    <td>${invitation.status === 'expired' ? html`<span class="badge paused">Expired</span>` : html`Pending, expires ${when(invitation.expires_at)}`}</td>
    <td><form method="post" action="/members/invitations/${invitation.id}/withdraw">${hiddenCsrf(csrf)}<button type="submit" class="secondary small" aria-label="Withdraw invitation of ${invitation.email}">Withdraw</button></form></td>
  </tr>`,
  )}
  </tbody>
</table>`
}

async function render(context: PageContext, state: State, status = 200): Promise<PageResult> {
  const denied = adminOnly(context, 'Members', 'members')
  if (denied) return denied
  const { api, frame, caller, services, req, res, query } = context
  const listed = (await api('GET', '/api/members')) as { data: Member[]; seats: Seats }
  const roles = (await api('GET', '/api/roles')).data as Role[]
  const teams = (await api('GET', '/api/teams')).data as Team[]
  const invitations = (await api('GET', '/api/invitations')).data as Invitation[]
  const flash = takeFlash<Flash>(services.config.appSecret, req, res, 'members')
  const mailed = services.config.smtpUrl !== null
  return {
    status,
    title: 'Members',
    content: html`<h1>Members</h1>
<p class="lead">Who can use this workspace, with which role and in which teams.</p>
${query.get('welcome') ? html`<div class="notice success" role="status">Your workspace is ready. Invite the people you work with below.</div>` : ''}
${flash?.kind === 'notice' ? html`<div class="notice success" role="status">${flash.message}</div>` : ''}
${
  flash?.kind === 'invited'
    ? html`<section class="notice success" aria-labelledby="invited-heading">
  <h2 id="invited-heading">Invitation for ${flash.email} created</h2>
  <p>${mailed ? html`It was emailed to ${flash.email}. You can also send them this link yourself:` : html`Outgoing mail is not set up (SMTP_URL), so send this link to ${flash.email} yourself.`} It works once, within 7 days, and is shown only now.</p>
  ${shownOnce('accept-url', 'Accept link', flash.accept_url)}
</section>`
    : ''
}
${seatLine(listed.seats)}
<section aria-labelledby="members-heading">
  <h2 id="members-heading" class="sr-only">Member list</h2>
  <div class="table-scroll"><table class="members">
    <thead><tr><th scope="col">Name</th><th scope="col">Email</th><th scope="col">Role</th><th scope="col">Teams</th><th scope="col">Status</th><th scope="col"><span class="sr-only">Actions</span></th></tr></thead>
    <tbody>${listed.data.map((member) => memberRow(member, roles, frame.csrf, caller.userId))}</tbody>
  </table></div>
</section>
${inviteForm(frame.csrf, roles, teams, state)}
<section aria-labelledby="invitations-heading">
  <h2 id="invitations-heading">Pending invitations</h2>
  ${invitationsTable(invitations, frame.csrf)}
</section>`,
  }
}

export const showMembers: PageHandler = (context) => render(context, {})

export const inviteMember: PageHandler = async (context) => {
  const { form, attempt, api, req, services, res } = context
  // One checkbox per team (named team-<id>), so the form needs no repeated fields.
  const allTeams = (await api('GET', '/api/teams')).data as Team[]
  const teams = allTeams.filter((team) => form.has(`team-${team.id}`)).map((team) => team.id)
  const invite = { email: form.get('email').trim(), role: form.get('role'), teams }
  if (invite.email === '') return render(context, { invite, error: 'Enter the email of the person to invite.' }, 422)
  const created = await attempt((scope) => scope.api('POST', '/api/invitations', { body: invite }))
  if (!created.ok)
    return render(
      context,
      { invite, error: plainRefusal(created.error, { email: 'the email', role: 'the role', teams: 'the teams' }) },
      created.error.status,
    )
  const invitation = created.value.data as { email: string; accept_url: string }
  setFlash(services.config.appSecret, req, res, 'members', {
    kind: 'invited',
    email: invitation.email,
    accept_url: invitation.accept_url,
  } satisfies Flash)
  return { redirect: '/members' }
}

/** Runs one change to a member through the API; a refusal is shown above the list in plain words. */
async function change(context: PageContext, run: (api: ApiCall, userId: string) => Promise<unknown>, done: string): Promise<PageResult> {
  const { params, attempt, services, req, res } = context
  const userId = (params.user_id ?? '').toLowerCase()
  if (!UUID_PATTERN.test(userId)) throw new ApiError(404, 'not_found', 'Not found', 'No such member.')
  const outcome = await attempt((scope) => run(scope.api, userId))
  if (!outcome.ok) {
    const page = await render(context, {}, outcome.error.status)
    if ('redirect' in page || 'sent' in page) return page
    return { ...page, content: html`${errorNotice(plainRefusal(outcome.error, { role: 'the role', teams: 'the teams' }))}${page.content}` }
  }
  setFlash(services.config.appSecret, req, res, 'members', { kind: 'notice', message: done } satisfies Flash)
  return { redirect: '/members' }
}

export const changeRole: PageHandler = (context) => {
  const role = context.form.get('role')
  return change(
    context,
    (api, userId) => api('PATCH', '/api/members/:user_id', { params: { user_id: userId }, body: { role } }),
    `Role changed to ${role}.`,
  )
}

export function suspension(action: 'suspend' | 'unsuspend'): PageHandler {
  return (context) =>
    change(
      context,
      (api, userId) => api('POST', `/api/members/:user_id/${action}`, { params: { user_id: userId } }),
      action === 'suspend'
        ? 'Member suspended: their sessions and API tokens stopped working in this workspace at once.'
        : 'Member unsuspended.',
    )
}

export const withdrawInvitation: PageHandler = async (context) => {
  const { params, api, services, req, res } = context
  const id = (params.id ?? '').toLowerCase()
  if (!UUID_PATTERN.test(id)) throw new ApiError(404, 'not_found', 'Not found', 'No such invitation.')
  await api('DELETE', '/api/invitations/:id', { params: { id } })
  setFlash(services.config.appSecret, req, res, 'members', {
    kind: 'notice',
    message: 'Invitation withdrawn: its link no longer works.',
  } satisfies Flash)
  return { redirect: '/members' }
}
