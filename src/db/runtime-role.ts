// The login roles requests and jobs run as. The owner (DATABASE_URL) runs migrations: it owns
// every table (with the embedded database it is a superuser, and migrate hands what it made to
// crm_owner, sql/definitions/10_foundation.sql). The migrations grant what
// requests may do to the role crm_runtime and what the worker may do to crm_worker
// (sql/migrations/000001_foundation.sql, sql/definitions/); the service logs in as a
// member of each made for its database alone, crm_runtime_<database> and crm_worker_<database>.
// Roles are cluster-wide: when two deployments (two databases) share one PostgreSQL cluster and
// both logged in as crm_runtime itself, each start set the password the other's connections were
// using. The groups, though, are shared and hold each database's grants: each database lets its
// own login roles connect, by name, and nobody else (sql/definitions/10_foundation.sql), or one deployment's runtime
// login would call the other's functions. Neither login role is a superuser, owns anything or can
// bypass row-level security. Their limits are role settings, which the server applies itself at
// every login: a pooler that drops startup parameters cannot lose them.
import { createHash, createHmac } from 'node:crypto'
import pg from 'pg'

export type LoginRole = {
  /** The role the migrations grant to; the login role is a member of it. */
  group: string
  /** The limits every session of the role starts with (`alter role ... set`, as its migration sets them). */
  settings: Readonly<Record<string, string>>
}

export const RUNTIME_ROLE = 'crm_runtime'
export const WORKER_ROLE = 'crm_worker'

/** As sql/migrations/000001_foundation.sql sets them. */
export const RUNTIME_ROLE_SETTINGS: Readonly<Record<string, string>> = {
  statement_timeout: '30s',
  idle_in_transaction_session_timeout: '60s',
}

/** As sql/migrations/000001_foundation.sql sets them: no statement timeout (an import's staging is one long statement per chunk). */
export const WORKER_ROLE_SETTINGS: Readonly<Record<string, string>> = {
  idle_in_transaction_session_timeout: '5min',
}

const RUNTIME: LoginRole = { group: RUNTIME_ROLE, settings: RUNTIME_ROLE_SETTINGS }
const WORKER: LoginRole = { group: WORKER_ROLE, settings: WORKER_ROLE_SETTINGS }

/** PostgreSQL's limit on a name, in bytes. */
const NAME_BYTES = 63

/**
 * The login role of one database: `crm_runtime_crm` for the database `crm`; a name that is not
 * plain lower-case letters, digits and underscores, or too long, is replaced by 16 hex digits of
 * its SHA-256. Each role also carries a comment naming its database, so an unlikely clash of two
 * names is refused at start instead of shared (see ensureLoginRole).
 */
export function loginRoleName(group: string, database: string): string {
  const plain = `${group}_${database}`
  if (/^[a-z0-9_]+$/.test(database) && plain.length <= NAME_BYTES) return plain
  return `${group}_${createHash('sha256').update(database).digest('hex').slice(0, 16)}`
}

function roleComment(group: string, database: string): string {
  return `The ${group} login of the database ${JSON.stringify(database)} (made by the service at start).`
}

/** A LIKE pattern matching every roleComment: such roles belong to one database, not to the schema. */
export const LOGIN_ROLE_COMMENT_PATTERN = 'The % login of the database % (made by the service at start).'

/**
 * A login role's password, derived from the owner's (or, when the owner URL carries none, from
 * APP_SECRET) and the role's name: every process of one deployment computes the same one without
 * storing it, and whoever can derive it already holds the owner's password.
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

/** A login role as the service sets it up: its name, its password and the URL to connect with. */
export type LoginCredentials = { name: string; password: string; url: string }

/** The URL requests connect with: crm_runtime_<database>, its password and limits in place. */
export async function ensureRuntimeRole(ownerUrl: string, appSecret: string): Promise<string> {
  return (await ensureLoginRole(ownerUrl, appSecret, RUNTIME)).url
}

/** The URL the worker connects with: crm_worker_<database>, its password and limits in place. */
export async function ensureWorkerRole(ownerUrl: string, appSecret: string): Promise<string> {
  return (await ensureLoginRole(ownerUrl, appSecret, WORKER)).url
}

/** Both login roles, set up as at start (`crm login-roles` prints them for a pooler's user list). */
export async function ensureLoginRoles(
  ownerUrl: string,
  appSecret: string,
): Promise<{ runtime: LoginCredentials; worker: LoginCredentials }> {
  return { runtime: await ensureLoginRole(ownerUrl, appSecret, RUNTIME), worker: await ensureLoginRole(ownerUrl, appSecret, WORKER) }
}

/**
 * Makes the database's login role a member of its group role (created by the migrations) with the
 * derived password and the group's limits, touching the catalog only where something differs
 * (processes starting together would otherwise fail each other with "tuple concurrently updated").
 */
async function ensureLoginRole(ownerUrl: string, appSecret: string, loginRole: LoginRole): Promise<LoginCredentials> {
  const { group, settings } = loginRole
  const owner = new pg.Client({ connectionString: ownerUrl })
  owner.on('error', () => {})
  await owner.connect()
  try {
    const database = (await owner.query<{ name: string }>('select current_database() as name')).rows[0].name
    const roleName = loginRoleName(group, database)
    const password = loginRolePassword(ownerUrl, appSecret, roleName)
    const url = loginRoleUrl(ownerUrl, roleName, password)
    const role = owner.escapeIdentifier(roleName)
    const comment = roleComment(group, database)
    const groupFound = await owner.query('select from pg_roles where rolname = $1', [group])
    if (groupFound.rows.length === 0) throw new Error(`the role ${group} is missing: run the migrations first`)

    const state = () =>
      owner.query<{
        rolsuper: boolean
        rolbypassrls: boolean
        rolcanlogin: boolean
        setconfig: string[] | null
        comment: string | null
        member: boolean
      }>(
        `select r.rolsuper, r.rolbypassrls, r.rolcanlogin, s.setconfig, shobj_description(r.oid, 'pg_authid') as comment,
                exists (select from pg_auth_members m where m.member = r.oid and m.roleid = (select oid from pg_roles where rolname = $2)) as member
           from pg_roles r left join pg_db_role_setting s on s.setrole = r.oid and s.setdatabase = 0
          where r.rolname = $1`,
        [roleName, group],
      )
    let found = await state()
    if (found.rows.length === 0) {
      // A role without any password yet would only put a FATAL "password authentication failed"
      // in the server's log when tried: it is created with its password.
      await alterUnlessDoneMeanwhile(
        owner,
        `create role ${role} login inherit nosuperuser nobypassrls nocreatedb nocreaterole noreplication password ${owner.escapeLiteral(password)}`,
        async () => (await state()).rows.length === 1,
      )
      found = await state()
    }
    const current = found.rows[0]
    if (current.comment !== null && current.comment !== comment) {
      throw new Error(
        `the role ${roleName} belongs to another database (${current.comment}); the service of this database would reset its password. Drop or rename that role, or set RUNTIME_DATABASE_URL and WORKER_DATABASE_URL to roles of your own`,
      )
    }
    if (current.rolsuper || current.rolbypassrls) {
      throw new Error(`the role ${roleName} is a superuser or bypasses row-level security; the service refuses to run as it`)
    }
    // A role just made, or one an operator made by hand, is marked as this database's.
    if (current.comment === null)
      await alterUnlessDoneMeanwhile(
        owner,
        `comment on role ${role} is ${owner.escapeLiteral(comment)}`,
        async () => (await state()).rows[0]?.comment === comment,
      )
    if (!current.member)
      await alterUnlessDoneMeanwhile(
        owner,
        `grant ${owner.escapeIdentifier(group)} to ${role}`,
        async () => (await state()).rows[0]?.member === true,
      )
    if (!current.rolcanlogin || !(await canLogIn(url))) {
      await alterUnlessDoneMeanwhile(owner, `alter role ${role} login password ${owner.escapeLiteral(password)}`, () => canLogIn(url))
    }
    // PUBLIC has no CONNECT on the database (sql/definitions/10_foundation.sql): the role is let in by name.
    await admitToDatabase(owner, [roleName])
    const set = new Set(current.setconfig ?? [])
    for (const [name, value] of Object.entries(settings)) {
      if (set.has(`${name}=${value}`)) continue
      await alterUnlessDoneMeanwhile(
        owner,
        `alter role ${role} set ${owner.escapeIdentifier(name)} = ${owner.escapeLiteral(value)}`,
        async () => (await state()).rows[0]?.setconfig?.includes(`${name}=${value}`) === true,
      )
    }
    return { name: roleName, password, url }
  } finally {
    await owner.end().catch(() => {})
  }
}

/**
 * Lets the given login roles, and no one else, connect to the owner's database (sql/definitions/10_foundation.sql): the
 * groups they belong to hold their grants in every database of the cluster, so CONNECT is what
 * keeps one deployment's logins out of another's database. False when the owner may not change
 * that (it does not own the database): a DBA then does it (docs/operations.md).
 */
async function admitToDatabase(owner: pg.Client, logins: string[]): Promise<boolean> {
  // Its GRANTs wait for each other (an advisory lock), but not for a role altered meanwhile.
  const { rows } = await retryingConcurrentUpdate(() =>
    owner.query<{ admitted: boolean }>('select crm.admit_to_database($1::text[]) as admitted', [logins]),
  )
  return rows[0].admitted
}

/** The login roles an operator named (RUNTIME_DATABASE_URL, WORKER_DATABASE_URL), by the user of each URL. */
export function operatorLogins(urls: (string | null)[]): string[] {
  return urls.filter((url): url is string => url !== null).map((url) => decodeURIComponent(new URL(url).username))
}

/**
 * At every migration run: the database's own login roles (those made for it, by name and
 * comment, and those the operator named) keep CONNECT and PUBLIC loses it, on a database upgraded,
 * copied or restored alike.
 */
export async function admitOwnLoginRoles(owner: pg.Client, operatorNamed: string[] = []): Promise<boolean> {
  const database = (await owner.query<{ name: string }>('select current_database() as name')).rows[0].name
  const own = [RUNTIME_ROLE, WORKER_ROLE].map((group) => ({ name: loginRoleName(group, database), comment: roleComment(group, database) }))
  const { rows } = await owner.query<{ name: string }>(
    `select r.rolname as name from pg_roles r, unnest($1::text[], $2::text[]) own(name, comment)
      where r.rolname = own.name and shobj_description(r.oid, 'pg_authid') = own.comment`,
    [own.map((role) => role.name), own.map((role) => role.comment)],
  )
  return admitToDatabase(owner, [...rows.map((row) => row.name), ...operatorNamed])
}

/**
 * Another process starting at the same moment may alter the role first: then the statement fails,
 * and either the other did the same (done) or, with "tuple concurrently updated", something else of
 * the role's (a different setting of the same pg_db_role_setting row, say), which
 * retryingConcurrentUpdate waits out.
 */
async function alterUnlessDoneMeanwhile(owner: pg.Client, statement: string, done: () => Promise<boolean>): Promise<void> {
  try {
    await retryingConcurrentUpdate(() => owner.query(statement))
  } catch (error) {
    if (!(await done())) throw error
  }
}

/**
 * Runs a catalog statement again when it failed with "tuple concurrently updated": two updates of
 * one catalog row at once, the second refused; once the first has committed, it goes through.
 */
async function retryingConcurrentUpdate<T>(run: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await run()
    } catch (error) {
      if (!(attempt < CATALOG_RETRIES && /tuple concurrently updated/.test((error as Error)?.message ?? ''))) throw error
    }
  }
}

const CATALOG_RETRIES = 5

/** Whether the URL logs in; any failure (through a pooler, a wrong password is 08P01, not 28P01) means no. */
export async function canLogIn(url: string): Promise<boolean> {
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
