// Two-factor sign-in: TOTP (RFC 6238, SHA-1, 6 digits, 30 s, ±1 step) and single-use recovery
// codes. The challenge token handed out after the password step is a short-lived JWT naming a
// crm.two_factor_challenges row, which counts the tries.
import { createHash, randomBytes } from 'node:crypto'
import { jwtVerify, SignJWT } from 'jose'
import { generateSecret, generateURI, verifySync } from 'otplib'
import { deriveKey, open, seal } from './secret-box.ts'

export const CHALLENGE_TTL_SECONDS = 300
export const CHALLENGE_MAX_TRIES = 5

export function totpKey(appSecret: string): Buffer {
  return deriveKey(appSecret, 'totp-secret')
}

export function newTotpSecret(): string {
  return generateSecret()
}

export function otpauthUri(email: string, secret: string): string {
  return generateURI({ issuer: 'CRM', label: email, secret })
}

export function sealTotpSecret(appSecret: string, secret: string): Buffer {
  return seal(totpKey(appSecret), secret)
}

/** The RFC 6238 time step the code belongs to (±1 step of drift), or null when it is wrong. */
export function totpStep(appSecret: string, sealed: Buffer, code: string): number | null {
  if (!/^\d{6}$/.test(code)) return null
  const result = verifySync({ secret: open(totpKey(appSecret), sealed), token: code, epochTolerance: 30 })
  return result.valid && 'timeStep' in result ? result.timeStep : null
}

/** Ten codes like `k3m9-x2qp-7rtd`: 60 bits each, so a plain SHA-256 is a safe way to store them. */
export function newRecoveryCodes(): string[] {
  const alphabet = 'abcdefghjkmnpqrstuvwxyz23456789'
  return Array.from({ length: 10 }, () => {
    const bytes = randomBytes(12)
    const chars = Array.from(bytes, (byte) => alphabet[byte % alphabet.length]).join('')
    return `${chars.slice(0, 4)}-${chars.slice(4, 8)}-${chars.slice(8, 12)}`
  })
}

export function hashRecoveryCode(code: string): Buffer {
  return createHash('sha256').update(code.trim().toLowerCase()).digest()
}

function challengeKey(appSecret: string): Uint8Array {
  return deriveKey(appSecret, 'two-factor-challenge')
}

export async function signChallenge(appSecret: string, challengeId: string, expiresAt: Date): Promise<string> {
  return new SignJWT({ purpose: '2fa' })
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(challengeId)
    .setExpirationTime(Math.floor(expiresAt.getTime() / 1000))
    .sign(challengeKey(appSecret))
}

/** The challenge id, or null when the token is forged, for another purpose, or expired. */
export async function readChallenge(appSecret: string, token: string): Promise<string | null> {
  try {
    const { payload } = await jwtVerify(token, challengeKey(appSecret), { algorithms: ['HS256'] })
    return payload.purpose === '2fa' && typeof payload.sub === 'string' ? payload.sub : null
  } catch {
    return null
  }
}
