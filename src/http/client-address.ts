// Who the client is, as far as the network can tell: the socket's address, or, when the socket
// belongs to a trusted proxy (TRUST_PROXY), what that proxy says in X-Forwarded-For and
// X-Forwarded-Proto. Anyone else's forwarding headers are ignored: a client could write anything.
import type { IncomingMessage } from 'node:http'
import { type CidrRange, isInCidrList } from '../cidr.ts'

export type Client = { address: string; secure: boolean }

const clients = new WeakMap<IncomingMessage, Client>()

function headerText(value: string | string[] | undefined): string {
  return Array.isArray(value) ? value.join(',') : (value ?? '')
}

/** Decides the client of a request once, at its start; clientOf reads the decision. */
export function identifyClient(req: IncomingMessage, trustedProxies: readonly CidrRange[]): Client {
  const socketAddress = req.socket.remoteAddress ?? ''
  const encrypted = Boolean((req.socket as { encrypted?: boolean }).encrypted)
  let client: Client = { address: socketAddress, secure: encrypted }
  if (trustedProxies.length > 0 && isInCidrList(socketAddress, trustedProxies)) {
    // From the right: each trusted hop vouches for the one before it; the first untrusted hop is
    // the client. Hops a client wrote itself sit to its left and are never reached.
    const hops = headerText(req.headers['x-forwarded-for'])
      .split(',')
      .map((hop) => hop.trim())
      .filter((hop) => hop !== '')
    let address = socketAddress
    for (let index = hops.length - 1; index >= 0; index--) {
      address = hops[index]
      if (!isInCidrList(address, trustedProxies)) break
    }
    const proto = headerText(req.headers['x-forwarded-proto']).split(',')[0].trim().toLowerCase()
    client = { address, secure: proto === 'https' || proto === 'http' ? proto === 'https' : encrypted }
  }
  clients.set(req, client)
  return client
}

/** The client identified at the start of the request; without one, the socket alone decides. */
export function clientOf(req: IncomingMessage): Client {
  return clients.get(req) ?? identifyClient(req, [])
}

/** A request made from another one (the UI's authentication of a page) is the same client. */
export function sameClientAs(req: IncomingMessage, original: IncomingMessage): void {
  clients.set(req, clientOf(original))
}
