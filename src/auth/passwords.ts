// Password hashing with scrypt from node:crypto: memory-hard like argon2id, and built into Node,
// so nothing native has to compile or download at install. N=2^15, r=8, p=1 uses 32 MiB and about
// 60-100 ms per check on this machine: slow for guessing, fine for sign-in.
import { randomBytes, scrypt } from 'node:crypto'

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

/** A fixed hash whose parameters stand in for an unknown email's, so both refusals take the same time. */
const DECOY_HASH = `scrypt$${N}$${R}$${P}$${Buffer.alloc(16).toString('base64url')}$${Buffer.alloc(KEY_LENGTH).toString('base64url')}`

/** A stored hash without its key: `scrypt$N$r$p$salt`, what the database hands out before sign-in (crm.claim_sign_in). */
const DECOY_PARAMS = DECOY_HASH.slice(0, DECOY_HASH.lastIndexOf('$'))

/**
 * The key (base64url) a password derives under a stored hash's parameters and salt, for the
 * database to compare with the stored key (crm.sign_in). Null or malformed parameters (an unknown
 * email) derive against a decoy, so every refusal costs the same scrypt.
 */
export async function passwordKey(password: string, params: string | null): Promise<string> {
  let parts = (params ?? DECOY_PARAMS).split('$')
  if (parts.length !== 5 || parts[0] !== 'scrypt') parts = DECOY_PARAMS.split('$')
  const [, n, r, p, salt] = parts
  const key = await derive(password, Buffer.from(salt, 'base64url'), Number(n), Number(r), Number(p))
  return key.toString('base64url')
}

export function passwordProblem(password: string, email: string): string | null {
  if (password.length < 10) return 'must be at least 10 characters'
  if (password.trim().toLowerCase() === email.trim().toLowerCase()) return 'must not be the email address'
  if (password.length > 1024) return 'must be at most 1024 characters'
  return null
}
