// The login role requests run as. The owner (DATABASE_URL) runs migrations: it owns every table,
// so row-level security does not bind it, and with the embedded database it is a superuser. The
// runtime role is a member of crm_api (inheriting its grants and policies), owns nothing, is no
// superuser and cannot bypass row-level security. Its limits are role settings,
// which the server applies itself at every login: a pooler that drops startup parameters
// cannot lose them.
import { createHmac } from 'node:crypto'
import pg from 'pg'

export const RUNTIME_ROLE = 'crm_runtime'

/** The limits every runtime session starts with (`alter role ... set`, as sql/000009_least_privilege.sql sets them). */
export const RUNTIME_ROLE_SETTINGS: Readonly<Record<string, string>> = {
  statement_timeout: '30s',
  idle_in_transaction_session_timeout: '60s',
}

/**
 * The runtime role's password, derived from the owner's (or, when the owner URL carries none, from
 * APP_SECRET): every process of one deployment computes the same one without storing it, and
 * whoever can derive it already holds the owner's password.
 */
export function runtimeRolePassword(ownerUrl: string, appSecret: string): string {
  const ownerPassword = decodeURIComponent(new URL(ownerUrl).password)
  return createHmac('sha256', ownerPassword || appSecret)
    .update(`${RUNTIME_ROLE} login password`)
    .digest('base64url')
}

export function runtimeUrl(ownerUrl: string, password: string): string {
  const parsed = new URL(ownerUrl)
  parsed.username = RUNTIME_ROLE
  parsed.password = password
  return parsed.toString()
}

/**
 * Gives the runtime role (created by sql/000009_least_privilege.sql) the derived password and
 * checks its limits, touching the catalog only where they differ (processes starting
 * together would otherwise fail each other with "tuple concurrently updated"). Answers the URL
 * to connect with.
 */
export async function ensureRuntimeRole(ownerUrl: string, appSecret: string): Promise<string> {
  const password = runtimeRolePassword(ownerUrl, appSecret)
  const url = runtimeUrl(ownerUrl, password)
  const owner = new pg.Client({ connectionString: ownerUrl })
  owner.on('error', () => {})
  await owner.connect()
  try {
    const role = owner.escapeIdentifier(RUNTIME_ROLE)
    const found = await owner.query<{ rolsuper: boolean; rolbypassrls: boolean; rolcanlogin: boolean; setconfig: string[] | null }>(
      `select r.rolsuper, r.rolbypassrls, r.rolcanlogin, s.setconfig
       from pg_roles r left join pg_db_role_setting s on s.setrole = r.oid and s.setdatabase = 0
       where r.rolname = $1`,
      [RUNTIME_ROLE],
    )
    if (found.rows.length === 0) throw new Error(`the role ${RUNTIME_ROLE} is missing: run the migrations first`)
    const { rolsuper, rolbypassrls, rolcanlogin, setconfig } = found.rows[0]
    if (rolsuper || rolbypassrls) {
      throw new Error(`the role ${RUNTIME_ROLE} is a superuser or bypasses row-level security; requests refuse to run as it`)
    }
    if (!rolcanlogin || !(await canLogIn(url))) {
      await alterUnlessDoneMeanwhile(owner, `alter role ${role} login password ${owner.escapeLiteral(password)}`, () => canLogIn(url))
    }
    const current = new Set(setconfig ?? [])
    for (const [name, value] of Object.entries(RUNTIME_ROLE_SETTINGS)) {
      if (current.has(`${name}=${value}`)) continue
      await alterUnlessDoneMeanwhile(
        owner,
        `alter role ${role} set ${owner.escapeIdentifier(name)} = ${owner.escapeLiteral(value)}`,
        async () => {
          const { rows } = await owner.query<{ value: boolean }>(
            `select $2 = any (s.setconfig) as value from pg_db_role_setting s join pg_roles r on r.oid = s.setrole
           where r.rolname = $1 and s.setdatabase = 0`,
            [RUNTIME_ROLE, `${name}=${value}`],
          )
          return rows[0]?.value === true
        },
      )
    }
  } finally {
    await owner.end().catch(() => {})
  }
  return url
}

/** Another process starting at the same moment may alter the role first ("tuple concurrently updated"). */
async function alterUnlessDoneMeanwhile(owner: pg.Client, statement: string, done: () => Promise<boolean>): Promise<void> {
  try {
    await owner.query(statement)
  } catch (error) {
    if (!(await done())) throw error
  }
}

/** Whether the URL logs in; any failure (through a pooler, a wrong password is 08P01, not 28P01) means no. */
async function canLogIn(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 5000 })
  client.on('error', () => {})
  try {
    await client.connect()
    return true
  } catch {
    return false
  } finally {
    await client.end().catch(() => {})
  }
}
