// PUT/GET /api/associations/{type}/{id}: the records linked to one record, by type.

import { readScope, writeScope } from '../../auth/scopes.ts'
import {
  type Associations,
  associationsBodySchema,
  associationsResponseSchema,
  readAssociations,
  replaceAssociations,
} from '../../records/associations.ts'
import { RECORD_TYPES, type RecordType } from '../../records/fields.ts'
import { checkId } from '../../records/operations.ts'
import type { RouteDefinition } from '../route.ts'

const EXAMPLE_ID = '01935f3c-9c00-7a11-9d2e-3c4b5a6f7e8d'

function routesFor(type: RecordType): RouteDefinition[] {
  const path = `/api/associations/${type.path}/:id`
  const others = RECORD_TYPES.filter((other) => other !== type)
  const example = Object.fromEntries(others.map((other) => [other.path, [EXAMPLE_ID]]))
  return [
    {
      method: 'GET',
      path,
      summary: `The ${others.map((other) => other.path).join(' and ')} linked to a ${type.label}`,
      tag: 'associations',
      auth: 'required',
      scope: readScope(type),
      response: associationsResponseSchema(type),
      errors: [401, 404],
      example: { response: { data: example } },
      handler: async ({ db, params }) => ({ body: { data: await readAssociations(db, type, checkId(params.id)) } }),
    },
    {
      method: 'PUT',
      path,
      summary: `Replace the linked ${others.map((other) => other.path).join(' and/or ')} of a ${type.label} (each key sent replaces its set; needs update on the ${type.label})`,
      tag: 'associations',
      auth: 'required',
      scope: writeScope(type),
      body: associationsBodySchema(type),
      response: associationsResponseSchema(type),
      errors: [401, 403, 404, 413, 415, 422],
      example: { request: { [others[0].path]: [EXAMPLE_ID] }, response: { data: example } },
      handler: async ({ db, params, body }) => ({
        body: { data: await replaceAssociations(db, type, checkId(params.id), body as Associations) },
      }),
    },
  ]
}

export default RECORD_TYPES.flatMap(routesFor)
