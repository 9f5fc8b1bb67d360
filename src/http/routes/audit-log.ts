// The access audit log (docs/api.md section 11): the list, the chain's check and the export, for the
// workspace's admins. What they do is in src/audit/audit-log.ts; the database writes the entries.
import Type from 'typebox'
import {
  AUDIT_FILTERS,
  type AuditExportRequest,
  AuditPage,
  AuditVerdict,
  auditExportQuery,
  listAuditLog,
  verifyAuditLog,
} from '../../audit/audit-log.ts'
import { streamExport } from '../../exports/stream-export.ts'
import { PAGING_PARAMETERS, pageHeaders } from '../../paging.ts'
import { parseQueryString } from '../../records/query-string.ts'
import { defineRoutes } from '../route.ts'

const BASE = '/api/audit-log'
const TAG = 'audit log'
const FILTER_DESCRIPTIONS: Record<(typeof AUDIT_FILTERS)[number], string> = {
  action: 'Only entries of this action (e.g. member.role_changed)',
  actor_id: 'Only entries made by this user',
  target_type: 'Only entries about this kind of target (user, role, team, invitation, token, oauth_app, oauth_grant, webhook, workspace)',
  target_id: 'Only entries about this target',
  since: 'Only entries at or after this time (RFC 3339)',
  until: 'Only entries before this time (RFC 3339)',
}
const FilterBody = Type.Object(
  Object.fromEntries(
    AUDIT_FILTERS.map((name) => [name, Type.Optional(Type.String({ maxLength: 64, description: FILTER_DESCRIPTIONS[name] }))]),
  ),
  { additionalProperties: false },
)
const ExportBody = Type.Object(
  {
    format: Type.Optional(
      Type.Union([Type.Literal('csv'), Type.Literal('ndjson')], { description: 'csv (default, with a header row) or ndjson' }),
    ),
    filter: Type.Optional(FilterBody),
  },
  { additionalProperties: false },
)

export default defineRoutes(
  {
    method: 'GET',
    path: BASE,
    summary: "The workspace's access audit log, newest first (admins)",
    tag: TAG,
    auth: 'required',
    scope: 'workspace:admin',
    response: AuditPage,
    queryParameters: {
      ...Object.fromEntries(
        AUDIT_FILTERS.map((name) => [
          name,
          { description: FILTER_DESCRIPTIONS[name], schema: { type: 'string', ...(name.endsWith('_id') ? { format: 'uuid' } : {}) } },
        ]),
      ),
      ...PAGING_PARAMETERS,
    },
    errors: [400, 401, 403],
    handler: async ({ db, req, caller }) => {
      const parameters = parseQueryString(req.url)
      const result = await listAuditLog(db, caller, parameters)
      return { body: result, headers: pageHeaders(BASE, parameters, result.next_cursor) }
    },
  },
  {
    method: 'GET',
    path: `${BASE}/verify`,
    summary: "Checks the workspace's audit chain: intact with the entries checked, or the first bad entry (admins)",
    tag: TAG,
    auth: 'required',
    scope: 'workspace:admin',
    response: AuditVerdict,
    errors: [401, 403],
    handler: async ({ db, caller }) => ({ body: await verifyAuditLog(db, caller) }),
  },
  {
    method: 'POST',
    path: `${BASE}/export`,
    summary: "The workspace's audit log, oldest first, streamed as CSV or NDJSON (admins)",
    tag: TAG,
    auth: 'required',
    scope: 'workspace:admin',
    body: ExportBody,
    streams: true,
    longRead: true,
    limitedPerWorkspace: 'exports',
    errors: [401, 403, 413, 415, 422, 429, 503],
    example: { request: { format: 'ndjson', filter: { action: 'member.role_changed', since: '2026-11-01T00:00:00Z' } } },
    handler: async ({ db, res, body, caller, services }) => {
      const request = body as AuditExportRequest
      // Checked before the 200 goes out (row-level security repeats it for every row).
      const { query, header } = auditExportQuery(caller, request)
      await streamExport(db, res, services.config, { query, header, format: request.format ?? 'csv', name: 'audit-log' })
    },
  },
)
