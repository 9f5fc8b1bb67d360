// Outgoing mail is optional (docs/api.md section 3): with SMTP_URL set, messages go out through
// nodemailer; without it there is no mailer and callers show the link instead. Sending happens
// after the request's transaction has committed, never inside it (a transaction has no side effects
// outside the database), so a rolled-back invitation is never mailed.
import nodemailer, { type Transporter } from 'nodemailer'
import type { Config } from '../config.ts'

export type Mail = { to: string; subject: string; text: string }
export type Mailer = { send: (mail: Mail) => Promise<void> }

const transports = new Map<string, Transporter>()

/** The From address: PUBLIC_BASE_URL's host when set, so replies and SPF point at the deployment. */
export function fromAddress(config: Config): string {
  const host = config.publicBaseUrl ? new URL(config.publicBaseUrl).hostname : 'localhost'
  return `CRM <no-reply@${host}>`
}

export function createMailer(config: Config): Mailer | null {
  const url = config.smtpUrl
  if (!url) return null
  let transport = transports.get(url)
  if (!transport) {
    transport = nodemailer.createTransport(url)
    transports.set(url, transport)
  }
  const sender = transport
  return {
    send: async (mail) => {
      await sender.sendMail({ from: fromAddress(config), to: mail.to, subject: mail.subject, text: mail.text })
    },
  }
}
