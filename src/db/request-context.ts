// The request context, declared once: the fields crm.put_context writes at the start of a request
// and the policy helpers read, in the order they travel. Both carriers are generated from this
// table into sql/definitions/02_request_context.<carrier>.sql (`make schema` writes them;
// test/foundation/request-context.test.ts fails while a file and this table disagree), and
// `crm migrate` applies the one its database can use (src/db/migrate.ts):
// - parameter: the context travels in the setting backtrace_functions, which only a role granted
//   SET on it (the owner, GRANT SET ON PARAMETER) can write; every reader is an inlined SQL
//   expression over current_setting.
// - keyed_proof: the context travels in the setting crm.context next to an HMAC of it, this backend
//   and this transaction's start, keyed by a secret crm_api cannot read (crm.internal_secrets);
//   crm.context_text checks the proof and every reader reads through it.
// The fields are positional (space-separated) because splitting one setting is the cheapest read
// a policy can make; their names live here and in the comments of the generated files.

import { breakArguments, LINE_WIDTH, wrapLiteral } from './sql-layout.ts'

export type ContextCarrier = 'parameter' | 'keyed_proof'
export const CONTEXT_CARRIERS: ContextCarrier[] = ['parameter', 'keyed_proof']

type ContextField = { name: string; written: string; meaning: string }

/** The fields in the order they travel (field 1 is the marker). `written` is the SQL crm.context_line writes for it. */
export const CONTEXT_FIELDS: ContextField[] = [
  { name: 'marker', written: "'crm_context'", meaning: 'the word crm_context, so that no other value of the setting reads as a context' },
  { name: 'user_id', written: "replace(p_user_id::text, '-', '')", meaning: 'the authenticated user, hex without dashes' },
  { name: 'workspace_id', written: "replace(p_workspace_id::text, '-', '')", meaning: 'the workspace of the request, hex without dashes' },
  {
    name: 'oauth_app_id',
    written: "coalesce(replace(p_oauth_app_id::text, '-', ''), '0')",
    meaning: 'the OAuth app of an access token, or 0',
  },
  {
    name: 'via',
    written: "encode(convert_to(coalesce(p_via, 'api'), 'UTF8'), 'hex')",
    meaning: 'how the change arrives (api, ui, import), hex of its UTF-8',
  },
  {
    name: 'scopes',
    written: "coalesce(encode(convert_to(p_scopes::text, 'UTF8'), 'hex'), 'n')",
    meaning: "the token's scopes as a text[] literal in hex, or n for an unscoped token",
  },
  { name: 'admin', written: "case when p_admin then '1' else '0' end", meaning: "1 when the member's role is an admin role, else 0" },
  {
    name: 'grants',
    written: "coalesce(p_grants, ',')",
    meaning: "the role's grants the token's scopes cover, as ,resource_action_scope, entries",
  },
  {
    name: 'team_user_ids',
    written: "coalesce(p_team_user_ids, '0')",
    meaning: "the members of the user's teams (hex, comma-separated) when a grant has scope team, else 0",
  },
  { name: 'token_id', written: "coalesce(replace(p_token_id::text, '-', ''), '0')", meaning: 'the token of the request, or 0' },
  {
    name: 'oauth_grant_id',
    written: "coalesce(replace(p_oauth_grant_id::text, '-', ''), '0')",
    meaning: 'the OAuth grant of an access token, or 0',
  },
]

/** SQL reading one field of the context from `source`. */
function field(source: string, name: string): string {
  const position = CONTEXT_FIELDS.findIndex((candidate) => candidate.name === name) + 1
  if (position === 0) throw new Error(`no context field ${name}`)
  return `pg_catalog.split_part(${source}, ' ', ${position})`
}

type Reader = { signature: string; returns: string; body: (read: (name: string) => string) => string; comment: string }

/** The policy helpers: each reads fields of the context, inlined into the policies that call it. */
const READERS: Reader[] = [
  {
    signature: 'current_user_id()',
    returns: 'uuid',
    body: (read) => `nullif(${read('user_id')}, '')::uuid`,
    comment:
      'The authenticated user of this transaction, or null when no proven context was set. Wrap as (select crm.current_user_id()) in policies.',
  },
  {
    signature: 'current_workspace_id()',
    returns: 'uuid',
    body: (read) => `nullif(${read('workspace_id')}, '')::uuid`,
    comment: 'The workspace chosen for this transaction, or null without a proven context.',
  },
  {
    signature: 'current_oauth_app_id()',
    returns: 'uuid',
    body: (read) => `nullif(nullif(${read('oauth_app_id')}, '0'), '')::uuid`,
    comment: 'The OAuth app whose access token this transaction acts with, or null (describes events; authorizes nothing).',
  },
  {
    signature: 'current_token_id()',
    returns: 'uuid',
    body: (read) => `nullif(nullif(${read('token_id')}, '0'), '')::uuid`,
    comment:
      "The id of the token that authenticated this transaction's request, or null (a job acting as a user, no context). As of crm.put_context.",
  },
  {
    signature: 'current_oauth_grant_id()',
    returns: 'uuid',
    body: (read) => `nullif(nullif(${read('oauth_grant_id')}, '0'), '')::uuid`,
    comment: 'The OAuth grant of the access token that authenticated this request, or null (a personal token, a session, no context).',
  },
  {
    signature: 'current_via()',
    returns: 'text',
    body: (read) => `coalesce(pg_catalog.convert_from(pg_catalog.decode(nullif(${read('via')}, ''), 'hex'), 'UTF8'), 'system')`,
    comment: 'How the change arrived: api, ui, import or system (only used to describe events, never to authorize).',
  },
  {
    signature: 'current_scopes()',
    returns: 'text[]',
    body: (read) =>
      [
        `case coalesce(${read('scopes')}, '')`,
        `         when '' then '{}'::text[]`,
        `         when 'n' then null`,
        `         else pg_catalog.convert_from(pg_catalog.decode(${read('scopes')}, 'hex'), 'UTF8')::text[]`,
        '       end',
      ].join('\n'),
    comment:
      "The scopes of this transaction's token: null for an unscoped token (the whole role), {} without a proven context. Pass it to crm.scopes_cover / crm.scopes_include as (select crm.current_scopes()).",
  },
  {
    signature: 'grant_scope(p_resource text, p_action text)',
    returns: 'text',
    body: (read) =>
      `nullif(pg_catalog.split_part(pg_catalog.split_part(${read('grants')},\n` +
      `                                                   ',' || p_resource || '_' || p_action || '_', 2), ',', 1), '')`,
    comment:
      "The scope (own, team, all) the current member's role grants for resource:action, or null; null too when the token's scopes do not cover the action. As of the request's authentication (crm.put_context).",
  },
  {
    signature: 'scope_owner_ids(p_resource text, p_action text)',
    returns: 'uuid[]',
    body: (read) =>
      [
        `case pg_catalog.split_part(pg_catalog.split_part(${read('grants')}, ',' || p_resource || '_' || p_action || '_', 2), ',', 1)`,
        `         when 'own' then array[nullif(${read('user_id')}, '')::uuid]`,
        `         when 'team' then pg_catalog.string_to_array(${read('team_user_ids')}, ',')::uuid[]`,
        `         else '{}'::uuid[]`,
        '       end',
      ].join('\n'),
    comment:
      "The owners whose records the current member's scope for resource:action covers: {me} for own, the team (me included) for team, {} for all or no grant. As of the request's authentication.",
  },
  {
    signature: 'is_admin()',
    returns: 'boolean',
    body: (read) => `coalesce(${read('admin')} = '1', false)`,
    comment:
      "Whether the current member's role is an admin role, whatever the token's scopes. Admin-only rules use crm.is_admin_for(scope) instead.",
  },
  {
    signature: 'is_admin_for(p_scope text)',
    returns: 'boolean',
    body: (read) =>
      [
        `coalesce(${read('admin')} = '1'`,
        `                and (${read('scopes')} = 'n'`,
        `                     or p_scope = any (pg_catalog.convert_from(pg_catalog.decode(`,
        `                                         nullif(nullif(${read('scopes')}, 'n'), ''), 'hex'), 'UTF8')::text[])),`,
        '                false)',
      ].join('\n'),
    comment:
      "Whether the current member's role is an admin role and the token may use it for this scope: webhooks:manage (webhooks) or workspace:admin (members, roles, teams, invitations, OAuth apps). An unscoped token may.",
  },
]

const CARRIER_TEXT: Record<ContextCarrier, { source: string; contextText: string; writeContext: string; about: string }> = {
  parameter: {
    about:
      'The context travels in the setting backtrace_functions, which only a role granted SET on it can write\n-- (GRANT SET ON PARAMETER backtrace_functions TO crm_owner): every reader is an inlined expression.',
    source: "pg_catalog.current_setting('backtrace_functions')",
    contextText: `create or replace function crm.context_text() returns text
language sql stable
return case when pg_catalog.split_part(pg_catalog.current_setting('backtrace_functions'), ' ', 1) = 'crm_context'
            then pg_catalog.current_setting('backtrace_functions') end;`,
    writeContext: `create or replace function crm.write_context(p_context text) returns text
language sql volatile
return pg_catalog.set_config('backtrace_functions', p_context, true);`,
  },
  keyed_proof: {
    about:
      "The context travels in the setting crm.context with crm.context_proof, an HMAC of it, this backend and this\n-- transaction's start under a key crm_api cannot read: a setting set by hand, or copied from another\n-- transaction, proves nothing. Every reader reads through crm.context_text, which checks the proof.",
    source: 'crm.context_text()',
    contextText: `create or replace function crm.context_text() returns text
language sql stable security definer
set search_path = pg_catalog, crm, pg_temp
as $body$
  select c.t from (select current_setting('crm.context', true) as t) c
   where encode(public.hmac(convert_to(c.t || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8'),
                            (select k.value from crm.internal_secrets k where k.name = 'context_proof'), 'sha256'), 'hex')
         = current_setting('crm.context_proof', true)
$body$;`,
    // PL/pgSQL: the key is read by a sub-select, and a SQL function whose body holds one is planned
    // on every call before PostgreSQL 18.
    writeContext: `create or replace function crm.write_context(p_context text) returns text
language plpgsql
set search_path = pg_catalog, crm, pg_temp
as $body$
begin
  perform set_config('crm.context', p_context, true);
  return set_config('crm.context_proof', encode(public.hmac(
    convert_to(p_context || '/' || pg_backend_pid()::text || '/' || extract(epoch from now())::text, 'UTF8'),
    (select k.value from crm.internal_secrets k where k.name = 'context_proof'), 'sha256'), 'hex'), true);
end
$body$;`,
  },
}

/** A comment's text as a literal, on lines of adjacent literals when long. */
function quote(text: string): string {
  return wrapLiteral(`'${text.replaceAll("'", "''")}'`, 2, LINE_WIDTH - 1)
}

const WRITER_PARAMETERS =
  'p_user_id uuid, p_workspace_id uuid, p_oauth_app_id uuid, p_via text, p_scopes text[], p_admin boolean, p_grants text, p_team_user_ids text, p_token_id uuid, p_oauth_grant_id uuid'

/** The text of sql/definitions/02_request_context.<carrier>.sql. */
export function requestContextDefinitions(carrier: ContextCarrier): string {
  const text = CARRIER_TEXT[carrier]
  const source = text.source
  const fieldList = CONTEXT_FIELDS.map(
    (candidate, index) => `--   ${String(index + 1).padStart(2)} ${candidate.name}: ${candidate.meaning}`,
  )
  const parts = [
    `-- Generated by \`make schema\` from src/db/request-context.ts (its table of fields); do not edit.
-- The request context, carried by the ${carrier === 'parameter' ? 'parameter' : 'keyed proof'}.
-- ${text.about}
-- crm migrate applies this file or its sibling, whichever the database can use, and records which
-- (crm.schema_definitions; /readyz shows it). Tables default to its readers, so on a new database it
-- comes right after migration 000001.
-- needs migration 1
-- Its fields, space-separated, in this order:
${fieldList.join('\n')}

set local lock_timeout = '5s';
set local statement_timeout = '60s';`,
    `${text.contextText}
comment on function crm.context_text() is
  ${quote(`This transaction's request context as crm.put_context wrote it, or null (carrier ${carrier}).`)};
grant execute on function crm.context_text() to crm_api;`,
    `${text.writeContext}
comment on function crm.write_context(text) is
  'Writes the request context for the rest of the transaction; answers set_config''s text. Internal.';`,
    `${breakArguments(`create or replace function crm.context_line(${WRITER_PARAMETERS}) returns text`)}
language sql immutable
return concat_ws(' ',
  ${CONTEXT_FIELDS.map((candidate) => candidate.written).join(',\n  ')});
comment on function crm.context_line(${WRITER_PARAMETERS.replace(/p_\w+ /g, '')}) is
  'The request context as it travels, from its fields (src/db/request-context.ts). Internal: crm.put_context writes it.';`,
    ...READERS.map(
      (reader) => `create or replace function crm.${reader.signature} returns ${reader.returns}
language sql stable
return ${reader.body((fieldName) => field(source, fieldName))};
comment on function crm.${reader.signature} is
  ${quote(reader.comment)};
grant execute on function crm.${reader.signature} to crm_api;`,
    ),
  ]
  return `${parts.join('\n\n')}\n`
}

export const REQUEST_CONTEXT_FILE = (carrier: ContextCarrier) =>
  new URL(`../../sql/definitions/02_request_context.${carrier}.sql`, import.meta.url)
