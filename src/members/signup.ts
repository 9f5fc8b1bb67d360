// Sign-up (API.md section 3): a new user and a new workspace whose admin they are, trial starting
// now, answered with a bearer token. Runs as the owner role: there is no caller yet.

import Type from 'typebox'
import { hashPassword, passwordProblem } from '../auth/passwords.ts'
import { issueToken, type TokenBody } from '../auth/sign-in.ts'
import type { Config } from '../config.ts'
import { databaseErrorOf } from '../db/database-errors.ts'
import { type DatabasePool, sql } from '../db/pool.ts'
import { IdRow, rowType } from '../db/typed-rows.ts'
import { ValidationError } from '../errors.ts'

export const TRIAL_DAYS = 14

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

export async function signUp(pool: DatabasePool, config: Config, input: SignUpInput): Promise<TokenBody & { workspace_slug: string }> {
  const email = input.email.trim().toLowerCase()
  const problem = passwordProblem(input.password, email)
  if (problem) throw new ValidationError(`password ${problem}`, [{ pointer: '/password', code: 'invalid', message: problem }])
  const passwordHash = await hashPassword(input.password)

  return pool.transaction(async (db) => {
    const userId = await db.oneFirst(sql.type(IdRow)`
      insert into crm.users (email, name, password_hash) values (${email}, ${input.name.trim()}, ${passwordHash}) returning id
    `)
    const workspace = await createWorkspace(db, input.workspace_name.trim())
    await db.query(sql.unsafe`
      insert into crm.memberships (workspace_id, user_id, role_id)
      select ${workspace.id}, ${userId}, id from crm.roles where workspace_id = ${workspace.id} and name = 'admin'
    `)
    await db.query(sql.unsafe`update crm.users set last_workspace_id = ${workspace.id} where id = ${userId}`)
    return { ...(await issueToken(db, config, userId, 'token', 'sign-up')), workspace_slug: workspace.slug }
  })
}

const WorkspaceRow = rowType(Type.Object({ id: Type.String(), slug: Type.String() }))

/** Takes the first free slug; two sign-ups racing for the same one retry inside a savepoint. */
async function createWorkspace(
  db: Parameters<Parameters<DatabasePool['transaction']>[0]>[0],
  name: string,
): Promise<{ id: string; slug: string }> {
  const base = slugBase(name)
  for (let attempt = 1; ; attempt++) {
    try {
      return await db.transaction(async (savepoint) =>
        savepoint.one(sql.type(WorkspaceRow)`
          insert into crm.workspaces (slug, name, trial_ends_at)
          values (crm.free_workspace_slug(${base}), ${name}, now() + make_interval(days => ${TRIAL_DAYS}))
          returning id, slug
        `),
      )
    } catch (error) {
      if (attempt < 5 && databaseErrorOf(error)?.constraint === 'workspaces_slug_key') continue
      throw error
    }
  }
}
