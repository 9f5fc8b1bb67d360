// No secret may enter the audit log or an event's actor (docs/api.md section 11): every test file's
// database is scanned for them before it is dropped (test/helpers/database.ts). A secret is found
// by its format (the prefixes the service issues) or by its value: the test helpers remember every
// secret they issue or see issued (tokens, webhook and OAuth client secrets, TOTP secrets, recovery
// codes, passwords) in this test process, so formatless ones are found too.
import pg from 'pg'

/**
 * The formats of the secrets the service issues, as regular expressions that mean the same in
 * JavaScript and in PostgreSQL; test/run.ts scans the servers' logs with them too.
 */
export const SECRET_FORMATS: [string, string][] = [
  ['bearer token', 'crm_[A-Za-z0-9_-]{43}'],
  ['webhook secret', 'whsec_[A-Za-z0-9_+/-]{43}'],
  ['invitation token', 'inv_[A-Za-z0-9_-]{43}'],
  ['OAuth client secret', 'crmsec_[A-Za-z0-9_-]{43}'],
  ['OAuth refresh token', 'crmrt_[A-Za-z0-9_-]{43}'],
  ['signed challenge or session', 'eyJ[A-Za-z0-9_-]{10,}\\.[A-Za-z0-9_-]{10,}\\.'],
  ['otpauth URI', 'otpauth://'],
  ['password hash', 'scrypt\\$[0-9]+\\$[0-9]+\\$'],
]

/**
 * What the database stores of a token (its SHA-256, shown as hex) has no place in an entry either:
 * the chain's own hashes are left out of the text scanned. Not for logs, where a digest of a body
 * (a signature, an ETag) is no secret.
 */
const STORED_SECRET_FORMATS: [string, string][] = [['SHA-256 digest (a stored token)', '[0-9a-f]{64}']]
const AUDIT_FORMATS = [...SECRET_FORMATS, ...STORED_SECRET_FORMATS]

/** Keys under which a request or an answer carries a secret (docs/api.md sections 3, 4a and 7). */
const SECRET_KEYS = new Set([
  'token',
  'secret',
  'client_secret',
  'refresh_token',
  'access_token',
  'challenge_token',
  'recovery_code',
  'recovery_codes',
  'password',
  'new_password',
  'current_password',
])

// Shorter values (a TOTP code, a scope name) would match unrelated text by chance; longer ones than
// the longest password the API takes are hostile input, not secrets, and would bloat the scan's pattern.
const SHORTEST_SECRET = 12
const LONGEST_SECRET = 1024

const issued = new Set<string>()

const formatted = AUDIT_FORMATS.map(([, format]) => new RegExp(format))

/**
 * Remembers a secret value for the scan. One the formats find anyway (a token) is not kept: a file
 * that mints thousands of tokens would otherwise make the scan compare every entry with each.
 */
export function rememberSecret(value: string): void {
  if (value.length < SHORTEST_SECRET || value.length > LONGEST_SECRET) return
  if (formatted.some((format) => format.test(value))) return
  issued.add(value)
}

/** Remembers every string under a secret-bearing key of a JSON value (a request or an answer body). */
export function rememberSecretsIn(value: unknown, key = ''): void {
  if (typeof value === 'string') {
    if (SECRET_KEYS.has(key)) rememberSecret(value)
  } else if (Array.isArray(value)) {
    for (const item of value) rememberSecretsIn(item, key)
  } else if (value !== null && typeof value === 'object') {
    for (const [name, item] of Object.entries(value)) rememberSecretsIn(item, name)
  }
}

export type SecretFinding = { table: string; workspace: string; entry: string; action: string; secret: string }

/**
 * The audit entries and event actors of a database that hold a secret: one query over both
 * tables, as a superuser (row-level security does not hide a workspace's rows from the scan).
 * Hashes are left out of the text scanned (a chain hash is no secret, and its hex could spell one).
 */
export async function secretsInDatabase(url: string): Promise<SecretFinding[]> {
  const values = [...issued]
  const pattern = AUDIT_FORMATS.map(([, format]) => format).join('|')
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    // Formats by one regular expression; values by position, as thousands of them in one
    // expression are more than PostgreSQL's regular expressions take.
    const { rows } = await client.query<{ table: string; workspace: string; entry: string; action: string; body: string }>(
      `with entries as (
         select 'crm.audit_log' as table, workspace_id::text as workspace, seq::text as entry, action,
                (to_jsonb(a) - 'hash' - 'prev_hash')::text as body
           from crm.audit_log a
         union all
         select 'crm.events', workspace_id::text, id::text, event, actor::text
           from crm.events)
       select * from entries e
        where e.body ~ $1 or exists (select from unnest($2::text[]) as v(value) where strpos(e.body, v.value) > 0)
        limit 20`,
      [pattern, values],
    )
    return rows.map((row) => ({ ...row, secret: secretKind(row.body, values) }))
  } catch (error) {
    // A database whose test took the schema apart (or never had it) has nothing to scan.
    if ((error as { code?: string }).code === '42P01' || (error as { code?: string }).code === '3F000') return []
    throw error
  } finally {
    await client.end()
  }
}

/** What kind of secret a matched text holds, named without repeating the secret. */
function secretKind(body: string, values: string[]): string {
  const format = AUDIT_FORMATS.find(([, format]) => new RegExp(format).test(body))
  if (format) return format[0]
  return values.some((value) => body.includes(value)) ? 'a secret a test helper issued or saw' : 'unknown'
}

/** Throws, naming each entry, when the database holds a secret in its audit log or event actors. */
export async function assertNoSecretsInAudit(url: string): Promise<void> {
  const found = await secretsInDatabase(url)
  if (found.length === 0) return
  const lines = found.map((f) => `${f.secret} in ${f.table} (workspace ${f.workspace}, entry ${f.entry}, ${f.action})`)
  throw new Error(`SECRET IN AUDIT: ${lines.join('; ')}`)
}
