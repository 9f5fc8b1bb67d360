// GET /api/openapi.json: the OpenAPI 3.1 document of every /api route, built from the route
// definitions registered in ./index.ts (read when first asked, so every area is included).
import Type from 'typebox'
import { buildOpenApiDocument } from '../openapi.ts'
import { defineRoutes } from '../route.ts'

let document: Record<string, unknown> | null = null

export default defineRoutes({
  method: 'GET',
  path: '/api/openapi.json',
  summary: 'This API as an OpenAPI 3.1 document',
  tag: 'operations',
  auth: 'none',
  response: Type.Object(
    {
      openapi: Type.String(),
      info: Type.Object({}, { additionalProperties: true }),
      paths: Type.Object({}, { additionalProperties: true }),
    },
    { additionalProperties: true },
  ),
  handler: async () => {
    if (!document) {
      const { allRoutes } = await import('./index.ts')
      document = buildOpenApiDocument(allRoutes())
    }
    return { body: document }
  },
})
