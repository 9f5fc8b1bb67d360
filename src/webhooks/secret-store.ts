// Subscription secrets at rest: AES-256-GCM under a key derived from APP_SECRET (HKDF, purpose
// "webhook-secret"), with the workspace id as additional data so a sealed secret copied into
// another workspace's row does not open. Layout: iv (12 bytes) | tag (16 bytes) | ciphertext.
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto'
import { deriveKey } from '../auth/secret-box.ts'

export function webhookSecretKey(appSecret: string): Buffer {
  return deriveKey(appSecret, 'webhook-secret')
}

export function sealWebhookSecret(key: Buffer, secret: string, workspaceId: string): Buffer {
  const iv = randomBytes(12)
  const cipher = createCipheriv('aes-256-gcm', key, iv)
  cipher.setAAD(Buffer.from(workspaceId, 'utf8'))
  const body = Buffer.concat([cipher.update(secret, 'utf8'), cipher.final()])
  return Buffer.concat([iv, cipher.getAuthTag(), body])
}

export function openWebhookSecret(key: Buffer, sealed: Buffer, workspaceId: string): string {
  const decipher = createDecipheriv('aes-256-gcm', key, sealed.subarray(0, 12))
  decipher.setAAD(Buffer.from(workspaceId, 'utf8'))
  decipher.setAuthTag(sealed.subarray(12, 28))
  return Buffer.concat([decipher.update(sealed.subarray(28)), decipher.final()]).toString('utf8')
}
