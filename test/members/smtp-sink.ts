// A tiny SMTP server for tests (RFC 5321's happy path only): it accepts every message and keeps it,
// so a test can read what the service mailed without any package or network beyond loopback.
import { createServer, type Server } from 'node:net'

export type ReceivedMail = { from: string; to: string[]; data: string }
export type SmtpSink = {
  url: string
  messages: ReceivedMail[]
  next: (timeoutMs?: number) => Promise<ReceivedMail>
  close: () => Promise<void>
}

export async function startSmtpSink(): Promise<SmtpSink> {
  const messages: ReceivedMail[] = []
  const waiting: ((mail: ReceivedMail) => void)[] = []
  const server: Server = createServer((socket) => {
    let buffer = ''
    let inData = false
    let current: ReceivedMail = { from: '', to: [], data: '' }
    const reply = (line: string) => socket.write(`${line}\r\n`)
    reply('220 sink ESMTP')
    socket.on('data', (chunk) => {
      buffer += chunk.toString('utf8')
      for (;;) {
        if (inData) {
          const end = buffer.indexOf('\r\n.\r\n')
          if (end < 0) return
          current.data = buffer.slice(0, end).replace(/^\.\./gm, '.')
          buffer = buffer.slice(end + 5)
          inData = false
          messages.push(current)
          waiting.shift()?.(current)
          current = { from: '', to: [], data: '' }
          reply('250 queued')
          continue
        }
        const newline = buffer.indexOf('\r\n')
        if (newline < 0) return
        const line = buffer.slice(0, newline)
        buffer = buffer.slice(newline + 2)
        const verb = line.slice(0, 4).toUpperCase()
        if (verb === 'EHLO' || verb === 'HELO') reply('250 sink')
        else if (verb === 'MAIL') (current.from = line.replace(/^MAIL FROM:\s*/i, '')), reply('250 ok')
        else if (verb === 'RCPT') current.to.push(line.replace(/^RCPT TO:\s*/i, '')), reply('250 ok')
        else if (verb === 'DATA') (inData = true), reply('354 go ahead')
        else if (verb === 'QUIT') reply('221 bye'), socket.end()
        else reply('250 ok')
      }
    })
    socket.on('error', () => {})
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as { port: number }).port
  return {
    url: `smtp://127.0.0.1:${port}`,
    messages,
    next: (timeoutMs = 10_000) =>
      new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('no mail arrived')), timeoutMs)
        waiting.push((mail) => (clearTimeout(timer), resolve(mail)))
      }),
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  }
}
