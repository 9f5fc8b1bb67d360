// The password and two-factor steps of sign-in. These run before there is a user to act as, so
// they use the owner connection, and only through the pre-authentication SQL functions.

import Type from 'typebox'
import type { Config } from '../config.ts'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { Bytes, NullableString, rowType } from '../db/typed-rows.ts'
import { AuthenticationError, RateLimitedError } from '../errors.ts'
import { claimAttempt, releaseAttempt } from './attempt-limits.ts'
import { verifyPassword } from './passwords.ts'
import { hashToken, newToken } from './tokens.ts'
import { CHALLENGE_MAX_TRIES, CHALLENGE_TTL_SECONDS, hashRecoveryCode, readChallenge, signChallenge, totpStep } from './two-factor.ts'

export type TokenBody = { token: string; token_type: 'Bearer'; token_id: string; expires_at: string }
export type ChallengeBody = { two_factor: true; challenge_token: string; expires_at: string }

const IssuedRow = rowType(Type.Object({ id: Type.String(), expires_at: Type.String() }))
const UserRow = rowType(
  Type.Object({
    id: Type.String(),
    password_hash: NullableString,
    suspended_at: NullableString,
    api_access: Type.Boolean(),
    two_factor: Type.Boolean(),
  }),
)
const ChallengeRow = rowType(Type.Object({ user_id: Type.String(), device_name: Type.String(), attempts: Type.Integer() }))
const SealedSecretRow = rowType(Type.Object({ secret_encrypted: Bytes }))

export async function issueToken(
  db: CommonQueryMethods,
  config: Config,
  userId: string,
  kind: 'token' | 'session',
  name: string,
  ttlDays = config.tokenTtlDays,
): Promise<TokenBody> {
  const token = newToken()
  const row = await db.one(sql.type(IssuedRow)`
    select id, expires_at from crm.issue_token(${userId}, ${kind}, ${name}, ${sql.binary(hashToken(token))}, make_interval(days => ${ttlDays}))
  `)
  return { token, token_type: 'Bearer', token_id: row.id, expires_at: row.expires_at }
}

const invalidCredentials = () => new AuthenticationError('invalid_credentials', 'The email or password is wrong')

/**
 * Password step. Unknown email and wrong password take the same path and the same time: both claim
 * an attempt for the email first and both run scrypt. A right password gives its attempt back.
 */
export async function signInWithPassword(
  db: CommonQueryMethods,
  config: Config,
  input: { email: string; password: string; device_name: string },
  kind: 'token' | 'session' = 'token',
): Promise<TokenBody | ChallengeBody> {
  const email = input.email.trim().toLowerCase()
  const attempt = await claimAttempt(db, 'sign_in', email)

  const user = await db.maybeOne(sql.type(UserRow)`
    select u.id, u.password_hash, u.suspended_at, u.api_access, t.confirmed_at is not null as two_factor
    from crm.users u left join crm.user_totp t on t.user_id = u.id
    where u.email = ${email}
  `)
  const passwordMatches = await verifyPassword(input.password, user?.password_hash ?? null)
  if (!user || !passwordMatches) throw invalidCredentials()
  await releaseAttempt(db, attempt)
  if (user.suspended_at) throw new AuthenticationError('user_suspended', 'The user is suspended')
  if (kind === 'token' && !user.api_access) throw new AuthenticationError('api_access_disabled', 'API access is turned off for this user')

  if (user.two_factor) {
    const challenge = await db.one(sql.type(IssuedRow)`
      insert into crm.two_factor_challenges (user_id, device_name, expires_at)
      values (${user.id}, ${input.device_name}, now() + make_interval(secs => ${CHALLENGE_TTL_SECONDS}))
      returning id, expires_at
    `)
    return {
      two_factor: true,
      challenge_token: await signChallenge(config.appSecret, challenge.id, new Date(challenge.expires_at)),
      expires_at: challenge.expires_at,
    }
  }
  return issueToken(db, config, user.id, kind, input.device_name)
}

/**
 * Second step: a TOTP code or a recovery code against a challenge. 5 tries per challenge, and every
 * code claims an attempt for its user (10 wrong codes per 15 minutes, across challenges and the
 * UI's two-factor-off form) before it is checked.
 */
export async function completeTwoFactor(
  db: CommonQueryMethods,
  config: Config,
  input: { challenge_token: string; code?: string; recovery_code?: string },
  kind: 'token' | 'session' = 'token',
): Promise<TokenBody> {
  const expired = () => new AuthenticationError('challenge_expired', 'The sign-in challenge has expired or was already used; sign in again')
  const challengeId = await readChallenge(config.appSecret, input.challenge_token)
  if (!challengeId) throw expired()
  // The try is counted in its own statement (autocommit), so failures stick.
  const challenge = await db.maybeOne(sql.type(ChallengeRow)`
    update crm.two_factor_challenges set attempts = attempts + 1
    where id = ${challengeId} and completed_at is null and expires_at > now()
    returning user_id, device_name, attempts
  `)
  if (!challenge) throw expired()
  if (challenge.attempts > CHALLENGE_MAX_TRIES)
    throw new RateLimitedError(CHALLENGE_TTL_SECONDS, 'too_many_attempts', 'Too many codes for this sign-in challenge; sign in again')
  const attempt = await claimAttempt(db, 'two_factor', challenge.user_id)

  let accepted = false
  if (input.code !== undefined) {
    const sealed = await db.maybeOneFirst(
      sql.type(
        SealedSecretRow,
      )`select secret_encrypted from crm.user_totp where user_id = ${challenge.user_id} and confirmed_at is not null`,
    )
    const step = sealed === null ? null : totpStep(config.appSecret, sealed, input.code.trim())
    // A code signs in once: its step must come after the last accepted one (the database refuses
    // anything else; see crm.tg_user_totp__steps_only_forward).
    accepted =
      step !== null &&
      null !==
        (await db.maybeOne(sql.unsafe`
      update crm.user_totp set last_used_step = ${step}
      where user_id = ${challenge.user_id} and confirmed_at is not null and (last_used_step is null or last_used_step < ${step})
      returning 1
    `))
  } else if (input.recovery_code !== undefined) {
    accepted =
      null !==
      (await db.maybeOne(sql.unsafe`
      update crm.recovery_codes set used_at = now()
      where user_id = ${challenge.user_id} and code_hash = ${sql.binary(hashRecoveryCode(input.recovery_code))} and used_at is null
      returning 1
    `))
  }
  if (!accepted) throw new AuthenticationError('invalid_2fa_code', 'The code is wrong or was already used')
  await releaseAttempt(db, attempt)
  const completed =
    null !==
    (await db.maybeOne(sql.unsafe`
    update crm.two_factor_challenges set completed_at = now() where id = ${challengeId} and completed_at is null returning 1
  `))
  if (!completed) throw expired()
  return issueToken(db, config, challenge.user_id, kind, challenge.device_name)
}
