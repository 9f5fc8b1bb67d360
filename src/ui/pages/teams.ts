// Teams (admins): create, rename and delete teams, and add or remove their members. Membership is
// a member's `teams` set (PATCH /api/members/{user_id}), as in the API; team scopes in roles
// (deals:view:team...) follow it on the member's next request.
import { ApiError } from '../../http/problem.ts'
import { UUID_PATTERN } from '../../uuid.ts'
import type { ApiCall } from '../api-calls.ts'
import { html, type SafeHtml } from '../html.ts'
import { errorNotice, hiddenCsrf } from '../layout.ts'
import type { PageContext, PageHandler, PageResult } from '../page-context.ts'
import { setFlash, takeFlash } from '../session.ts'
import { adminOnly, plainRefusal } from './admin-common.ts'
import type { Member } from './members.ts'

type Team = { id: string; name: string; members: string[] }

const LABELS = { name: 'the team name', teams: 'the teams', user_id: 'the member' }

function teamCard(team: Team, members: Member[], csrf: string): SafeHtml {
  const headingId = `team-${team.id}`
  const inTeam = members.filter((member) => team.members.includes(member.user_id))
  const others = members.filter((member) => !team.members.includes(member.user_id))
  return html`<article class="card" aria-labelledby="${headingId}">
  <h3 id="${headingId}">${team.name}</h3>
  ${
    inTeam.length
      ? html`<ul class="people">${inTeam.map(
          (member) => html`<li><span>${member.name} <span class="muted">${member.email}</span></span>
        <form method="post" action="/teams/${team.id}/members/${member.user_id}/remove">${hiddenCsrf(csrf)}<button type="submit" class="secondary small" aria-label="Remove ${member.name} from ${team.name}">Remove</button></form></li>`,
        )}</ul>`
      : html`<p class="muted">No members yet.</p>`
  }
  ${
    others.length
      ? html`<form class="inline" method="post" action="/teams/${team.id}/members">
    ${hiddenCsrf(csrf)}
    <label for="add-${team.id}">Add to ${team.name}</label>
    <select id="add-${team.id}" name="user_id">${others.map((member) => html`<option value="${member.user_id}">${member.name} (${member.email})</option>`)}</select>
    <button type="submit" class="secondary small">Add</button>
  </form>`
      : ''
  }
  <details>
    <summary>Rename or delete</summary>
    <form class="inline" method="post" action="/teams/${team.id}/rename">
      ${hiddenCsrf(csrf)}
      <label for="rename-${team.id}">New name for ${team.name}</label>
      <input type="text" id="rename-${team.id}" name="name" value="${team.name}" maxlength="100" required>
      <button type="submit" class="secondary small">Rename</button>
    </form>
    <form class="inline" method="post" action="/teams/${team.id}/delete">
      ${hiddenCsrf(csrf)}
      <button type="submit" class="danger small" aria-label="Delete team ${team.name}">Delete team</button>
      <span class="muted">Its members leave it; records keep their owners.</span>
    </form>
  </details>
</article>`
}

async function render(context: PageContext, state: { name?: string; error?: string }, status = 200): Promise<PageResult> {
  const denied = adminOnly(context, 'Teams', 'teams')
  if (denied) return denied
  const { api, frame, services, req, res } = context
  const teams = (await api('GET', '/api/teams')).data as Team[]
  const members = ((await api('GET', '/api/members')).data as Member[]).filter(
    (member) => member.suspended_at === null || teams.some((team) => team.members.includes(member.user_id)),
  )
  const notice = takeFlash<string>(services.config.appSecret, req, res, 'teams')
  return {
    status,
    title: 'Teams',
    content: html`<h1>Teams</h1>
<p class="lead">Teams group members: a role with the Team scope lets a member work on records owned by anyone in their teams.</p>
${notice ? html`<div class="notice success" role="status">${notice}</div>` : ''}
${errorNotice(state.error)}
<section aria-labelledby="teams-heading">
  <h2 id="teams-heading">Teams of this workspace</h2>
  ${teams.length ? html`<div class="cards">${teams.map((team) => teamCard(team, members, frame.csrf))}</div>` : html`<p class="muted">No teams yet.</p>`}
</section>
<section class="panel" aria-labelledby="new-team">
  <h2 id="new-team">New team</h2>
  <form class="stack" method="post" action="/teams">
    ${hiddenCsrf(frame.csrf)}
    <div class="field">
      <label for="team-name">Team name</label>
      <input type="text" id="team-name" name="name" value="${state.name ?? ''}" maxlength="100" required>
    </div>
    <div class="actions"><button type="submit">Create team</button></div>
  </form>
</section>`,
  }
}

function teamId(context: PageContext): string {
  const id = (context.params.id ?? '').toLowerCase()
  if (!UUID_PATTERN.test(id)) throw new ApiError(404, 'not_found', 'Not found', 'No such team.')
  return id
}

async function run(context: PageContext, fn: (api: ApiCall) => Promise<unknown>, done: string, name?: string): Promise<PageResult> {
  const outcome = await context.attempt((scope) => fn(scope.api))
  if (!outcome.ok) return render(context, { name, error: plainRefusal(outcome.error, LABELS) }, outcome.error.status)
  setFlash(context.services.config.appSecret, context.req, context.res, 'teams', done)
  return { redirect: '/teams' }
}

export const showTeams: PageHandler = (context) => render(context, {})

export const createTeam: PageHandler = (context) => {
  const name = context.form.get('name').trim()
  if (name === '') return render(context, { error: 'Enter a name for the team.' }, 422)
  return run(context, (api) => api('POST', '/api/teams', { body: { name } }), `Team ${name} created.`, name)
}

export const renameTeam: PageHandler = (context) => {
  const id = teamId(context)
  const name = context.form.get('name').trim()
  if (name === '') return render(context, { error: 'Enter the new name of the team.' }, 422)
  return run(context, (api) => api('PATCH', '/api/teams/:id', { params: { id }, body: { name } }), `Team renamed to ${name}.`)
}

export const deleteTeam: PageHandler = (context) => {
  const id = teamId(context)
  return run(context, (api) => api('DELETE', '/api/teams/:id', { params: { id } }), 'Team deleted.')
}

/** Adds or removes one team in the member's set of teams (PATCH /api/members/{user_id} replaces the set). */
export function teamMembership(action: 'add' | 'remove'): PageHandler {
  return (context) => {
    const id = teamId(context)
    const userId = (action === 'add' ? context.form.get('user_id') : (context.params.user_id ?? '')).toLowerCase()
    if (!UUID_PATTERN.test(userId)) return render(context, { error: 'Choose a member.' }, 422)
    return run(
      context,
      async (api) => {
        const team = (await api('GET', '/api/teams/:id', { params: { id } })).data as Team
        const member = (await api('GET', '/api/members/:user_id', { params: { user_id: userId } })).data as Member
        const teams =
          action === 'add'
            ? [...member.teams.filter((name) => name !== team.name), team.id]
            : member.teams.filter((name) => name !== team.name)
        await api('PATCH', '/api/members/:user_id', { params: { user_id: userId }, body: { teams } })
        return { team, member }
      },
      action === 'add' ? 'Member added to the team.' : 'Member removed from the team.',
    )
  }
}
