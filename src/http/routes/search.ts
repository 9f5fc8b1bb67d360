// GET /api/search: one query across contacts, companies and deals, best matches first.
import Type from 'typebox'
import { readScope } from '../../auth/scopes.ts'
import { InvalidParameterError } from '../../errors.ts'
import { limitOf } from '../../paging.ts'
import { RECORD_TYPES, type RecordType, recordTypeByPath } from '../../records/fields.ts'
import { parseSearchText } from '../../records/list-parameters.ts'
import { parseQueryString, safeName } from '../../records/query-string.ts'
import { describe, searchType } from '../../records/search.ts'
import { Uuid } from '../../uuid.ts'
import { defineRoutes } from '../route.ts'

const SearchResult = Type.Object({
  type: Type.Union([Type.Literal('contact'), Type.Literal('company'), Type.Literal('deal')]),
  id: Uuid,
  title: Type.String(),
  subtitle: Type.Union([Type.String(), Type.Null()]),
  score: Type.Number({ description: 'Higher is better: 3+ exact, 2+ prefix, 1+ fuzzy match' }),
  record: Type.Object({}, { additionalProperties: true, description: 'The record as GET /api/{type}/{id} shows it' }),
})

export default defineRoutes({
  method: 'GET',
  path: '/api/search',
  summary: 'Search contacts, companies and deals at once (exact, then prefix, then fuzzy matches)',
  tag: 'search',
  auth: 'required',
  // Any read (or write) scope of a type; the results hold only the types the scopes cover.
  scope: RECORD_TYPES.map(readScope),
  response: Type.Object({ data: Type.Array(SearchResult) }),
  queryParameters: {
    q: { description: 'The text to search for (1 to 200 characters)', schema: { type: 'string', minLength: 1, maxLength: 200 } },
    types: { description: 'Comma-separated: contacts, companies, deals (default all three)', schema: { type: 'string' } },
    limit: {
      description: 'At most this many results, 1 to 100 (default 20)',
      schema: { type: 'integer', minimum: 1, maximum: 100, default: 20 },
    },
  },
  errors: [400, 401],
  example: {
    response: {
      data: [
        {
          type: 'company',
          id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a',
          title: 'Globex',
          subtitle: 'globex.com',
          score: 4,
          record: { id: '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a', name: 'Globex', domain: 'globex.com' },
        },
      ],
    },
  },
  handler: async ({ req, db }) => {
    const parameters = parseQueryString(req.url)
    let q: string | null = null
    let limit = 20
    let types: RecordType[] = RECORD_TYPES
    for (const [name, value] of parameters) {
      if (name === 'q') q = parseSearchText(value)
      else if (name === 'limit') limit = limitOf(value, 20, 100)
      else if (name === 'types') {
        const names = value
          .split(',')
          .map((part) => part.trim())
          .filter(Boolean)
        const chosen = names.map((part) => {
          const type = recordTypeByPath(part)
          if (!type) throw new InvalidParameterError(`types: unknown type ${safeName(part)} (use contacts, companies, deals)`)
          return type
        })
        if (chosen.length === 0) throw new InvalidParameterError('types must name at least one of contacts, companies, deals')
        types = RECORD_TYPES.filter((type) => chosen.includes(type))
      } else throw new InvalidParameterError(`Unknown query parameter ${safeName(name)}`)
    }
    if (q === null) throw new InvalidParameterError('q is required: the text to search for')
    const hits = []
    for (const type of types) hits.push(...(await searchType(db, type, q, limit)))
    hits.sort((a, b) => b.score - a.score || types.indexOf(a.type) - types.indexOf(b.type))
    return {
      body: {
        data: hits.slice(0, limit).map((hit) => ({
          type: hit.type.name,
          id: hit.record.id,
          ...describe(hit.type, hit.record),
          score: Math.round(hit.score * 10_000) / 10_000,
          record: hit.record,
        })),
      },
    }
  },
})
