// IP addresses and CIDR ranges as bytes: parsing a list such as "127.0.0.0/8, ::1/128", whether an
// address lies in one, and the block a per-address limit counts an address in. Plain arithmetic on
// addresses, shared by the configuration (TRUST_PROXY, WEBHOOK_ALLOWED_CIDRS), the HTTP layer's
// client address and limits, and the webhook address guard.
import { isIP } from 'node:net'

export type IpBytes = { family: 4 | 6; bytes: Uint8Array }

export type CidrRange = IpBytes & { prefix: number; text: string }

/**
 * Parses a comma- or space-separated list such as "127.0.0.0/8, ::1/128"; a bare address means a
 * single host. Throws an Error naming the first bad entry so configuration errors are clear.
 */
export function parseCidrList(text: string): CidrRange[] {
  const ranges: CidrRange[] = []
  for (const entry of text.split(/[\s,]+/)) {
    if (entry === '') continue
    const slash = entry.indexOf('/')
    const ip = parseIp(slash === -1 ? entry : entry.slice(0, slash))
    const maxPrefix = ip?.family === 4 ? 32 : 128
    const prefixText = slash === -1 ? String(maxPrefix) : entry.slice(slash + 1)
    const prefix = Number(prefixText)
    if (ip === null || entry.includes('%') || entry.includes('[') || !/^\d{1,3}$/.test(prefixText) || prefix > maxPrefix) {
      throw new Error(`"${entry}" is not a CIDR range such as 127.0.0.0/8 or ::1/128`)
    }
    ranges.push({ ...ip, prefix, text: entry })
  }
  return ranges
}

export const IPV4_MAPPED = parseCidrList('::ffff:0:0/96')[0]

export function ipv4At(bytes: Uint8Array, offset: number): IpBytes {
  return { family: 4, bytes: bytes.slice(offset, offset + 4) }
}

export function hasPrefix(bytes: Uint8Array, range: CidrRange): boolean {
  return inRange({ family: 6, bytes }, range)
}

export function inRange(ip: IpBytes, range: CidrRange): boolean {
  if (ip.family !== range.family) return false
  const wholeBytes = range.prefix >> 3
  for (let i = 0; i < wholeBytes; i++) if (ip.bytes[i] !== range.bytes[i]) return false
  const restBits = range.prefix & 7
  if (restBits === 0) return true
  const mask = (0xff << (8 - restBits)) & 0xff
  return (ip.bytes[wholeBytes] & mask) === (range.bytes[wholeBytes] & mask)
}

/**
 * Whether an address (a socket's, or a hop of X-Forwarded-For) lies in one of the ranges; an
 * IPv4-mapped IPv6 address (a dual-stack socket's form) is judged as its IPv4 address.
 */
export function isInCidrList(address: string, ranges: readonly CidrRange[]): boolean {
  const ip = parseIp(address.trim())
  if (ip === null) return false
  const judged = ip.family === 6 && hasPrefix(ip.bytes, IPV4_MAPPED) ? ipv4At(ip.bytes, 12) : ip
  return ranges.some((range) => inRange(judged, range))
}

/**
 * The block a client address is counted in by a per-address limit: an IPv4 address itself (an
 * IPv4-mapped IPv6 address as its IPv4 address), an IPv6 address by its /64, written
 * `2001:db8:1:2::/64`. Text that is no address is its own block.
 */
export function addressBlock(address: string): string {
  const ip = parseIp(address.trim())
  if (ip === null) return address
  const v4 = ip.family === 4 ? ip : hasPrefix(ip.bytes, IPV4_MAPPED) ? ipv4At(ip.bytes, 12) : null
  if (v4 !== null) return v4.bytes.join('.')
  const groups = [0, 1, 2, 3].map((group) => ((ip.bytes[group * 2] << 8) | ip.bytes[group * 2 + 1]).toString(16))
  return `${groups.join(':')}::/64`
}

/** Accepts dotted-quad IPv4 and any IPv6 text form, with or without brackets or a zone id. */
export function parseIp(text: string): IpBytes | null {
  const unbracketed = text.startsWith('[') && text.endsWith(']') ? text.slice(1, -1) : text
  const family = isIP(unbracketed)
  if (family === 4) return { family: 4, bytes: Uint8Array.from(unbracketed.split('.'), Number) }
  if (family !== 6) return null

  // A zone id only says which interface to use; it does not change which host is meant.
  let rest = unbracketed.replace(/%.*$/, '')
  const bytes = new Uint8Array(16)
  const dottedTail = /(\d+\.\d+\.\d+\.\d+)$/.exec(rest)
  if (dottedTail !== null) {
    bytes.set(dottedTail[1].split('.').map(Number), 12)
    rest = rest.slice(0, -dottedTail[1].length) + '0:0'
  }
  const [head, tail] = rest.split('::')
  const headGroups = head === '' ? [] : head.split(':')
  const tailGroups = tail === undefined || tail === '' ? [] : tail.split(':')
  const groups = [...headGroups, ...new Array(8 - headGroups.length - tailGroups.length).fill('0'), ...tailGroups]
  groups.forEach((group, index) => {
    const value = parseInt(group, 16)
    // The dotted tail was written above; its placeholder groups must not overwrite it.
    if (dottedTail !== null && index >= 6) return
    bytes[index * 2] = value >> 8
    bytes[index * 2 + 1] = value & 0xff
  })
  return { family: 6, bytes }
}
