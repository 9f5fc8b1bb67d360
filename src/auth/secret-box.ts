// Encryption at rest for secrets the service must read back (TOTP secrets): AES-256-GCM with a
// key derived from APP_SECRET by HKDF, one key per purpose, so rotating APP_SECRET is the only
// thing that invalidates them and the database alone reveals nothing.
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto'

export function deriveKey(appSecret: string, purpose: string): Buffer {
  return Buffer.from(hkdfSync('sha256', appSecret, 'crm-service', purpose, 32))
}

/** iv (12 bytes) | tag (16 bytes) | ciphertext */
export function seal(key: Buffer, plaintext: string): Buffer {
  const iv = randomBytes(12)
  const cipher = createCipheriv('aes-256-gcm', key, iv)
  const body = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()])
  return Buffer.concat([iv, cipher.getAuthTag(), body])
}

export function open(key: Buffer, sealed: Buffer): string {
  const decipher = createDecipheriv('aes-256-gcm', key, sealed.subarray(0, 12))
  decipher.setAuthTag(sealed.subarray(12, 28))
  return Buffer.concat([decipher.update(sealed.subarray(28)), decipher.final()]).toString('utf8')
}
