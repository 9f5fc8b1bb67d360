// The invitation message: plain text, the accept link on a line of its own so mail clients link it.
import type { Mail } from './mailer.ts'

export function invitationMail(invitation: {
  email: string
  accept_url: string
  expires_at: string
  workspace_name: string
  inviter_name: string
}): Mail {
  return {
    to: invitation.email,
    subject: `${invitation.inviter_name} invited you to ${invitation.workspace_name}`,
    text: [
      `${invitation.inviter_name} invited you to join the workspace "${invitation.workspace_name}".`,
      '',
      'Accept the invitation here:',
      invitation.accept_url,
      '',
      `The link works once and expires at ${invitation.expires_at}.`,
      'If you did not expect this invitation, ignore this message.',
    ].join('\n'),
  }
}
