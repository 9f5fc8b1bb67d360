// What the signed-out pages read from a request: its query string, and a name for the session a
// browser sign-in creates (shown in the security page's list of sessions and tokens).
import type { IncomingMessage } from 'node:http'

export function query(req: IncomingMessage): URLSearchParams {
  // Everything after the first '?': a value may carry a '?' of its own (an OAuth redirect_uri).
  const url = req.url ?? ''
  const at = url.indexOf('?')
  return new URLSearchParams(at < 0 ? '' : url.slice(at + 1))
}

/** "Web session: Chrome on Linux", from the User-Agent. */
export function deviceName(req: IncomingMessage): string {
  const agent = req.headers['user-agent'] ?? ''
  const browser = /Edg\//.test(agent)
    ? 'Edge'
    : /Firefox\//.test(agent)
      ? 'Firefox'
      : /Chrom(e|ium)\//.test(agent)
        ? 'Chrome'
        : /Safari\//.test(agent)
          ? 'Safari'
          : 'Browser'
  const system = /Windows/.test(agent)
    ? 'Windows'
    : /Mac OS X/.test(agent)
      ? 'macOS'
      : /Android/.test(agent)
        ? 'Android'
        : /iPhone|iPad/.test(agent)
          ? 'iOS'
          : /Linux/.test(agent)
            ? 'Linux'
            : ''
  return `Web session: ${browser}${system ? ` on ${system}` : ''}`
}
