import { createHmac, timingSafeEqual } from 'node:crypto'

export function verifyWebhook(rawBody: Buffer, header: string, secret: string, toleranceSeconds = 300): boolean {
  const parts = header.split(',').map((part) => part.trim().split('=', 2))
  const t = Number(parts.find(([name]) => name === 't')?.[1])
  if (!Number.isInteger(t) || Math.abs(Date.now() / 1000 - t) > toleranceSeconds) return false
  const expected = createHmac('sha256', secret).update(`${t}.`).update(rawBody).digest()
  let ok = false
  for (const [name, value] of parts) {
    if (name !== 'v1' || !/^[0-9a-f]{64}$/.test(value ?? '')) continue
    ok = timingSafeEqual(expected, Buffer.from(value, 'hex')) || ok
  }
  return ok
}
