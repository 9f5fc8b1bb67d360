// POST /api/{type}/export: the caller's visible and exportable records as CSV or NDJSON, streamed.
import Type from 'typebox'
import { readScope } from '../../auth/scopes.ts'
import { sql } from '../../db/pool.ts'
import { GrantedRow } from '../../db/typed-rows.ts'
import { ForbiddenError } from '../../errors.ts'
import { type ExportRequest, exportQuery } from '../../exports/export-query.ts'
import { streamExport } from '../../exports/stream-export.ts'
import { RECORD_TYPES, type RecordType } from '../../records/fields.ts'
import type { RouteDefinition } from '../route.ts'

const ExportBody = Type.Object(
  {
    format: Type.Optional(
      Type.Union([Type.Literal('csv'), Type.Literal('ndjson')], { description: 'csv (default, with a header row) or ndjson' }),
    ),
    fields: Type.Optional(
      Type.Array(Type.String({ maxLength: 80 }), { maxItems: 100, description: 'The fields to export, in order (default: every field)' }),
    ),
    filter: Type.Optional(
      Type.Record(Type.String(), Type.Unknown(), {
        description:
          'The list filters as JSON: {"stage": {"in": ["won"]}, "amount": {"gte": "1000"}}, {"email": "a@b.c"}, {"company_id": null}',
      }),
    ),
    sort: Type.Optional(
      Type.String({ maxLength: 200, description: 'As in lists: -amount,name (id is the last tie-breaker; default created_at,id)' }),
    ),
  },
  { additionalProperties: false },
)

function routeFor(type: RecordType): RouteDefinition {
  return {
    method: 'POST',
    path: `/api/${type.path}/export`,
    summary: `Export ${type.path} the caller may view and export, streamed as CSV or NDJSON (needs the ${type.path}:export grant)`,
    tag: type.path,
    auth: 'required',
    scope: readScope(type),
    body: ExportBody,
    streams: true,
    longRead: true,
    limitedPerWorkspace: 'exports',
    errors: [400, 401, 403, 413, 415, 422, 429, 503],
    example: { request: { format: 'csv', fields: ['id', 'name'], sort: '-created_at' } },
    handler: async ({ db, res, body, services }) => {
      const request = body as ExportRequest
      // Checked before the 200 goes out; the query below repeats the scope for every row.
      const allowed = await db.oneFirst(sql.type(GrantedRow)`select crm.grant_scope(${type.path}, 'export') is not null as granted`)
      if (!allowed) throw new ForbiddenError(`Your role does not allow exporting ${type.path}`)
      const { query, header } = exportQuery(type, request)
      await streamExport(db, res, services.config, { query, header, format: request.format ?? 'csv', name: type.path })
    },
  }
}

export default RECORD_TYPES.map(routeFor)
