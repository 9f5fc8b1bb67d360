// Platform operator commands (docs/api.md section 10). They run as the owner role, directly in SQL:
// the same tables, triggers and constraints the API obeys (seats, built-in roles, last admin).
// Modules that load the service's heavier libraries (slonik, TypeBox) are imported by the command
// or the error path that needs them: every `crm` command, `help` and a mistyped option included,
// then starts in about a fifth of the time (docs/performance.md, "Test suite").
import pg from 'pg'
import { hashPassword, passwordProblem } from '../auth/passwords.ts'
import { hashRecoveryCode, newRecoveryCodes, newTotpSecret, otpauthUri, sealTotpSecret } from '../auth/two-factor.ts'
import { provisionDatabase } from '../db/provision.ts'
import { type CliContext, CliError, type Command } from './command.ts'

async function withDatabase<T>(context: CliContext, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const config = context.config()
  const database = await provisionDatabase({ databaseUrl: config.databaseUrl, dataDir: config.dataDir })
  try {
    const client = new pg.Client({ connectionString: database.url })
    await client.connect()
    try {
      const { rows } = await client.query("select to_regclass('crm.workspaces') is not null as ready")
      if (!rows[0].ready) throw new Error('the database has no schema yet: run crm migrate (make run does it too)')
      await client.query('begin')
      const result = await fn(client)
      await client.query('commit')
      return result
    } catch (error) {
      await client.query('rollback').catch(() => {})
      const { databaseErrorOf } = await import('../db/database-errors.ts')
      const fields = databaseErrorOf(error)
      if (fields?.code === '23505') throw new Error(`already exists: ${fields.detail ?? fields.constraint}`)
      if (fields?.code === '23514') throw new Error(`invalid value (${fields.constraint})`)
      throw error
    } finally {
      await client.end()
    }
  } finally {
    await database.stop()
  }
}

function required(values: Record<string, unknown>, ...names: string[]): void {
  const missing = names.filter((name) => values[name] === undefined || values[name] === '')
  if (missing.length) throw new CliError('invalid_arguments', `missing ${missing.map((name) => `--${name}`).join(', ')}`)
}

function wholeNumber(value: unknown, name: string): number | undefined {
  if (value === undefined) return undefined
  if (typeof value !== 'string' || !/^\d+$/.test(value)) throw new CliError('invalid_arguments', `--${name} must be a whole number`)
  return Number(value)
}

async function workspaceId(client: pg.Client, slug: string): Promise<string> {
  const { rows } = await client.query('select id from crm.workspaces where slug = $1', [slug])
  if (!rows[0]) throw new Error(`no workspace with slug "${slug}"`)
  return rows[0].id
}

async function userByEmail(client: pg.Client, email: string): Promise<{ id: string; email: string }> {
  const { rows } = await client.query('select id, email from crm.users where email = lower($1)', [email])
  if (!rows[0]) throw new Error(`no user with email "${email}"`)
  return rows[0]
}

async function roleId(client: pg.Client, workspace: string, role: string): Promise<string> {
  const { rows } = await client.query('select id from crm.roles where workspace_id = $1 and name = $2', [workspace, role])
  if (!rows[0]) throw new Error(`no role "${role}" in this workspace`)
  return rows[0].id
}

async function addMembership(client: pg.Client, workspace: string, userId: string, role: string, team?: string): Promise<void> {
  await client.query('insert into crm.memberships (workspace_id, user_id, role_id) values ($1, $2, $3)', [
    workspace,
    userId,
    await roleId(client, workspace, role),
  ])
  if (team) {
    const { rows } = await client.query(
      `insert into crm.teams (workspace_id, name) values ($1, $2) on conflict (workspace_id, name) do update set name = excluded.name returning id`,
      [workspace, team],
    )
    await client.query('insert into crm.team_members (workspace_id, team_id, user_id) values ($1, $2, $3)', [workspace, rows[0].id, userId])
  }
}

const timeSql = (column: string) => `to_char(${column} at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') as ${column.split('.').pop()}`

export const commands: Record<string, Command> = {
  'workspace create': {
    usage: 'workspace create --slug S --name N [--plan free|pro] [--trial-days N] [--seats N]',
    summary: 'create a workspace (trial 14 days unless told; 0 for none)',
    options: {
      slug: { type: 'string' },
      name: { type: 'string' },
      plan: { type: 'string' },
      'trial-days': { type: 'string' },
      seats: { type: 'string' },
    },
    run: async (context, values) => {
      required(values, 'slug', 'name')
      const plan = values.plan ?? 'free'
      if (plan !== 'free' && plan !== 'pro') throw new CliError('invalid_arguments', '--plan must be free or pro')
      const trialDays = wholeNumber(values['trial-days'], 'trial-days') ?? 14
      const seats = wholeNumber(values.seats, 'seats') ?? null
      const row = await withDatabase(context, async (client) => {
        const { rows } = await client.query(
          `insert into crm.workspaces (slug, name, plan, trial_ends_at, seat_limit)
           values ($1, $2, $3, case when $4::int > 0 then now() + make_interval(days => $4::int) end, $5)
           returning id, slug, name, plan, ${timeSql('trial_ends_at')}, seat_limit, ${timeSql('created_at')}`,
          [values.slug, values.name, plan, trialDays, seats],
        )
        return rows[0]
      })
      context.print(`created workspace ${row.slug} (${row.id})`, row)
    },
  },
  'workspace set-plan': {
    usage: 'workspace set-plan --slug S --plan free|pro',
    summary: "change a workspace's plan",
    options: { slug: { type: 'string' }, plan: { type: 'string' } },
    run: async (context, values) => {
      required(values, 'slug', 'plan')
      if (values.plan !== 'free' && values.plan !== 'pro') throw new CliError('invalid_arguments', '--plan must be free or pro')
      const row = await withDatabase(context, async (client) => {
        const { rows } = await client.query(`update crm.workspaces set plan = $2 where slug = $1 returning id, slug, plan`, [
          values.slug,
          values.plan,
        ])
        if (!rows[0]) throw new Error(`no workspace with slug "${values.slug}"`)
        return rows[0]
      })
      context.print(`workspace ${row.slug} is now on ${row.plan}`, row)
    },
  },
  'user create': {
    usage: 'user create --email E --name N --password P [--workspace S --role R] [--team T]',
    summary: 'create a user, optionally as a member of a workspace',
    options: {
      email: { type: 'string' },
      name: { type: 'string' },
      password: { type: 'string' },
      workspace: { type: 'string' },
      role: { type: 'string' },
      team: { type: 'string' },
    },
    run: async (context, values) => {
      required(values, 'email', 'name', 'password')
      const problem = passwordProblem(values.password, values.email)
      if (problem) throw new Error(`--password ${problem}`)
      const passwordHash = await hashPassword(values.password)
      const row = await withDatabase(context, async (client) => {
        const { rows } = await client.query(
          `insert into crm.users (email, name, password_hash) values (lower($1), $2, $3) returning id, email, name, api_access, ${timeSql('created_at')}`,
          [values.email, values.name, passwordHash],
        )
        if (values.workspace)
          await addMembership(client, await workspaceId(client, values.workspace), rows[0].id, values.role ?? 'member', values.team)
        return { ...rows[0], workspace: values.workspace ?? null, role: values.workspace ? (values.role ?? 'member') : null }
      })
      context.print(`created user ${row.email} (${row.id})`, row)
    },
  },
  'user api-access': {
    usage: 'user api-access --email E --on|--off',
    summary: "turn a user's API access on or off (their tokens stop at once)",
    options: { email: { type: 'string' }, on: { type: 'boolean' }, off: { type: 'boolean' } },
    run: async (context, values) => {
      required(values, 'email')
      if (Boolean(values.on) === Boolean(values.off)) throw new CliError('invalid_arguments', 'give exactly one of --on or --off')
      const row = await withDatabase(context, async (client) => {
        const { rows } = await client.query(
          'update crm.users set api_access = $2 where email = lower($1) returning id, email, api_access',
          [values.email, Boolean(values.on)],
        )
        if (!rows[0]) throw new Error(`no user with email "${values.email}"`)
        return rows[0]
      })
      context.print(`API access for ${row.email} is ${row.api_access ? 'on' : 'off'}`, row)
    },
  },
  'user suspend': userSuspension(true),
  'user unsuspend': userSuspension(false),
  'user totp enable': {
    usage: 'user totp enable --email E',
    summary: 'turn on two-factor sign-in; prints the otpauth URI, secret and 10 recovery codes',
    options: { email: { type: 'string' } },
    run: async (context, values) => {
      required(values, 'email')
      const config = context.config()
      const secret = newTotpSecret()
      const recoveryCodes = newRecoveryCodes()
      const user = await withDatabase(context, async (client) => {
        const user = await userByEmail(client, values.email)
        await client.query(
          `insert into crm.user_totp (user_id, secret_encrypted, confirmed_at) values ($1, $2, now())
           on conflict (user_id) do update set secret_encrypted = excluded.secret_encrypted, confirmed_at = now(), created_at = now()`,
          [user.id, sealTotpSecret(config.appSecret, secret)],
        )
        await client.query('delete from crm.recovery_codes where user_id = $1', [user.id])
        for (const code of recoveryCodes)
          await client.query('insert into crm.recovery_codes (user_id, code_hash) values ($1, $2)', [user.id, hashRecoveryCode(code)])
        return user
      })
      const result = { otpauth_uri: otpauthUri(user.email, secret), secret, recovery_codes: recoveryCodes }
      context.print(
        [
          `two-factor is on for ${user.email}`,
          `otpauth URI: ${result.otpauth_uri}`,
          `secret: ${secret}`,
          'recovery codes (each works once):',
          ...recoveryCodes.map((code) => `  ${code}`),
        ].join('\n'),
        result,
      )
    },
  },
  'member add': {
    usage: 'member add --workspace S --email E [--role R]',
    summary: 'add an existing user to a workspace (role member unless told)',
    options: { workspace: { type: 'string' }, email: { type: 'string' }, role: { type: 'string' } },
    run: async (context, values) => {
      required(values, 'workspace', 'email')
      const row = await withDatabase(context, async (client) => {
        const workspace = await workspaceId(client, values.workspace)
        const user = await userByEmail(client, values.email)
        await addMembership(client, workspace, user.id, values.role ?? 'member')
        return { workspace: values.workspace, user_id: user.id, email: user.email, role: values.role ?? 'member' }
      })
      context.print(`${row.email} joined ${row.workspace} as ${row.role}`, row)
    },
  },
  'member suspend': memberSuspension(true),
  'member unsuspend': memberSuspension(false),
  'role create': {
    usage: 'role create --workspace S --name N --grant contacts:view:all [--grant ...]',
    summary: 'create a custom role with resource:action:scope grants',
    options: { workspace: { type: 'string' }, name: { type: 'string' }, grant: { type: 'string', multiple: true } },
    run: async (context, values) => {
      required(values, 'workspace', 'name')
      const grants: string[] = values.grant ?? []
      for (const grant of grants) {
        if (!/^(contacts|companies|deals):(view|create|update|delete|import|export):(own|team|all)$/.test(grant)) {
          throw new CliError('invalid_arguments', `--grant "${grant}" is not resource:action:scope (e.g. deals:view:own)`)
        }
      }
      const row = await withDatabase(context, async (client) => {
        const workspace = await workspaceId(client, values.workspace)
        const { rows } = await client.query('insert into crm.roles (workspace_id, name) values ($1, $2) returning id, name, is_admin', [
          workspace,
          values.name,
        ])
        for (const grant of grants) {
          const [resource, action, scope] = grant.split(':')
          await client.query('insert into crm.role_grants (workspace_id, role_id, resource, action, scope) values ($1, $2, $3, $4, $5)', [
            workspace,
            rows[0].id,
            resource,
            action,
            scope,
          ])
        }
        return { ...rows[0], workspace: values.workspace, grants }
      })
      context.print(`created role ${row.name} (${row.id}) with ${grants.length} grant(s)`, row)
    },
  },
  'audit verify': {
    usage: 'audit verify --workspace S',
    summary: "check a workspace's audit chain; exits 1 naming the first bad entry",
    options: { workspace: { type: 'string' } },
    run: async (context, values) => {
      required(values, 'workspace')
      const { auditChainVerdict } = await import('../audit/audit-log.ts')
      const result = await withDatabase(context, async (client) =>
        auditChainVerdict(
          (await client.query('select * from crm.verify_audit_log($1)', [await workspaceId(client, values.workspace)])).rows[0],
        ),
      )
      if (!result.intact)
        throw new CliError('audit_chain_broken', `the audit log of ${values.workspace} is broken at entry ${result.first_bad_id}`, {
          extensions: result,
        })
      context.print(`the audit log of ${values.workspace} is intact: ${result.entries} entries`, result)
    },
  },
}

function userSuspension(suspend: boolean): Command {
  return {
    usage: `user ${suspend ? 'suspend' : 'unsuspend'} --email E`,
    summary: suspend ? 'suspend a user everywhere (tokens and sessions stop at once)' : 'lift a platform suspension',
    options: { email: { type: 'string' } },
    run: async (context, values) => {
      required(values, 'email')
      const row = await withDatabase(context, async (client) => {
        const { rows } = await client.query(
          `update crm.users set suspended_at = case when $2 then coalesce(suspended_at, now()) end where email = lower($1) returning id, email, ${timeSql('suspended_at')}`,
          [values.email, suspend],
        )
        if (!rows[0]) throw new Error(`no user with email "${values.email}"`)
        return rows[0]
      })
      context.print(`${row.email} is ${suspend ? 'suspended' : 'no longer suspended'}`, row)
    },
  }
}

function memberSuspension(suspend: boolean): Command {
  return {
    usage: `member ${suspend ? 'suspend' : 'unsuspend'} --workspace S --email E`,
    summary: suspend ? 'suspend a member in one workspace' : 'unsuspend a member (needs a free seat)',
    options: { workspace: { type: 'string' }, email: { type: 'string' } },
    run: async (context, values) => {
      required(values, 'workspace', 'email')
      const row = await withDatabase(context, async (client) => {
        const workspace = await workspaceId(client, values.workspace)
        const user = await userByEmail(client, values.email)
        const { rows } = await client.query(
          `update crm.memberships set suspended_at = case when $3 then coalesce(suspended_at, now()) end
           where workspace_id = $1 and user_id = $2 returning user_id, ${timeSql('suspended_at')}`,
          [workspace, user.id, suspend],
        )
        if (!rows[0]) throw new Error(`${values.email} is not a member of ${values.workspace}`)
        return { workspace: values.workspace, email: user.email, ...rows[0] }
      })
      context.print(`${row.email} is ${suspend ? 'suspended' : 'active'} in ${row.workspace}`, row)
    },
  }
}
