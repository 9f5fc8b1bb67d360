// The password and two-factor steps of sign-in. These run before there is a user to act as, on the
// runtime role's connections (crm_runtime), through the functions of
// sql/definitions/60_sign_in_and_ui_sessions.sql: the database hands out no password key and issues a token
// only for a password it has compared itself, once per claimed attempt.

import { isIP } from 'node:net'
import Type from 'typebox'
import type { Config } from '../config.ts'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { Bytes, NullableString, rowType } from '../db/typed-rows.ts'
import { AttemptLimitError, type AttemptPurpose, AuthenticationError, RateLimitedError } from '../errors.ts'
import { passwordKey } from './passwords.ts'
import { hashToken, newToken } from './tokens.ts'
import { CHALLENGE_TTL_SECONDS, hashRecoveryCode, readChallenge, signChallenge, totpStep } from './two-factor.ts'

export type TokenBody = { token: string; token_type: 'Bearer'; token_id: string; expires_at: string }
export type ChallengeBody = { two_factor: true; challenge_token: string; expires_at: string }

/** A token the database issued by one of the pre-sign-in functions (its id and expiry; the secret is ours). */
export const IssuedRow = rowType(Type.Object({ failure: NullableString, id: NullableString, expires_at: NullableString }))
const ClaimedSignIn = rowType(
  Type.Object({
    allowed: Type.Boolean(),
    retry_after_seconds: Type.Integer(),
    ticket: NullableString,
    password_params: NullableString,
  }),
)
const SignedIn = rowType(
  Type.Object({
    failure: NullableString,
    two_factor: Type.Union([Type.Boolean(), Type.Null()]),
    id: NullableString,
    expires_at: NullableString,
  }),
)
const ClaimedTwoFactor = rowType(
  Type.Object({
    failure: NullableString,
    retry_after_seconds: Type.Union([Type.Integer(), Type.Null()]),
    window_id: NullableString,
    totp_secret: Type.Union([Bytes, Type.Null()]),
  }),
)

const REFUSALS: Record<AttemptPurpose, string> = {
  sign_in: 'Too many failed sign-ins for this email; try again later',
  two_factor: 'Too many wrong two-factor codes for this user; try again later',
}

/** A token's secret, made here; the database stores its SHA-256 only. */
export function newIssuedToken(): { token: string; hash: Buffer } {
  const token = newToken()
  return { token, hash: hashToken(token) }
}

export function tokenBody(token: string, row: { id: string | null; expires_at: string | null }): TokenBody {
  if (row.id === null || row.expires_at === null) throw new TypeError('the database issued no token')
  return { token, token_type: 'Bearer', token_id: row.id, expires_at: row.expires_at }
}

/**
 * Runs `query` in a transaction that first tells the audit log where the request came from
 * (crm.client_address, read by crm.audit_write for user.signed_in and user.sign_in_failed); without
 * a well-formed address, as one statement.
 */
function atClientAddress<T>(
  db: CommonQueryMethods,
  address: string | undefined,
  query: (db: CommonQueryMethods) => Promise<T>,
): Promise<T> {
  if (address === undefined || isIP(address) === 0) return query(db)
  return db.transaction(async (transaction) => {
    await transaction.query(sql.unsafe`select set_config('crm.client_address', ${address}, true)`)
    return query(transaction)
  })
}

const invalidCredentials = () => new AuthenticationError('invalid_credentials', 'The email or password is wrong')

/**
 * Password step. Unknown email and wrong password take the same path and the same time: both claim
 * an attempt for the email first, both derive a key with scrypt, and both have it compared by the
 * database. A right password gives its attempt back.
 */
export async function signInWithPassword(
  db: CommonQueryMethods,
  config: Config,
  input: { email: string; password: string; device_name: string; client_address?: string },
  kind: 'token' | 'session' = 'token',
): Promise<TokenBody | ChallengeBody> {
  const email = input.email.trim().toLowerCase()
  const claim = await db.one(
    sql.type(ClaimedSignIn)`select allowed, retry_after_seconds, ticket, password_params from crm.claim_sign_in(${email})`,
  )
  if (!claim.allowed) throw new AttemptLimitError('sign_in', claim.retry_after_seconds, REFUSALS.sign_in)
  const key = await passwordKey(input.password, claim.password_params)
  const issued = newIssuedToken()
  const result = await atClientAddress(db, input.client_address, (connection) =>
    connection.one(sql.type(SignedIn)`
      select failure, two_factor, id, expires_at
        from crm.sign_in(${claim.ticket}, ${key}, ${kind}, ${input.device_name}, ${sql.binary(issued.hash)},
                         make_interval(days => ${config.tokenTtlDays}), make_interval(secs => ${CHALLENGE_TTL_SECONDS}))
    `),
  )
  switch (result.failure) {
    case null:
      break
    case 'user_suspended':
      throw new AuthenticationError('user_suspended', 'The user is suspended')
    case 'api_access_disabled':
      throw new AuthenticationError('api_access_disabled', 'API access is turned off for this user')
    default:
      throw invalidCredentials()
  }
  if (result.two_factor) {
    if (result.id === null || result.expires_at === null) throw new TypeError('the database made no challenge')
    return {
      two_factor: true,
      challenge_token: await signChallenge(config.appSecret, result.id, new Date(result.expires_at)),
      expires_at: result.expires_at,
    }
  }
  return tokenBody(issued.token, result)
}

/**
 * Second step: a TOTP code or a recovery code against a challenge. 5 tries per challenge, and every
 * code claims an attempt for its user (10 wrong codes per 15 minutes, across challenges and the
 * UI's two-factor-off form) before it is checked; both are counted by crm.claim_two_factor, which
 * commits on its own, so failures stick.
 */
export async function completeTwoFactor(
  db: CommonQueryMethods,
  config: Config,
  input: { challenge_token: string; code?: string; recovery_code?: string; client_address?: string },
  kind: 'token' | 'session' = 'token',
): Promise<TokenBody> {
  const expired = () => new AuthenticationError('challenge_expired', 'The sign-in challenge has expired or was already used; sign in again')
  const challengeId = await readChallenge(config.appSecret, input.challenge_token)
  if (!challengeId) throw expired()
  const claim = await db.one(
    sql.type(ClaimedTwoFactor)`select failure, retry_after_seconds, window_id, totp_secret from crm.claim_two_factor(${challengeId})`,
  )
  if (claim.failure === 'too_many_attempts')
    throw new RateLimitedError(CHALLENGE_TTL_SECONDS, 'too_many_attempts', 'Too many codes for this sign-in challenge; sign in again')
  if (claim.failure === 'attempt_limit') throw new AttemptLimitError('two_factor', claim.retry_after_seconds ?? 1, REFUSALS.two_factor)
  if (claim.failure !== null) throw expired()

  // The code's time step, checked here (the secret is sealed with a key derived from APP_SECRET);
  // the database accepts a step once, and only after the last accepted one.
  const step =
    input.code !== undefined && claim.totp_secret !== null ? totpStep(config.appSecret, claim.totp_secret, input.code.trim()) : null
  const recoveryHash = input.code === undefined && input.recovery_code !== undefined ? hashRecoveryCode(input.recovery_code) : null
  if (step === null && recoveryHash === null) throw new AuthenticationError('invalid_2fa_code', 'The code is wrong or was already used')
  const issued = newIssuedToken()
  const result = await atClientAddress(db, input.client_address, (connection) =>
    connection.one(sql.type(IssuedRow)`
      select failure, id, expires_at
        from crm.complete_two_factor(${challengeId}, ${claim.window_id}, ${step}, ${recoveryHash === null ? null : sql.binary(recoveryHash)},
                                     ${kind}, ${sql.binary(issued.hash)}, make_interval(days => ${config.tokenTtlDays}))
    `),
  )
  if (result.failure === 'invalid_2fa_code') throw new AuthenticationError('invalid_2fa_code', 'The code is wrong or was already used')
  if (result.failure !== null) throw expired()
  return tokenBody(issued.token, result)
}
