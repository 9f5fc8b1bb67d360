// Bearer tokens: `crm_` + 32 random bytes in base64url. Only their SHA-256 is stored, so a leaked
// database does not leak usable tokens; the hash is also what crm.authenticate looks up.
import { hash, randomBytes } from 'node:crypto'

export const TOKEN_PATTERN = /^crm_[A-Za-z0-9_-]{43,128}$/

export function newToken(): string {
  return `crm_${randomBytes(32).toString('base64url')}`
}

/** One-shot hashing: no Hash object per call (it runs on every authenticated request). */
export function hashToken(token: string): Buffer {
  return hash('sha256', token, 'buffer')
}
