// Sign-in (tokens, two-factor), the caller's identity, workspaces and tokens (docs/api.md section 3).
import Type from 'typebox'
import { PERSONAL_TOKEN_SCOPES, TOKEN_SCOPES } from '../../auth/scopes.ts'
import { completeTwoFactor, signInWithPassword } from '../../auth/sign-in.ts'
import { hashToken, newToken } from '../../auth/tokens.ts'
import { sql } from '../../db/pool.ts'
import { IdRow, NullableString, rowType } from '../../db/typed-rows.ts'
import { NotFoundError, ValidationError } from '../../errors.ts'
import { Uuid } from '../../uuid.ts'
import { clientOf } from '../client-address.ts'
import { defineRoutes, isWholeAuthority } from '../route.ts'

const Time = Type.String({ format: 'date-time' })

export const TokenBodySchema = Type.Object({
  token: Type.String({ description: 'crm_ followed by 43 base64url characters; shown only now' }),
  token_type: Type.Literal('Bearer'),
  token_id: Uuid,
  expires_at: Time,
})
const ChallengeSchema = Type.Object({ two_factor: Type.Literal(true), challenge_token: Type.String(), expires_at: Time })

const SignInBody = Type.Object(
  {
    email: Type.String({ minLength: 3, maxLength: 254 }),
    password: Type.String({ minLength: 1, maxLength: 1024 }),
    device_name: Type.String({ minLength: 1, maxLength: 200 }),
  },
  { additionalProperties: false },
)
const ChallengeBody = Type.Union([
  Type.Object(
    { challenge_token: Type.String({ maxLength: 2000 }), code: Type.String({ maxLength: 32, pattern: '^\\s*\\d{6}\\s*$' }) },
    { additionalProperties: false },
  ),
  Type.Object(
    { challenge_token: Type.String({ maxLength: 2000 }), recovery_code: Type.String({ minLength: 1, maxLength: 100 }) },
    { additionalProperties: false },
  ),
])

const Scopes = Type.Union([Type.Array(Type.String()), Type.Null()], {
  description: 'The scopes the token is limited to (docs/api.md section 4a); null: the whole role',
})

const TokenSummary = Type.Object({
  id: Uuid,
  kind: Type.Union([Type.Literal('token'), Type.Literal('session'), Type.Literal('oauth')], {
    description: 'oauth: an app the user connected (one entry per authorization; revoking it cuts the app off)',
  }),
  name: Type.String(),
  app: Type.Union([Type.Object({ id: Uuid, name: Type.String() }), Type.Null()], { description: 'the connected app (kind oauth)' }),
  scopes: Scopes,
  created_at: Time,
  last_used_at: Type.Union([Time, Type.Null()]),
  expires_at: Time,
  current: Type.Boolean(),
})

const CallerRow = rowType(
  Type.Object({
    user: Type.Object({ id: Type.String(), email: Type.String(), name: Type.String() }),
    workspace: Type.Object({
      id: Type.String(),
      slug: Type.String(),
      name: Type.String(),
      plan: Type.String(),
      trial_ends_at: NullableString,
      seat_limit: Type.Union([Type.Integer(), Type.Null()]),
    }),
    role: Type.Object({ name: Type.String(), is_admin: Type.Boolean(), permissions: Type.Array(Type.String()) }),
    token: Type.Object({ id: Type.String(), name: Type.String(), expires_at: Type.String(), scopes: Scopes }),
  }),
)

const NewTokenBody = Type.Object(
  {
    name: Type.String({ minLength: 1, maxLength: 200, description: 'Where the token is used, e.g. "ERP sync"' }),
    expires_in_days: Type.Optional(Type.Integer({ minimum: 1, maximum: 365, description: 'Lifetime in days (default 14)' })),
    scopes: Type.Optional(
      Type.Array(Type.Union(TOKEN_SCOPES.map((scope) => Type.Literal(scope))), {
        minItems: 1,
        maxItems: 9,
        description: 'Limit the token to these scopes (distinct; offline_access is for OAuth apps only); leave out for the whole role',
      }),
    ),
  },
  { additionalProperties: false },
)
const NewTokenSchema = Type.Object({
  ...TokenBodySchema.properties,
  name: Type.String(),
  scopes: Scopes,
})
const NewTokenRow = rowType(Type.Object({ id: Type.String(), expires_at: Type.String() }))
const WorkspaceOfCallerRow = rowType(
  Type.Object({
    slug: Type.String(),
    name: Type.String(),
    role: Type.String(),
    plan: Type.String(),
    suspended: Type.Boolean(),
    current: Type.Boolean(),
  }),
)
const TokenSummaryRow = rowType(TokenSummary)

export default defineRoutes(
  {
    method: 'POST',
    path: '/api/token',
    summary: 'Exchange email and password for a bearer token (or a two-factor challenge)',
    tag: 'auth',
    auth: 'none',
    credentials: 'anonymous',
    limitedPerAddress: true,
    body: SignInBody,
    response: Type.Union([TokenBodySchema, ChallengeSchema]),
    errors: [400, 401, 422, 429],
    example: { request: { email: 'ada@example.com', password: 'correct horse battery', device_name: 'ERP sync' } },
    handler: async ({ services, body, req }) => ({
      body: await signInWithPassword(services.pool, services.config, { ...body, client_address: clientOf(req).address }),
    }),
  },
  {
    method: 'POST',
    path: '/api/token/2fa-challenge',
    summary: 'Complete a two-factor sign-in with a TOTP code or a recovery code',
    tag: 'auth',
    auth: 'none',
    credentials: 'anonymous',
    limitedPerAddress: true,
    body: ChallengeBody,
    response: TokenBodySchema,
    errors: [400, 401, 422, 429],
    example: { request: { challenge_token: 'eyJhbGciOiJIUzI1NiJ9…', code: '123456' } },
    handler: async ({ services, body, req }) => ({
      body: await completeTwoFactor(services.pool, services.config, { ...body, client_address: clientOf(req).address }),
    }),
  },
  {
    method: 'GET',
    path: '/api/me',
    summary: 'The caller: user, workspace, role with its permissions, and the token in use',
    tag: 'auth',
    auth: 'required',
    scope: 'none',
    errors: [401, 404, 429],
    response: Type.Object({ data: Type.Object({ user: Type.Any(), workspace: Type.Any(), role: Type.Any(), token: Type.Any() }) }),
    handler: async ({ db, caller }) => {
      const data = await db.one(sql.type(CallerRow)`
        select
          json_build_object('id', u.id, 'email', u.email, 'name', u.name) as user,
          json_build_object('id', w.id, 'slug', w.slug, 'name', w.name, 'plan', w.plan,
            'trial_ends_at', to_char(w.trial_ends_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), 'seat_limit', w.seat_limit) as workspace,
          json_build_object('name', r.name, 'is_admin', r.is_admin, 'permissions',
            coalesce((select json_agg(g.resource || ':' || g.action || ':' || g.scope order by g.resource, g.action)
                      from crm.role_grants g where g.workspace_id = r.workspace_id and g.role_id = r.id), '[]'::json)) as role,
          json_build_object('id', t.id, 'name', t.name,
            'expires_at', to_char(t.expires_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), 'scopes', t.scopes) as token
        from crm.users u
        join crm.memberships m on m.user_id = u.id and m.workspace_id = ${caller.workspaceId}
        join crm.workspaces w on w.id = m.workspace_id
        join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
        join crm.tokens t on t.id = ${caller.tokenId}
        where u.id = ${caller.userId}
      `)
      return { body: { data } }
    },
  },
  {
    method: 'GET',
    path: '/api/workspaces',
    summary: "The caller's workspaces with their role and plan (an OAuth app's access token: its own workspace only)",
    tag: 'auth',
    auth: 'required',
    scope: 'none',
    errors: [401, 429],
    response: Type.Object({
      data: Type.Array(Type.Object({ slug: Type.String(), name: Type.String(), role: Type.String(), plan: Type.String() })),
    }),
    handler: async ({ db, caller }) => {
      const rows = await db.any(sql.type(WorkspaceOfCallerRow)`
        select w.slug, w.name, r.name as role, w.plan, (m.suspended_at is not null) as suspended, (w.id = ${caller.workspaceId}) as current
        from crm.memberships m
        join crm.workspaces w on w.id = m.workspace_id
        join crm.roles r on r.workspace_id = m.workspace_id and r.id = m.role_id
        where m.user_id = ${caller.userId} ${caller.oauthAppId === null ? sql.fragment`` : sql.fragment`and m.workspace_id = ${caller.workspaceId}`}
        order by m.joined_at
      `)
      return { body: { data: rows } }
    },
  },
  {
    method: 'GET',
    path: '/api/tokens',
    summary:
      "The caller's tokens, UI sessions and connected OAuth apps (never their values); an OAuth app's access token sees only its own authorization",
    tag: 'auth',
    auth: 'required',
    credentials: 'scope',
    scope: 'none',
    errors: [401, 429],
    response: Type.Object({ data: Type.Array(TokenSummary) }),
    handler: async ({ db, caller }) => {
      // An app is listed once per authorization (its grant), not per access token: an app that
      // holds only a refresh token is connected all the same, and revoking the entry cuts it off.
      // An app's own access token sees its authorization only (the database shows it nothing of
      // the user's other tokens and apps: tokens_select_own, oauth_grants_select_own_or_admin).
      const ownGrantOnly =
        caller.oauthAppId === null
          ? sql.fragment``
          : sql.fragment`and g.id = (select t.oauth_grant_id from crm.tokens t where t.id = ${caller.tokenId})`
      const rows = await db.any(sql.type(TokenSummaryRow)`
        select id, kind, name, null::json as app, scopes, created_at, last_used_at, expires_at, (id = ${caller.tokenId}) as current
        from crm.tokens
        where user_id = ${caller.userId} and revoked_at is null and expires_at > now() and kind <> 'oauth'
        union all
        select g.id, 'oauth', a.name, json_build_object('id', a.id, 'name', a.name), g.scopes, g.created_at,
               (select max(t.last_used_at) from crm.tokens t where t.workspace_id = g.workspace_id and t.oauth_grant_id = g.id),
               g.expires_at,
               exists (select from crm.tokens t where t.id = ${caller.tokenId} and t.oauth_grant_id = g.id)
        from crm.oauth_grants g join crm.oauth_apps a on a.workspace_id = g.workspace_id and a.id = g.app_id
        where g.user_id = ${caller.userId} and g.revoked_at is null and g.expires_at > now() ${ownGrantOnly}
        order by created_at desc
      `)
      return { body: { data: rows } }
    },
  },
  {
    method: 'POST',
    path: '/api/tokens',
    summary:
      "Create a named personal API token, optionally limited to scopes; the value is shown this once. Needs an unscoped token or a browser session (a scoped token or an app's token: 403), and for more than a day a sign-in within the last 10 minutes (else 403 reauthentication_required)",
    tag: 'auth',
    auth: 'required',
    credentials: 'unscoped',
    scope: 'none',
    body: NewTokenBody,
    status: 201,
    response: NewTokenSchema,
    errors: [401, 403, 413, 415, 422, 429],
    example: {
      request: { name: 'Reporting', expires_in_days: 30, scopes: ['deals:read'] },
      response: {
        token: 'crm_…',
        token_type: 'Bearer',
        token_id: '01935f3c-9c00-7a11-9d2e-3c4b5a6f7e8d',
        expires_at: '2026-12-23T03:00:21.123Z',
        name: 'Reporting',
        scopes: ['deals:read'],
      },
    },
    handler: async ({ db, caller, body, services }) => {
      const input = body as { name: string; expires_in_days?: number; scopes?: string[] }
      const name = input.name.trim()
      if (name === '')
        throw new ValidationError('name must not be blank', [{ pointer: '/name', code: 'minLength', message: 'must not be blank' }])
      const scopes = input.scopes ?? null
      if (scopes) {
        const problems = scopes.flatMap((scope, index) => {
          if (!(PERSONAL_TOKEN_SCOPES as readonly string[]).includes(scope))
            return [{ pointer: `/scopes/${index}`, code: 'enum', message: 'offline_access is for OAuth apps only' }]
          if (scopes.indexOf(scope) !== index) return [{ pointer: `/scopes/${index}`, code: 'uniqueItems', message: 'is listed twice' }]
          return []
        })
        if (problems.length > 0) throw new ValidationError(`${problems[0].pointer.slice(1)} ${problems[0].message}`, problems)
      }
      // Only an unscoped token or a session gets here (credentials: 'unscoped'); the database
      // refuses any other context the same way (tokens_insert_own).
      const value = newToken()
      const days = input.expires_in_days ?? Math.min(services.config.tokenTtlDays, 365)
      const created = await db.one(sql.type(NewTokenRow)`
        insert into crm.tokens (user_id, kind, name, token_hash, expires_at, scopes)
        values (${caller.userId}, 'token', ${name}, ${sql.binary(hashToken(value))}, now() + make_interval(days => ${days}),
                ${scopes === null ? null : sql.array(scopes, 'text')})
        returning id, expires_at`)
      return {
        status: 201,
        body: { token: value, token_type: 'Bearer', token_id: created.id, expires_at: created.expires_at, name, scopes },
      }
    },
  },
  {
    method: 'DELETE',
    path: '/api/tokens/:id',
    summary:
      "Revoke one token or session of the caller, or disconnect an app (an oauth entry: every token of that authorization); a scoped token revokes only itself, an OAuth app's access token only its own authorization",
    tag: 'auth',
    auth: 'required',
    credentials: 'self',
    scope: 'none',
    status: 204,
    errors: [401, 404, 429],
    handler: async ({ db, params, caller }) => {
      if (!/^[0-9a-f-]{36}$/i.test(params.id)) throw new NotFoundError('No such token')
      // A scoped personal token revokes itself only. An app's access token revokes its own
      // authorization only: the grant's id or one of its tokens' (revoking any of them revokes the
      // grant). Anything else is not found for them.
      const ownGrantOnly =
        caller.oauthAppId === null
          ? caller.scopes === null
            ? sql.fragment``
            : sql.fragment`and ${params.id}::uuid = ${caller.tokenId}`
          : sql.fragment`and ${params.id}::uuid in (
              select g.id from crm.tokens own join crm.oauth_grants g on g.workspace_id = own.workspace_id and g.id = own.oauth_grant_id
               where own.id = ${caller.tokenId}
              union all
              select t.id from crm.tokens own join crm.tokens t on t.workspace_id = own.workspace_id and t.oauth_grant_id = own.oauth_grant_id
               where own.id = ${caller.tokenId})`
      // A token (its revocation revokes its grant, for an OAuth access token), else a connected app's grant.
      const revoked =
        (await db.maybeOne(sql.type(IdRow)`
          update crm.tokens set revoked_at = now() where id = ${params.id} and revoked_at is null ${ownGrantOnly} returning id
        `)) ??
        (await db.maybeOne(sql.type(IdRow)`
          update crm.oauth_grants set revoked_at = now()
          where id = ${params.id} and user_id = ${caller.userId} and revoked_at is null ${ownGrantOnly} returning id
        `))
      if (!revoked) throw new NotFoundError('No such token')
      return { status: 204 }
    },
  },
  {
    method: 'DELETE',
    path: '/api/tokens',
    summary:
      "Revoke every token and session of the caller, this one included, and disconnect every app; a scoped token revokes only itself, an OAuth app's access token only its own authorization",
    tag: 'auth',
    auth: 'required',
    credentials: 'self',
    scope: 'none',
    status: 204,
    errors: [401, 429],
    handler: async ({ db, caller }) => {
      if (!isWholeAuthority(caller)) {
        // A part of the user's authority revokes only itself: a scoped token itself, an app's token
        // its own authorization (revoking its token revokes the grant and every token under it).
        await db.query(sql.unsafe`update crm.tokens set revoked_at = now() where id = ${caller.tokenId} and revoked_at is null`)
        return { status: 204 }
      }
      await db.query(sql.unsafe`update crm.tokens set revoked_at = now() where user_id = ${caller.userId} and revoked_at is null`)
      await db.query(sql.unsafe`update crm.oauth_grants set revoked_at = now() where user_id = ${caller.userId} and revoked_at is null`)
      return { status: 204 }
    },
  },
)
