// sql/schema.sql is dumped from the embedded PostgreSQL 18 (`make schema`). On an older server the
// migrations make one thing differently, on purpose: crm.uuid_v7 is PostgreSQL's own uuidv7() from
// 18 on and SQL before (sql/definitions/01_ids.*.sql). Dumps are compared whole on 18 and later, and
// with that one function's definition set aside on older servers.
import type pg from 'pg'

// The comment may be written as adjacent literals, one a line (src/db/sql-layout.ts, wrapLiteral).
const UUID_V7 =
  /\nCREATE OR REPLACE FUNCTION crm\.uuid_v7\(\)\n[\s\S]*?\ncomment on function crm\.uuid_v7\(\) is\s+'(?:[^']|'')*'(?:\s+'(?:[^']|'')*')*;\n/

/** The dump as compared on this server: whole from PostgreSQL 18, without crm.uuid_v7's definition before. */
export async function comparableDump(client: pg.Client, dump: string): Promise<string> {
  const { rows } = await client.query<{ version: number }>(`select current_setting('server_version_num')::int as version`)
  if (rows[0].version >= 180000) return dump
  if (!UUID_V7.test(dump)) throw new Error('the dump has no crm.uuid_v7 definition to set aside: update test/helpers/schema.ts')
  return dump
    .replace(UUID_V7, '\n-- crm.uuid_v7: its definition depends on the server version\n')
    .replace('-- sql/definitions/01_ids.before_18.sql', '-- sql/definitions/01_ids.from_18.sql')
}
