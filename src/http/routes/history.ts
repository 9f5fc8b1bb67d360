// GET /api/{type}/{id}/history: a record's changes, newest first (docs/api.md section 5b).
import { readScope } from '../../auth/scopes.ts'
import { PAGING_PARAMETERS, pageHeaders } from '../../paging.ts'
import { RECORD_TYPES, type RecordType } from '../../records/fields.ts'
import { historyPageSchema, readHistory } from '../../records/history.ts'
import { checkId } from '../../records/operations.ts'
import { parseQueryString } from '../../records/query-string.ts'
import { JsonText, type RouteDefinition } from '../route.ts'

const EXAMPLE_USER = '01935f3c-9a00-7c11-8d2e-3c4b5a6f7e8d'

function routeFor(type: RecordType): RouteDefinition {
  return {
    method: 'GET',
    path: `/api/${type.path}/:id/history`,
    summary: `The changes of a ${type.label}, newest first (404 unless you may view it now; admins also read a deleted ${type.label}'s)`,
    tag: type.path,
    auth: 'required',
    scope: readScope(type),
    response: historyPageSchema,
    queryParameters: PAGING_PARAMETERS,
    errors: [400, 401, 404],
    example: {
      response: {
        data: [
          {
            id: '01935f3c-9e00-7b22-8e3f-4d5c6b7a8f9e',
            occurred_at: '2026-11-22T03:00:21.123Z',
            action: 'updated',
            actor: { user_id: EXAMPLE_USER, name: 'Ann Admin', via: 'api', token_id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a' },
            changes: { owner_id: { from: EXAMPLE_USER, to: null }, 'custom_fields.tier': { from: null, to: 'gold' } },
          },
        ],
        next_cursor: null,
      },
    },
    singleStatement: true,
    handler: async ({ req, db, params }) => {
      const id = checkId(params.id)
      const parameters = parseQueryString(req.url)
      const result = await readHistory(db, type, id, parameters)
      return { body: new JsonText(result.json), headers: pageHeaders(`/api/${type.path}/${id}/history`, parameters, result.next_cursor) }
    },
  }
}

export default RECORD_TYPES.map(routeFor)
