// Shared pieces of the workspace-administration pages (members, roles, teams): the admin gate and
// the refusals of src/members (seat limit, last admin, role in use...) in plain words. The rules
// themselves stay in src/members and SQL; these pages only call the API's route handlers.
import type { ApiError } from '../../http/problem.ts'
import { html } from '../html.ts'
import type { PageContext, PageResult } from '../page-context.ts'

/** A page for non-admins, or null when the caller is an admin. */
export function adminOnly(context: PageContext, title: string, what: string): PageResult | null {
  if (context.caller.isAdmin) return null
  return {
    status: 403,
    title,
    content: html`<h1>${title}</h1><div class="notice info" role="status">Only workspace admins manage ${what}.</div>`,
  }
}

/** The refusal of an administration call, in plain words; `labels` name the form's fields. */
export function plainRefusal(error: ApiError, labels: Record<string, string> = {}): string {
  const detail = error.message
  if (error.code === 'seat_limit_reached') {
    const counts = /(\d+) of (\d+) seats/.exec(detail)
    return `Seat limit reached: ${counts ? `all ${counts[2]} seats of this workspace are in use` : 'no seat is left in this workspace'}. Suspend a member or raise the seat limit first.`
  }
  if (/last admin/.test(detail))
    return 'This is the last admin of the workspace: make another member an admin first. A workspace always keeps one admin.'
  if (error.code === 'role_in_use')
    return 'This role is still in use by members or pending invitations: give them another role first, then delete it.'
  if (error.code === 'forbidden') return 'Only workspace admins may do this.'
  if (error.code === 'duplicate') {
    const field = labels[(error.errors?.[0]?.pointer ?? '').split('/')[1] ?? '']
    if (field && /already/.test(detail)) return sentence(detail)
    return field ? `That ${field} is already taken: choose another.` : sentence(detail)
  }
  if (/built-in role/.test(detail)) return 'Built-in roles cannot be changed or deleted: create a custom role instead.'
  const fields = (error.errors ?? [])
    .map((problem) => ({ label: labels[problem.pointer.split('/')[1] ?? ''], message: problem.message }))
    .filter((item) => item.label)
  if (error.code === 'validation_failed' && fields.length > 0)
    return sentence(fields.map((item) => `${capitalise(item.label)} ${item.message}`).join('; '))
  return sentence(detail)
}

function capitalise(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1)
}

function sentence(text: string): string {
  const trimmed = capitalise(text.trim())
  return /[.!?]$/.test(trimmed) ? trimmed : `${trimmed}.`
}
