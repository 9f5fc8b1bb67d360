// Shared set-up for the records tests: a server, a workspace with members of every kind, and
// small request helpers bound to a member's token.
import pg from 'pg'
import { addMember, createTenant, type Member, type Tenant, withOwner } from '../helpers/fixtures.ts'
import { startTestServer, type TestResponse, type TestServer } from '../helpers/server.ts'

type Teardown = { teardown: (fn: () => unknown) => void }

export type Client = {
  member: Member
  get: (path: string, headers?: Record<string, string>) => Promise<TestResponse>
  post: (path: string, body: unknown, headers?: Record<string, string>) => Promise<TestResponse>
  put: (path: string, body: unknown, headers?: Record<string, string>) => Promise<TestResponse>
  patch: (path: string, body: unknown, headers?: Record<string, string>) => Promise<TestResponse>
  del: (path: string, headers?: Record<string, string>) => Promise<TestResponse>
}

export type World = {
  server: TestServer
  tenant: Tenant
  as: (email: string) => Client
  owner: (text: string, values?: unknown[]) => Promise<pg.QueryResult>
}

export function clientFor(server: TestServer, tenant: Tenant, member: Member): Client {
  const headers = (extra: Record<string, string> = {}) => ({ 'x-tenant-slug': tenant.slug, ...extra })
  return {
    member,
    get: (path, extra) => server.request('GET', path, { token: member.token, headers: headers(extra) }),
    post: (path, body, extra) => server.request('POST', path, { token: member.token, body, headers: headers(extra) }),
    put: (path, body, extra) => server.request('PUT', path, { token: member.token, body, headers: headers(extra) }),
    patch: (path, body, extra) => server.request('PATCH', path, { token: member.token, body, headers: headers(extra) }),
    del: (path, extra) => server.request('DELETE', path, { token: member.token, headers: headers(extra) }),
  }
}

/** A custom role with the given grants ("deals:view:team", ...), created as the owner. */
export async function createRole(url: string, workspaceId: string, name: string, grants: string[]): Promise<void> {
  await withOwner(url, async (client) => {
    const {
      rows: [role],
    } = await client.query('insert into crm.roles (workspace_id, name) values ($1, $2) returning id', [workspaceId, name])
    for (const grant of grants) {
      const [resource, action, scope] = grant.split(':')
      await client.query('insert into crm.role_grants (workspace_id, role_id, resource, action, scope) values ($1, $2, $3, $4, $5)', [
        workspaceId,
        role.id,
        resource,
        action,
        scope,
      ])
    }
  })
}

/**
 * A workspace "acme" with: admin (everything), ann and bob (built-in member: view all, write own),
 * reader (read_only), and, when asked, members with custom roles.
 */
export async function startWorld(
  t: Teardown,
  options: {
    roles?: Record<string, string[]>
    members?: Record<string, string>
    teams?: Record<string, string[]>
    env?: Record<string, string>
  } = {},
): Promise<World> {
  const server = await startTestServer(t, { env: options.env })
  const url = server.databaseUrl
  const tenant = await createTenant(url, {
    slug: 'acme',
    members: { 'admin@acme.test': 'admin', 'ann@acme.test': 'member', 'bob@acme.test': 'member', 'reader@acme.test': 'read_only' },
  })
  for (const [name, grants] of Object.entries(options.roles ?? {})) await createRole(url, tenant.id, name, grants)
  await withOwner(url, async (client) => {
    for (const [email, role] of Object.entries(options.members ?? {}))
      tenant.members[email] = await addMember(client, tenant.id, email, role)
    for (const [team, emails] of Object.entries(options.teams ?? {})) {
      const {
        rows: [row],
      } = await client.query('insert into crm.teams (workspace_id, name) values ($1, $2) returning id', [tenant.id, team])
      for (const email of emails) {
        await client.query('insert into crm.team_members (workspace_id, team_id, user_id) values ($1, $2, $3)', [
          tenant.id,
          row.id,
          tenant.members[email].id,
        ])
      }
    }
  })
  const ownerClient = new pg.Client({ connectionString: url })
  await ownerClient.connect()
  t.teardown(() => ownerClient.end())
  return {
    server,
    tenant,
    as: (email) => clientFor(server, tenant, tenant.members[email]),
    owner: (text, values = []) => ownerClient.query(text, values),
  }
}
