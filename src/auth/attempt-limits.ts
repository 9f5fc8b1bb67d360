// Attempt limits on guessing: passwords per email, two-factor codes per user. The attempt is
// claimed before its check (crm.claim_attempt, sql/000008_attempt_limits.sql), so of any number
// of concurrent attempts only the allowance left is checked and the rest are refused at once. Both
// calls run as their own statement on the owner pool: a claim sticks whatever the request does next.
import Type from 'typebox'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { AttemptLimitError, type AttemptPurpose } from '../errors.ts'

export type AttemptClaim = { purpose: AttemptPurpose; subject: string; windowId: string }

const ClaimRow = rowType(Type.Object({ allowed: Type.Boolean(), retry_after_seconds: Type.Integer(), window_id: Type.String() }))

const REFUSALS: Record<AttemptPurpose, string> = {
  sign_in: 'Too many failed sign-ins for this email; try again later',
  two_factor: 'Too many wrong two-factor codes for this user; try again later',
}

/** Counts one attempt for the subject, or throws AttemptLimitError when its window's allowance is spent. */
export async function claimAttempt(db: CommonQueryMethods, purpose: AttemptPurpose, subject: string): Promise<AttemptClaim> {
  const claim = await db.one(
    sql.type(ClaimRow)`select allowed, retry_after_seconds, window_id from crm.claim_attempt(${purpose}, ${subject})`,
  )
  if (!claim.allowed) throw new AttemptLimitError(purpose, claim.retry_after_seconds, REFUSALS[purpose])
  return { purpose, subject, windowId: claim.window_id }
}

/** Gives the attempt back once its check has succeeded: a right password or code is not a failure. */
export async function releaseAttempt(db: CommonQueryMethods, claim: AttemptClaim): Promise<void> {
  await db.query(sql.unsafe`select crm.release_attempt(${claim.purpose}, ${claim.subject}, ${claim.windowId})`)
}
