// POST /api/{type}/batch/{create,read,update,upsert,delete} (docs/api.md section 5a): one request
// against the rate limit, one transaction, per-item answers as the single routes give them.
import Type, { type TSchema } from 'typebox'
import { readScope, writeScope } from '../../auth/scopes.ts'
import {
  AtomicBatchFailed,
  BATCH_LIMIT,
  type BatchOperation,
  checkBatchSize,
  checkFields,
  createAll,
  matchFieldsOf,
  runBatch,
  runItem,
  updateAll,
  upsertAll,
} from '../../records/batch.ts'
import { RECORD_TYPES, type RecordType } from '../../records/fields.ts'
import { idempotencyKeyOf, withIdempotency } from '../../records/idempotency.ts'
import { SCHEMAS } from '../../records/schemas.ts'
import { ApiError, problemBody, toApiError } from '../problem.ts'
import { type RouteDefinition, validateBody } from '../route.ts'

const Atomic = Type.Optional(
  Type.Boolean({ default: false, description: 'true: all or nothing (one failed item writes nothing: 422 batch_failed)' }),
)
const Ids = Type.Array(Type.String({ maxLength: 64 }), { description: `The records' ids, at most ${BATCH_LIMIT}` })
const Inputs = (description: string) =>
  Type.Array(Type.Object({}, { additionalProperties: true, description }), { description: `At most ${BATCH_LIMIT} inputs` })

const Problem = Type.Object({}, { additionalProperties: true, description: 'The problem details the single route would answer' })
const BatchResponse = (record: TSchema) =>
  Type.Object({
    results: Type.Array(
      Type.Object({
        index: Type.Integer({ description: 'The position of the input' }),
        status: Type.Integer({ description: 'What the single-record route would answer (201, 200, 204, 404, 409, 412, 422, 403)' }),
        data: Type.Optional(record),
        etag: Type.Optional(Type.String({ description: "The record's ETag, as the single route sends it" })),
        problem: Type.Optional(Problem),
      }),
    ),
    counts: Type.Object({ succeeded: Type.Integer(), failed: Type.Integer() }),
  })

type BatchBody = { inputs?: unknown[]; ids?: unknown[]; atomic?: boolean; match_on?: string; fields?: string[] }

function bodySchema(type: RecordType, operation: BatchOperation): TSchema {
  const single = `the body of ${operation === 'create' ? 'POST' : 'PATCH'} /api/${type.path}`
  switch (operation) {
    case 'create':
      return Type.Object({ inputs: Inputs(`Like ${single}`), atomic: Atomic }, { additionalProperties: false })
    case 'update':
      return Type.Object(
        { inputs: Inputs(`{"id", "if_match"?, ...fields}: like ${single}; if_match is an ETag (412 in its item)`), atomic: Atomic },
        { additionalProperties: false },
      )
    case 'upsert':
      return Type.Object(
        {
          inputs: Inputs('Fields of the record, with the value of match_on: an update when a visible record has it, else a create'),
          match_on: Type.Optional(
            // One literal when the type has only `id` (deals): a union of one is not a union.
            Type.Unsafe<string>({
              type: 'string',
              enum: matchFieldsOf(type),
              default: 'id',
              description: 'The unique value that finds the record',
            }),
          ),
          atomic: Atomic,
        },
        { additionalProperties: false },
      )
    case 'read':
      return Type.Object(
        {
          ids: Ids,
          fields: Type.Optional(Type.Array(Type.String(), { maxItems: 64, description: 'Only these fields in each record (id always)' })),
        },
        { additionalProperties: false },
      )
    case 'delete':
      return Type.Object({ ids: Ids, atomic: Atomic }, { additionalProperties: false })
  }
}

function batchRoute(type: RecordType, operation: BatchOperation): RouteDefinition {
  const path = `/api/${type.path}/batch/${operation}`
  const schemas = SCHEMAS[type.name]
  return {
    method: 'POST',
    path,
    summary: `Batch ${operation} of up to ${BATCH_LIMIT} ${type.path}: one result per input, in order (honours Idempotency-Key)`,
    tag: type.path,
    auth: 'required',
    scope: operation === 'read' ? readScope(type) : writeScope(type),
    body: bodySchema(type, operation),
    // Validating 100,000 tiny items costs 150 ms to 1 s and 30 to 50 MiB (docs/security.md): the
    // count is refused first.
    checkBodyBeforeSchema: (body) => {
      for (const key of ['inputs', 'ids'] as const) if (Array.isArray(body[key])) checkBatchSize(body[key], `/${key}`)
    },
    response: BatchResponse(schemas.record),
    errors: [400, 401, 403, 409, 413, 415, 422],
    example: {
      request: operation === 'read' || operation === 'delete' ? { ids: [schemas.exampleRecord.id] } : { inputs: [schemas.example] },
      response: {
        results: [{ index: 0, status: operation === 'create' ? 201 : 200, data: schemas.exampleRecord }],
        counts: { succeeded: 1, failed: 0 },
      },
    },
    handler: async ({ req, db, body, requestId }) => {
      const request = body as BatchBody
      const list = (request.inputs ?? request.ids ?? []) as unknown[]
      checkBatchSize(list, request.inputs ? '/inputs' : '/ids')
      checkFields(type, request.fields)
      const key = idempotencyKeyOf(req.headers['idempotency-key'])
      const problemOf = (error: unknown) => {
        const answer = toApiError(error)
        // A bug or the database gone is not the item's answer: the request fails as a whole.
        return answer.status >= 500 ? null : { status: answer.status, body: problemBody(answer, requestId) }
      }
      const options = {
        matchOn: request.match_on,
        validate: (schema: TSchema, value: unknown) => validateBody<Record<string, unknown>>(schema, value),
      }
      try {
        return await withIdempotency(db, key, { method: 'POST', path, body }, async () => ({
          status: 200,
          body: await runBatch(
            db,
            list,
            request.atomic === true,
            (item, input) => runItem(item, type, operation, input, options),
            problemOf,
            {
              fields: request.fields,
              runAll:
                operation === 'create'
                  ? (batch) => createAll(batch, type, list, options.validate)
                  : operation === 'upsert'
                    ? (batch) => upsertAll(batch, type, list, options)
                    : operation === 'update'
                      ? (batch) => updateAll(batch, type, list, options.validate)
                      : undefined,
            },
          ),
          headers: {},
        }))
      } catch (error) {
        if (!(error instanceof AtomicBatchFailed)) throw error
        throw new ApiError(422, 'batch_failed', 'Batch failed', 'An item failed, so the atomic batch wrote nothing', {
          extensions: error.answer,
          cause: error,
        })
      }
    },
  }
}

const OPERATIONS: BatchOperation[] = ['create', 'read', 'update', 'upsert', 'delete']

export default RECORD_TYPES.flatMap((type) => OPERATIONS.map((operation) => batchRoute(type, operation)))
