// Webhook targets are chosen by tenants, so without this guard a subscription could make the
// service call its own admin ports, the cloud metadata service or anything else on the private
// network (SSRF). The same check runs when a URL is saved and again before every attempt, on the
// addresses that will actually be dialled, so a DNS record changed after saving is still caught.
import { lookup } from 'node:dns/promises'
import { isIP, isIPv4 } from 'node:net'
import { type CidrRange, hasPrefix, IPV4_MAPPED, type IpBytes, inRange, ipv4At, parseCidrList, parseIp } from '../cidr.ts'

export type AddressPolicy = {
  /** Local development only: accept http:// targets. */
  allowHttp: boolean
  /** Local development only: addresses inside these ranges pass even though they are not global. */
  allowedCidrs: readonly CidrRange[]
  /** Injected by tests; the default asks the operating system's resolver, like a connect would. */
  resolve?: (host: string) => Promise<string[]>
}

export const STRICT_ADDRESS_POLICY: AddressPolicy = Object.freeze({ allowHttp: false, allowedCidrs: Object.freeze([]) })

export type ResolvedAddress = { address: string; family: 4 | 6 }

export type WebhookUrlCheck =
  | { ok: true; url: URL; host: string; addresses: ResolvedAddress[] }
  | { ok: false; reason: string; code: 'url_not_allowed' | 'dns_failed' }

const LOCAL_NAME_SUFFIXES = ['.localhost', '.local', '.internal']

export async function checkWebhookUrl(urlText: string, policy: AddressPolicy): Promise<WebhookUrlCheck> {
  let url: URL
  try {
    url = new URL(urlText)
  } catch {
    return refused('the URL is not a valid absolute URL')
  }
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && policy.allowHttp)) {
    return refused(policy.allowHttp ? 'only https and http URLs are allowed' : 'only https URLs are allowed')
  }
  if (url.username !== '' || url.password !== '') return refused('the URL must not contain a user name or password')

  // WHATWG parsing has already turned decimal, octal, hex and shortened IPv4 forms into dotted
  // quads and lower-cased names, so only brackets and the root-zone dot are left to strip.
  const host = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname.replace(/\.+$/, '')
  if (host === '') return refused('the URL has no host')

  if (isIP(host) !== 0) {
    const problem = addressProblem(host, policy)
    if (problem !== null) return refused(`address ${host} is ${problem}`)
    return { ok: true, url, host, addresses: [toResolved(host)] }
  }

  // With allowedCidrs set (local development), the resolved addresses decide instead, so that
  // http://localhost:3000 works against 127.0.0.0/8.
  const isLocalName = host === 'localhost' || LOCAL_NAME_SUFFIXES.some((suffix) => host.endsWith(suffix))
  if (isLocalName && policy.allowedCidrs.length === 0) return refused(`host name ${host} is reserved for local networks`)

  let resolvedTexts: string[]
  try {
    resolvedTexts = await (policy.resolve ?? resolveWithOperatingSystem)(host)
  } catch (error) {
    const code = (error as { code?: unknown }).code
    return {
      ok: false,
      code: 'dns_failed',
      reason: `host name ${host} could not be resolved${typeof code === 'string' ? ` (${code})` : ''}`,
    }
  }
  const unique = [...new Set(resolvedTexts)]
  if (unique.length === 0) return { ok: false, code: 'dns_failed', reason: `host name ${host} resolved to no addresses` }
  // One bad address is enough: a resolver may hand out any of them on the next lookup.
  for (const address of unique) {
    const problem = addressProblem(address, policy)
    if (problem !== null) return refused(`host name ${host} resolves to ${address}, which is ${problem}`)
  }
  return { ok: true, url, host, addresses: unique.map(toResolved) }
}

async function resolveWithOperatingSystem(host: string): Promise<string[]> {
  const results = await lookup(host, { all: true, verbatim: true })
  return results.map((result) => result.address)
}

function refused(reason: string): WebhookUrlCheck {
  return { ok: false, code: 'url_not_allowed', reason }
}

function toResolved(address: string): ResolvedAddress {
  return { address, family: isIPv4(address) ? 4 : 6 }
}

function addressProblem(address: string, policy: AddressPolicy): string | null {
  const ip = parseIp(address)
  if (ip === null) return 'not an IP address'
  if (policy.allowedCidrs.some((range) => inRange(ip, range))) return null
  const embedded = ip.family === 6 && hasPrefix(ip.bytes, IPV4_MAPPED) ? ipv4At(ip.bytes, 12) : null
  if (embedded !== null && policy.allowedCidrs.some((range) => inRange(embedded, range))) return null
  return nonGlobalReason(ip)
}

/** True when the address may be dialled without any development exception. */
export function isGlobalUnicast(address: string): boolean {
  const ip = parseIp(address)
  return ip !== null && nonGlobalReason(ip) === null
}

// Ranges a webhook must never reach, checked in order so the more specific label wins.
// Sources: the IANA IPv4 and IPv6 special-purpose address registries.
const IPV4_REFUSED = labelledRanges([
  ['0.0.0.0/8', 'unspecified'],
  ['10.0.0.0/8', 'private'],
  ['100.64.0.0/10', 'in the CGNAT shared address space'],
  ['127.0.0.0/8', 'loopback'],
  ['169.254.169.254/32', 'the cloud metadata address (link-local)'],
  ['169.254.0.0/16', 'link-local'],
  ['172.16.0.0/12', 'private'],
  ['192.0.0.0/24', 'reserved for IETF protocol assignments'],
  ['192.0.2.0/24', 'reserved for documentation'],
  ['192.88.99.0/24', 'the 6to4 relay anycast range (deprecated)'],
  ['192.168.0.0/16', 'private'],
  ['198.18.0.0/15', 'reserved for benchmarking'],
  ['198.51.100.0/24', 'reserved for documentation'],
  ['203.0.113.0/24', 'reserved for documentation'],
  ['224.0.0.0/4', 'multicast'],
  ['255.255.255.255/32', 'the broadcast address'],
  ['240.0.0.0/4', 'reserved'],
])

const IPV6_REFUSED = labelledRanges([
  ['::/128', 'unspecified'],
  ['::1/128', 'loopback'],
  ['::/96', 'an IPv4-compatible IPv6 address (deprecated)'],
  ['64:ff9b:1::/48', 'reserved for local-use NAT64'],
  ['fe80::/10', 'link-local'],
  ['fec0::/10', 'site-local (deprecated)'],
  ['fc00::/7', 'unique-local'],
  ['ff00::/8', 'multicast'],
  ['2001::/32', 'a Teredo tunnel address'],
  ['2001:2::/48', 'reserved for benchmarking'],
  ['2001:db8::/32', 'reserved for documentation'],
  ['3fff::/20', 'reserved for documentation'],
])

function labelledRanges(entries: [range: string, label: string][]): [CidrRange, string][] {
  return entries.map(([range, label]) => [parseCidrList(range)[0], label])
}

const NAT64_WELL_KNOWN = parseCidrList('64:ff9b::/96')[0]
const SIX_TO_FOUR = parseCidrList('2002::/16')[0]
const GLOBAL_UNICAST_V6 = parseCidrList('2000::/3')[0]

function nonGlobalReason(ip: IpBytes): string | null {
  if (ip.family === 4) return IPV4_REFUSED.find(([range]) => inRange(ip, range))?.[1] ?? null

  // These forms reach an IPv4 host, so that host decides.
  const embeddedAt =
    hasPrefix(ip.bytes, IPV4_MAPPED) || hasPrefix(ip.bytes, NAT64_WELL_KNOWN) ? 12 : hasPrefix(ip.bytes, SIX_TO_FOUR) ? 2 : null
  if (embeddedAt !== null) {
    const embedded = ipv4At(ip.bytes, embeddedAt)
    const reason = nonGlobalReason(embedded)
    return reason === null ? null : `an IPv6 form of ${embedded.bytes.join('.')}, which is ${reason}`
  }

  const refusedLabel = IPV6_REFUSED.find(([range]) => inRange(ip, range))?.[1]
  if (refusedLabel !== undefined) return refusedLabel
  return inRange(ip, GLOBAL_UNICAST_V6) ? null : 'outside the IPv6 global unicast range 2000::/3'
}
