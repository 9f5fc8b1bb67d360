// Password hashing with scrypt from node:crypto: memory-hard like argon2id, and built into Node,
// so nothing native has to compile or download at install. N=2^15, r=8, p=1 uses 32 MiB and about
// 60-100 ms per check on this machine: slow for guessing, fine for sign-in.
import { randomBytes, scrypt, timingSafeEqual } from 'node:crypto'

const N = 32768
const R = 8
const P = 1
const KEY_LENGTH = 32
const MAX_MEMORY = 64 * 1024 * 1024

function derive(password: string, salt: Buffer, n: number, r: number, p: number): Promise<Buffer> {
  return new Promise((resolve, reject) =>
    scrypt(password.normalize('NFC'), salt, KEY_LENGTH, { N: n, r, p, maxmem: MAX_MEMORY }, (error, key) =>
      error ? reject(error) : resolve(key),
    ),
  )
}

export async function hashPassword(password: string): Promise<string> {
  const salt = randomBytes(16)
  const key = await derive(password, salt, N, R, P)
  return `scrypt$${N}$${R}$${P}$${salt.toString('base64url')}$${key.toString('base64url')}`
}

/** A fixed hash checked when the email is unknown, so both refusals take the same time. */
const DECOY_HASH = `scrypt$${N}$${R}$${P}$${Buffer.alloc(16).toString('base64url')}$${Buffer.alloc(KEY_LENGTH).toString('base64url')}`

export async function verifyPassword(password: string, stored: string | null): Promise<boolean> {
  const parts = (stored ?? DECOY_HASH).split('$')
  if (parts.length !== 6 || parts[0] !== 'scrypt') return false
  const [, n, r, p, salt, hash] = parts
  const expected = Buffer.from(hash, 'base64url')
  const actual = await derive(password, Buffer.from(salt, 'base64url'), Number(n), Number(r), Number(p))
  return stored !== null && expected.length === actual.length && timingSafeEqual(expected, actual)
}

export function passwordProblem(password: string, email: string): string | null {
  if (password.length < 10) return 'must be at least 10 characters'
  if (password.trim().toLowerCase() === email.trim().toLowerCase()) return 'must not be the email address'
  if (password.length > 1024) return 'must be at most 1024 characters'
  return null
}
