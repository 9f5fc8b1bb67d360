// A webhook receiver for trying the service on one machine (the README's quick start):
// `WEBHOOK_SECRET=whsec_... node examples/receive-webhooks.ts 4000` listens on 127.0.0.1:4000 and
// prints one line per delivery, "verified" when its X-Service-Signature checks out with the secret
// (examples/verify-webhook.ts, the README's snippet), "refused" otherwise. A GET answers 200, so a
// script can wait until the receiver listens.
import { createServer } from 'node:http'
import { verifyWebhook } from './verify-webhook.ts'

const secret = process.env.WEBHOOK_SECRET ?? ''
const port = Number(process.argv[2] ?? 4000)
if (!secret.startsWith('whsec_')) {
  console.error('receive-webhooks: set WEBHOOK_SECRET to the subscription secret (whsec_...)')
  process.exit(2)
}

createServer((request, response) => {
  const chunks: Buffer[] = []
  request.on('data', (chunk: Buffer) => chunks.push(chunk))
  request.on('end', () => {
    if (request.method !== 'POST') return void response.end('ready\n')
    const rawBody = Buffer.concat(chunks)
    const verified = verifyWebhook(rawBody, String(request.headers['x-service-signature'] ?? ''), secret)
    // Deliveries may repeat: a real receiver deduplicates on X-Service-Delivery-Id.
    console.log(
      `${verified ? 'verified' : 'refused'} ${request.headers['x-service-event']} ${request.headers['x-service-delivery-id']} ${rawBody}`,
    )
    response.statusCode = verified ? 204 : 400
    response.end()
  })
}).listen(port, '127.0.0.1', () => console.log(`receiver listening on http://127.0.0.1:${port}/`))
