// Sign-up (docs/api.md section 3): a new user and a new workspace whose admin they are, trial starting
// now (14 days, crm.sign_up), answered with a bearer token. There is no caller yet: it runs as the
// runtime role, through crm.sign_up alone.

import Type from 'typebox'
import { hashPassword, passwordProblem } from '../auth/passwords.ts'
import { newIssuedToken, type TokenBody, tokenBody } from '../auth/sign-in.ts'
import type { Config } from '../config.ts'
import { type CommonQueryMethods, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { ValidationError } from '../errors.ts'

/** "Acme GmbH & Co." → "acme-gmbh-co": lower-case ASCII words joined by hyphens, at most 50 characters. */
export function slugBase(name: string): string {
  const slug = name
    .normalize('NFKD')
    .replace(/[\u0300-\u036f]/g, '')
    .toLowerCase()
    .replace(/ß/g, 'ss')
    .replace(/[^a-z0-9]+/g, '-')
    .slice(0, 50)
    .replace(/^-+|-+$/g, '')
  return slug === '' ? 'workspace' : slug
}

export type SignUpInput = { email: string; password: string; name: string; workspace_name: string }

const SignedUp = rowType(Type.Object({ id: Type.String(), expires_at: Type.String(), workspace_slug: Type.String() }))

/** One statement (crm.sign_up, as the runtime role): the user, their workspace with them as admin, and a token. */
export async function signUp(db: CommonQueryMethods, config: Config, input: SignUpInput): Promise<TokenBody & { workspace_slug: string }> {
  const email = input.email.trim().toLowerCase()
  const problem = passwordProblem(input.password, email)
  if (problem) throw new ValidationError(`password ${problem}`, [{ pointer: '/password', code: 'invalid', message: problem }])
  const passwordHash = await hashPassword(input.password)
  const workspaceName = input.workspace_name.trim()
  const issued = newIssuedToken()
  const row = await db.one(sql.type(SignedUp)`
    select id, expires_at, workspace_slug
      from crm.sign_up(${email}, ${input.name.trim()}, ${passwordHash}, ${workspaceName}, ${slugBase(workspaceName)},
                       ${sql.binary(issued.hash)}, make_interval(days => ${config.tokenTtlDays}))
  `)
  return { ...tokenBody(issued.token, row), workspace_slug: row.workspace_slug }
}
