import t, { type Test } from 'tap'
import { parseCidrList } from '../../src/cidr.ts'
import { type AddressPolicy, checkWebhookUrl, isGlobalUnicast, STRICT_ADDRESS_POLICY } from '../../src/webhooks/address-guard.ts'

const PUBLIC_V4 = '93.184.215.14'
const PUBLIC_V6 = '2606:2800:21f:cb07:6820:80da:af6b:8b2c'

function resolverFrom(table: Record<string, string[]>): AddressPolicy['resolve'] {
  return async (host) => {
    const found = table[host]
    if (found === undefined) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' })
    return found
  }
}

const strict: AddressPolicy = { ...STRICT_ADDRESS_POLICY, resolve: resolverFrom({ 'hooks.example.com': [PUBLIC_V4, PUBLIC_V6] }) }

async function expectRefused(t: Test, url: string, reason: RegExp, policy: AddressPolicy = strict) {
  const result = await checkWebhookUrl(url, policy)
  t.equal(result.ok, false, `${url} is refused`)
  if (!result.ok) {
    t.equal(result.code, 'url_not_allowed', `${url} code`)
    t.match(result.reason, reason, `${url} reason: ${result.reason}`)
  }
}

t.test('public https URLs pass with every resolved address', async (t) => {
  const result = await checkWebhookUrl('https://hooks.example.com/in?x=1', strict)
  t.ok(result.ok)
  if (result.ok) {
    t.equal(result.host, 'hooks.example.com')
    t.equal(result.url.pathname, '/in')
    t.same(result.addresses, [
      { address: PUBLIC_V4, family: 4 },
      { address: PUBLIC_V6, family: 6 },
    ])
  }
  const literal = await checkWebhookUrl(`https://[${PUBLIC_V6}]:8443/`, strict)
  t.same(literal.ok && literal.addresses, [{ address: PUBLIC_V6, family: 6 }], 'bracketed IPv6 literal')
  t.same((await checkWebhookUrl('https://hooks.example.com./', strict)).ok, true, 'root-zone dot')
})

t.test('URL shape', async (t) => {
  await expectRefused(t, 'not a url', /not a valid absolute URL/)
  await expectRefused(t, 'http://hooks.example.com/', /only https/)
  await expectRefused(t, 'ftp://hooks.example.com/', /only https/)
  await expectRefused(t, 'ftp://hooks.example.com/', /only https and http/, { ...strict, allowHttp: true })
  await expectRefused(t, 'https://user:pass@hooks.example.com/', /user name or password/)
  await expectRefused(t, 'https://user@hooks.example.com/', /user name or password/)
  await expectRefused(t, 'https://:pass@hooks.example.com/', /user name or password/)
  t.equal((await checkWebhookUrl('http://hooks.example.com/', { ...strict, allowHttp: true })).ok, true, 'allowHttp opens http')
})

t.test('host names reserved for local networks', async (t) => {
  for (const url of [
    'https://localhost/',
    'https://LOCALHOST./',
    'https://api.localhost/',
    'https://printer.local/',
    'https://metadata.google.internal/',
    'https://a.b.internal:8443/',
  ]) {
    await expectRefused(t, url, /reserved for local networks/)
  }
})

t.test('IPv4 written in unusual notations is judged by the address it means', async (t) => {
  // WHATWG URL parsing (as in Node) normalises these; the test pins that behaviour.
  for (const [url, hostname] of [
    ['http://2130706433/', '127.0.0.1'],
    ['https://0177.0.0.1/', '127.0.0.1'],
    ['https://0x7f.0.0.1/', '127.0.0.1'],
    ['https://0x7f000001/', '127.0.0.1'],
    ['https://127.1/', '127.0.0.1'],
    ['https://10.1/', '10.0.0.1'],
    ['https://%31%32%37.0.0.1/', '127.0.0.1'],
    ['https://0xa9.0xfe.0xa9.0xfe/', '169.254.169.254'],
  ]) {
    t.equal(new URL(url).hostname, hostname, `${url} means ${hostname}`)
    await expectRefused(t, url, new RegExp(`address ${hostname.replaceAll('.', '\\.')} is`), { ...strict, allowHttp: true })
  }
  t.equal((await checkWebhookUrl('https://1.2.3.4.5/', strict)).ok, false, 'an invalid dotted form is not a URL')
})

t.test('non-global IPv4 literals', async (t) => {
  const cases: [string, RegExp][] = [
    ['0.0.0.0', /unspecified/],
    ['0.1.2.3', /unspecified/],
    ['10.0.0.1', /private/],
    ['100.64.0.1', /CGNAT/],
    ['100.127.255.254', /CGNAT/],
    ['127.0.0.1', /loopback/],
    ['127.255.255.255', /loopback/],
    ['169.254.169.254', /metadata/],
    ['169.254.1.1', /link-local/],
    ['172.16.0.1', /private/],
    ['172.31.255.255', /private/],
    ['192.0.0.8', /IETF/],
    ['192.0.2.1', /documentation/],
    ['192.88.99.1', /6to4 relay anycast/],
    ['192.88.99.255', /6to4 relay anycast/],
    ['192.168.1.1', /private/],
    ['198.18.0.1', /benchmarking/],
    ['198.19.255.255', /benchmarking/],
    ['198.51.100.7', /documentation/],
    ['203.0.113.9', /documentation/],
    ['224.0.0.1', /multicast/],
    ['239.255.255.250', /multicast/],
    ['240.0.0.1', /reserved/],
    ['255.255.255.255', /broadcast/],
  ]
  for (const [address, reason] of cases) {
    t.notOk(isGlobalUnicast(address), `${address} is not global`)
    await expectRefused(t, `https://${address}/`, new RegExp(`^address ${address.replaceAll('.', '\\.')} is .*${reason.source}`))
  }
  for (const address of [
    '1.1.1.1',
    '8.8.8.8',
    '100.63.255.255',
    '100.128.0.0',
    '172.15.255.255',
    '172.32.0.0',
    '192.0.1.1',
    '192.169.0.1',
    '198.17.255.255',
    '198.20.0.0',
    '192.88.98.255',
    '192.88.100.0',
    '223.255.255.255',
    '169.253.255.255',
    '11.0.0.0',
  ]) {
    t.ok(isGlobalUnicast(address), `${address} is global`)
  }
})

t.test('non-global IPv6 literals, including forms that embed IPv4', async (t) => {
  const cases: [string, RegExp][] = [
    ['::', /unspecified/],
    ['::1', /loopback/],
    ['fe80::1', /link-local/],
    ['febf:ffff::1', /link-local/],
    ['fec0::1', /site-local/],
    ['fc00::1', /unique-local/],
    ['fd12:3456::1', /unique-local/],
    ['ff02::1', /multicast/],
    ['2001:db8::1', /documentation/],
    ['3fff::1', /documentation/],
    ['2001:2::1', /benchmarking/],
    ['2001:0:4136:e378::1', /Teredo/],
    ['100::1', /outside the IPv6 global unicast range/],
    ['::ffff:127.0.0.1', /IPv6 form of 127\.0\.0\.1, which is loopback/],
    ['::ffff:7f00:1', /IPv6 form of 127\.0\.0\.1/],
    ['::ffff:a9fe:a9fe', /IPv6 form of 169\.254\.169\.254, which is the cloud metadata/],
    ['0:0:0:0:0:ffff:10.0.0.1', /IPv6 form of 10\.0\.0\.1, which is private/],
    ['::127.0.0.1', /IPv4-compatible/],
    ['::8.8.8.8', /IPv4-compatible/],
    ['64:ff9b::10.0.0.1', /IPv6 form of 10\.0\.0\.1, which is private/],
    ['64:ff9b::7f00:1', /IPv6 form of 127\.0\.0\.1/],
    ['64:ff9b:1::8.8.8.8', /local-use NAT64/],
    ['2002:7f00:1::1', /IPv6 form of 127\.0\.0\.1, which is loopback/],
    ['2002:c0a8:101::', /IPv6 form of 192\.168\.1\.1, which is private/],
    ['2002:a9fe:a9fe:0:0:0:0:1', /IPv6 form of 169\.254\.169\.254/],
    ['::ffff:192.88.99.1', /IPv6 form of 192\.88\.99\.1, which is the 6to4 relay anycast/],
    ['64:ff9b::c058:6301', /IPv6 form of 192\.88\.99\.1, which is the 6to4 relay anycast/],
    ['2002:c058:6301::1', /IPv6 form of 192\.88\.99\.1, which is the 6to4 relay anycast/],
  ]
  for (const [address, reason] of cases) {
    t.notOk(isGlobalUnicast(address), `${address} is not global`)
    const result = await checkWebhookUrl(`https://[${address}]/`, strict)
    t.equal(result.ok, false, `${address} is refused`)
    if (!result.ok) t.match(result.reason, reason, `${address}: ${result.reason}`)
  }
  for (const address of [
    PUBLIC_V6,
    '2001:4860:4860::8888',
    '::ffff:8.8.8.8',
    '64:ff9b::8.8.8.8',
    '2002:808:808::1',
    '2001:db9::1',
    '2001:3::1',
  ]) {
    t.ok(isGlobalUnicast(address), `${address} is global`)
  }
  t.notOk(isGlobalUnicast('fe80::1%eth0'), 'zone ids are understood')
  t.notOk(isGlobalUnicast('[::1]'), 'brackets are understood')
  t.ok(isGlobalUnicast(`[${PUBLIC_V6}]`))
  t.notOk(isGlobalUnicast('not-an-ip'))
  t.notOk(isGlobalUnicast('0177.0.0.1'), 'non-canonical IPv4 text is not treated as an address')
})

t.test('every address a name resolves to must be global', async (t) => {
  const policy: AddressPolicy = {
    ...STRICT_ADDRESS_POLICY,
    resolve: resolverFrom({
      'private.example.com': ['10.1.2.3'],
      'mixed.example.com': [PUBLIC_V4, '192.168.0.10'],
      'mapped.example.com': ['::ffff:169.254.169.254'],
      'scoped.example.com': ['fe80::1%eth0'],
      'garbage.example.com': ['not-an-address'],
      'empty.example.com': [],
      'twice.example.com': [PUBLIC_V4, PUBLIC_V4],
    }),
  }
  await expectRefused(
    t,
    'https://private.example.com/',
    /^host name private\.example\.com resolves to 10\.1\.2\.3, which is private$/,
    policy,
  )
  await expectRefused(t, 'https://mixed.example.com/', /resolves to 192\.168\.0\.10, which is private/, policy)
  await expectRefused(t, 'https://mapped.example.com/', /metadata/, policy)
  await expectRefused(t, 'https://scoped.example.com/', /link-local/, policy)
  await expectRefused(t, 'https://garbage.example.com/', /not an IP address/, policy)

  const unknown = await checkWebhookUrl('https://nowhere.example.com/', policy)
  t.same(unknown, { ok: false, code: 'dns_failed', reason: 'host name nowhere.example.com could not be resolved (ENOTFOUND)' })
  const empty = await checkWebhookUrl('https://empty.example.com/', policy)
  t.same(empty, { ok: false, code: 'dns_failed', reason: 'host name empty.example.com resolved to no addresses' })
  const codeless = await checkWebhookUrl('https://x.example.com/', { ...policy, resolve: async () => Promise.reject(new Error('boom')) })
  t.same(codeless, { ok: false, code: 'dns_failed', reason: 'host name x.example.com could not be resolved' })
  const twice = await checkWebhookUrl('https://twice.example.com/', policy)
  t.same(twice.ok && twice.addresses, [{ address: PUBLIC_V4, family: 4 }], 'duplicates are dropped')
})

t.test('the default resolver is the operating system', async (t) => {
  const result = await checkWebhookUrl('https://name-that-does-not-exist.invalid/', STRICT_ADDRESS_POLICY)
  t.match(result, { ok: false, code: 'dns_failed' })
  const withException = await checkWebhookUrl('http://localhost:1/', {
    allowHttp: true,
    allowedCidrs: parseCidrList('127.0.0.0/8, ::1/128'),
  })
  t.match(withException, { ok: true, host: 'localhost' }, 'localhost resolves to loopback, which the exception allows')
})

t.test('allowedCidrs opens exceptions for development only', async (t) => {
  const policy: AddressPolicy = {
    allowHttp: true,
    allowedCidrs: parseCidrList('127.0.0.0/8,::1/128 10.5.0.0/16'),
    resolve: resolverFrom({ 'receiver.test': ['127.0.0.1'], localhost: ['127.0.0.1', '::1'], 'db.internal': ['10.9.0.1'] }),
  }
  t.match(await checkWebhookUrl('http://127.0.0.1:8080/hook', policy), {
    ok: true,
    host: '127.0.0.1',
    addresses: [{ address: '127.0.0.1', family: 4 }],
  })
  t.match(await checkWebhookUrl('http://[::1]:8080/hook', policy), { ok: true, host: '::1', addresses: [{ address: '::1', family: 6 }] })
  t.match(await checkWebhookUrl('http://[::ffff:127.0.0.1]/', policy), { ok: true }, 'mapped form of an allowed IPv4 address')
  t.match(await checkWebhookUrl('https://10.5.1.1/', policy), { ok: true })
  t.match(await checkWebhookUrl('http://receiver.test:3000/', policy), { ok: true, addresses: [{ address: '127.0.0.1', family: 4 }] })
  t.match(
    await checkWebhookUrl('http://localhost:3000/', policy),
    { ok: true },
    'local names are judged by their addresses when exceptions are on',
  )
  await expectRefused(t, 'https://db.internal/', /resolves to 10\.9\.0\.1, which is private/, policy)
  await expectRefused(t, 'https://10.6.0.1/', /private/, policy)
  await expectRefused(t, 'https://169.254.169.254/', /metadata/, policy)
  await expectRefused(t, 'https://[fe80::1]/', /link-local/, policy)
  await expectRefused(t, 'http://127.0.0.1/', /only https/, { ...policy, allowHttp: false })
  await expectRefused(t, 'https://127.0.0.1/', /loopback/, { ...policy, allowedCidrs: [] })
})

t.test('parseCidrList', async (t) => {
  t.same(parseCidrList(''), [])
  t.same(parseCidrList(' , '), [])
  const ranges = parseCidrList('127.0.0.0/8, ::1/128,10.0.0.1 fd00::/8')
  t.same(
    ranges.map((range) => [range.text, range.family, range.prefix]),
    [
      ['127.0.0.0/8', 4, 8],
      ['::1/128', 6, 128],
      ['10.0.0.1', 4, 32],
      ['fd00::/8', 6, 8],
    ],
  )
  t.same(Array.from(parseCidrList('::ffff:1.2.3.4/128')[0].bytes), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 1, 2, 3, 4])
  t.same(Array.from(parseCidrList('1:2:3:4:5:6:7:8')[0].bytes), [0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8])
  t.same(Array.from(parseCidrList('1::')[0].bytes), [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
  t.same(Array.from(parseCidrList('1:2:3:4:5:6:1.2.3.4')[0].bytes), [0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 1, 2, 3, 4])
  for (const bad of [
    '127.0.0.0/33',
    '::1/129',
    'localhost',
    '127.1/8',
    '10.0.0.0/',
    '10.0.0.0/8/8',
    '10.0.0.0/-1',
    '10.0.0.0/x',
    '[::1]/128',
    'fe80::1%eth0/64',
    '1.2.3.4.5',
  ]) {
    t.throws(() => parseCidrList(`127.0.0.0/8,${bad}`), { message: `"${bad}" is not a CIDR range such as 127.0.0.0/8 or ::1/128` }, bad)
  }
})
