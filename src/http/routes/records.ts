// /api/contacts, /api/companies, /api/deals: list, search, read, create, update, delete. The
// three types share one set of handlers driven by the whitelist in src/records/fields.ts.
import type { IncomingMessage } from 'node:http'
import { readScope, writeScope } from '../../auth/scopes.ts'
import { NotFoundError } from '../../errors.ts'
import { PAGING_PARAMETERS, pageHeaders } from '../../paging.ts'
import { RECORD_TYPES, type RecordType } from '../../records/fields.ts'
import { idempotencyKeyOf, withIdempotency } from '../../records/idempotency.ts'
import { parseListRequest } from '../../records/list-parameters.ts'
import { type Page, pageJson, runList } from '../../records/list-query.ts'
import {
  checkId,
  createRecord,
  deleteRecord,
  etagOf,
  type RecordJson,
  readRecord,
  recordIdOf,
  updateRecord,
} from '../../records/operations.ts'
import { parseQueryString } from '../../records/query-string.ts'
import { one, page, SCHEMAS } from '../../records/schemas.ts'
import { searchPart } from '../../records/search.ts'
import { JsonText, type RouteDefinition } from '../route.ts'

const LIST_PARAMETERS = {
  ...PAGING_PARAMETERS,
  sort: {
    description: 'Comma-separated fields, - for descending (e.g. -amount,name); id is always the last tie-breaker; default created_at,id',
    schema: { type: 'string' },
  },
  updated_since: {
    description: 'Only records updated at or after this time (same as filter[updated_at][gte])',
    schema: { type: 'string', format: 'date-time' },
  },
  filter: {
    description:
      'filter[field]=value (equals) or filter[field][op]=value with op one of eq, ne, lt, lte, gt, gte, in (comma-separated), contains, starts_with (case-insensitive), is_null (true/false); filter[custom_fields.<key>]=value for equality',
    schema: { type: 'object', additionalProperties: true },
  },
}

function pageAnswer(path: string, parameters: Map<string, string>, result: Page) {
  return { body: new JsonText(pageJson(result)), headers: pageHeaders(path, parameters, result.next_cursor) }
}

/**
 * One record's answer, `{"data":…}`, around its JSON text as PostgreSQL rendered it: neither parsed
 * nor serialized again. A create stays an object, since an Idempotency-Key stores its answer as JSON.
 */
function recordBody(recordText: string): JsonText {
  return new JsonText(`{"data":${recordText}}`)
}

function header(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name]
  return Array.isArray(value) ? value.join(', ') : value
}

function routesFor(type: RecordType): RouteDefinition[] {
  const schemas = SCHEMAS[type.name]
  const base = `/api/${type.path}`
  const tag = type.path
  const record = schemas.record
  return [
    {
      method: 'GET',
      path: `${base}/search`,
      summary: `Search ${type.path} (exact, then prefix, then fuzzy matches; same paging, sort and filters as the list)`,
      tag,
      auth: 'required',
      scope: readScope(type),
      response: page(record),
      queryParameters: {
        q: { description: 'The text to search for (1 to 200 characters)', schema: { type: 'string', minLength: 1, maxLength: 200 } },
        ...LIST_PARAMETERS,
      },
      errors: [400, 401],
      example: { response: { data: [schemas.exampleRecord], next_cursor: null } },
      singleStatement: true,
      handler: async ({ req, db }) => {
        const parameters = parseQueryString(req.url)
        const request = parseListRequest(type, parameters, { search: true })
        return pageAnswer(`${base}/search`, parameters, await runList(db, type, request, searchPart(type, request.q!)))
      },
    },
    {
      method: 'GET',
      path: base,
      summary: `List ${type.path}`,
      tag,
      auth: 'required',
      scope: readScope(type),
      response: page(record),
      queryParameters: LIST_PARAMETERS,
      errors: [400, 401],
      example: {
        response: {
          data: [schemas.exampleRecord],
          next_cursor: 'eyJzIjoiY3JlYXRlZF9hdCxpZCIsImsiOlsiMTc5NTI3ODQyMTEyMzQ1NiIsIjAxOTM1ZjNjLTlkMDAtN2IyMi04ZTNmLTRkNWM2YjdhOGY5ZSJdfQ',
        },
      },
      singleStatement: true,
      handler: async ({ req, db }) => {
        const parameters = parseQueryString(req.url)
        return pageAnswer(base, parameters, await runList(db, type, parseListRequest(type, parameters)))
      },
    },
    {
      method: 'POST',
      path: base,
      summary: `Create a ${type.label} (honours Idempotency-Key)`,
      tag,
      auth: 'required',
      scope: writeScope(type),
      body: schemas.create,
      status: 201,
      response: one(record),
      errors: [400, 401, 403, 409, 413, 415, 422],
      example: { request: schemas.example, response: { data: schemas.exampleRecord } },
      // An Idempotency-Key claims its key and stores the answer in the same transaction.
      writesInOneStatement: (req) => req.headers['idempotency-key'] === undefined,
      handler: async ({ req, db, body }) => {
        const key = idempotencyKeyOf(req.headers['idempotency-key'])
        return withIdempotency(db, key, { method: 'POST', path: base, body }, async () => {
          const text = await createRecord(db, type, body)
          const headers = { Location: `${base}/${recordIdOf(text)}`, ETag: etagOf(text) }
          // Without a key the record's text goes out as PostgreSQL rendered it, like GET one's; a
          // key stores the answer as JSON and replays it, so that answer is the parsed record.
          return { status: 201, body: key === null ? recordBody(text) : { data: JSON.parse(text) as RecordJson }, headers }
        })
      },
    },
    {
      method: 'GET',
      path: `${base}/:id`,
      summary: `Read a ${type.label} (sends ETag; If-None-Match answers 304)`,
      tag,
      auth: 'required',
      scope: readScope(type),
      response: one(record),
      errors: [401, 404],
      example: { response: { data: schemas.exampleRecord } },
      singleStatement: true,
      handler: async ({ req, db, params }) => {
        const found = await readRecord(db, type, checkId(params.id))
        if (found === null) throw new NotFoundError(`No such ${type.label}`)
        const etag = etagOf(found)
        const ifNoneMatch = header(req, 'if-none-match')
        if (ifNoneMatch?.split(',').some((tag) => tag.trim().replace(/^W\//, '') === etag || tag.trim() === '*')) {
          return { status: 304, headers: { ETag: etag } }
        }
        return { body: recordBody(found), headers: { ETag: etag } }
      },
    },
    ...(['PUT', 'PATCH'] as const).map(
      (method): RouteDefinition => ({
        method,
        path: `${base}/:id`,
        summary: `Update a ${type.label}: only the fields sent change${method === 'PATCH' ? ' (alias of PUT)' : ''}; honours If-Match`,
        tag,
        auth: 'required',
        scope: writeScope(type),
        body: schemas.update,
        response: one(record),
        errors: [401, 403, 404, 409, 412, 413, 415, 422],
        example: {
          request: { name: schemas.example.name ?? undefined, custom_fields: { tier: 'gold' } },
          response: { data: schemas.exampleRecord },
        },
        // If-Match locks the row and compares its ETag before the update: a transaction.
        writesInOneStatement: (req) => req.headers['if-match'] === undefined,
        handler: async ({ req, db, params, body }) => {
          const text = await updateRecord(db, type, checkId(params.id), body, header(req, 'if-match'))
          return { body: recordBody(text), headers: { ETag: etagOf(text) } }
        },
      }),
    ),
    {
      method: 'DELETE',
      path: `${base}/:id`,
      summary: `Delete a ${type.label}`,
      tag,
      auth: 'required',
      scope: writeScope(type),
      status: 204,
      errors: [401, 403, 404],
      writesInOneStatement: () => true,
      handler: async ({ db, params }) => {
        await deleteRecord(db, type, checkId(params.id))
        return { status: 204 }
      },
    },
  ]
}

export default RECORD_TYPES.flatMap(routesFor)
