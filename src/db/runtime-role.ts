// The login roles requests and jobs run as. The owner (DATABASE_URL) runs migrations: it owns
// every table, and with the embedded database it is a superuser. Requests log in as crm_runtime, a
// member of crm_api (inheriting its grants and policies); the worker logs in as crm_worker, which
// holds only the worker's grants (sql/000013_runtime_confinement.sql). Neither owns anything, is a
// superuser or can bypass row-level security. Their limits are role settings, which the server
// applies itself at every login: a pooler that drops startup parameters cannot lose them.
import { createHmac } from 'node:crypto'
import pg from 'pg'

export type LoginRole = {
  name: string
  /** The limits every session of the role starts with (`alter role ... set`, as its migration sets them). */
  settings: Readonly<Record<string, string>>
}

export const RUNTIME_ROLE = 'crm_runtime'
export const WORKER_ROLE = 'crm_worker'

/** As sql/000009_least_privilege.sql sets them. */
export const RUNTIME_ROLE_SETTINGS: Readonly<Record<string, string>> = {
  statement_timeout: '30s',
  idle_in_transaction_session_timeout: '60s',
}

/** As sql/000013_runtime_confinement.sql sets them: no statement timeout (an import's staging is one long statement per chunk). */
export const WORKER_ROLE_SETTINGS: Readonly<Record<string, string>> = {
  idle_in_transaction_session_timeout: '5min',
}

const RUNTIME: LoginRole = { name: RUNTIME_ROLE, settings: RUNTIME_ROLE_SETTINGS }
const WORKER: LoginRole = { name: WORKER_ROLE, settings: WORKER_ROLE_SETTINGS }

/**
 * A login role's password, derived from the owner's (or, when the owner URL carries none, from
 * APP_SECRET): every process of one deployment computes the same one without storing it, and
 * whoever can derive it already holds the owner's password.
 */
export function loginRolePassword(ownerUrl: string, appSecret: string, role: string): string {
  const ownerPassword = decodeURIComponent(new URL(ownerUrl).password)
  return createHmac('sha256', ownerPassword || appSecret)
    .update(`${role} login password`)
    .digest('base64url')
}

export function loginRoleUrl(ownerUrl: string, role: string, password: string): string {
  const parsed = new URL(ownerUrl)
  parsed.username = role
  parsed.password = password
  return parsed.toString()
}

export function runtimeRolePassword(ownerUrl: string, appSecret: string): string {
  return loginRolePassword(ownerUrl, appSecret, RUNTIME_ROLE)
}

export function runtimeUrl(ownerUrl: string, password: string): string {
  return loginRoleUrl(ownerUrl, RUNTIME_ROLE, password)
}

/** The URL requests connect with: crm_runtime, its password and limits in place. */
export function ensureRuntimeRole(ownerUrl: string, appSecret: string): Promise<string> {
  return ensureLoginRole(ownerUrl, appSecret, RUNTIME)
}

/** The URL the worker connects with: crm_worker, its password and limits in place. */
export function ensureWorkerRole(ownerUrl: string, appSecret: string): Promise<string> {
  return ensureLoginRole(ownerUrl, appSecret, WORKER)
}

/**
 * Gives a login role (created by the migrations) the derived password and checks its limits,
 * touching the catalog only where they differ (processes starting together would otherwise fail
 * each other with "tuple concurrently updated"). Answers the URL to connect with.
 */
async function ensureLoginRole(ownerUrl: string, appSecret: string, loginRole: LoginRole): Promise<string> {
  const { name: roleName, settings } = loginRole
  const password = loginRolePassword(ownerUrl, appSecret, roleName)
  const url = loginRoleUrl(ownerUrl, roleName, password)
  const owner = new pg.Client({ connectionString: ownerUrl })
  owner.on('error', () => {})
  await owner.connect()
  try {
    const role = owner.escapeIdentifier(roleName)
    const found = await owner.query<{ rolsuper: boolean; rolbypassrls: boolean; rolcanlogin: boolean; setconfig: string[] | null }>(
      `select r.rolsuper, r.rolbypassrls, r.rolcanlogin, s.setconfig
       from pg_roles r left join pg_db_role_setting s on s.setrole = r.oid and s.setdatabase = 0
       where r.rolname = $1`,
      [roleName],
    )
    if (found.rows.length === 0) throw new Error(`the role ${roleName} is missing: run the migrations first`)
    const { rolsuper, rolbypassrls, rolcanlogin, setconfig } = found.rows[0]
    if (rolsuper || rolbypassrls) {
      throw new Error(`the role ${roleName} is a superuser or bypasses row-level security; the service refuses to run as it`)
    }
    // A role without any password yet (a fresh database) is given one without first trying to log
    // in: that attempt would only put a FATAL "password authentication failed" in the server's log.
    // pg_authid is readable by a superuser owner; any other owner finds out by trying.
    const passwordSet = await owner
      .query<{ set: boolean }>('select rolpassword is not null as set from pg_authid where rolname = $1', [roleName])
      .then(
        (result) => result.rows[0]?.set ?? null,
        () => null,
      )
    if (!rolcanlogin || passwordSet === false || !(await canLogIn(url))) {
      await alterUnlessDoneMeanwhile(owner, `alter role ${role} login password ${owner.escapeLiteral(password)}`, () => canLogIn(url))
    }
    const current = new Set(setconfig ?? [])
    for (const [name, value] of Object.entries(settings)) {
      if (current.has(`${name}=${value}`)) continue
      await alterUnlessDoneMeanwhile(
        owner,
        `alter role ${role} set ${owner.escapeIdentifier(name)} = ${owner.escapeLiteral(value)}`,
        async () => {
          const { rows } = await owner.query<{ value: boolean }>(
            `select $2 = any (s.setconfig) as value from pg_db_role_setting s join pg_roles r on r.oid = s.setrole
           where r.rolname = $1 and s.setdatabase = 0`,
            [roleName, `${name}=${value}`],
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
