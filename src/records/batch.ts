// Batch operations on records (docs/api.md section 5a): up to 100 inputs in one request and one
// transaction. Each item runs the single-record operation of operations.ts, so it meets the same
// policies, triggers and events as the single route would; a non-atomic batch runs each item in a
// savepoint, so a refused item rolls back alone and the others carry on (after an optimistic pass
// without them: see runBatch).
import type { TSchema } from 'typebox'
import Type from 'typebox'
import { type DatabaseTransactionConnection, sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { NotFoundError, ValidationError } from '../errors.ts'
import type { RecordType } from './fields.ts'
import { checkId, createRecord, createRecords, deleteRecord, etagOf, readRecord, updateRecord, updateRecords } from './operations.ts'
import { SCHEMAS } from './schemas.ts'

export const BATCH_LIMIT = 100

export type BatchOperation = 'create' | 'read' | 'update' | 'upsert' | 'delete'

/** What one item answers: the single route's status and, for a record, its JSON text. */
export type ItemAnswer = { status: number; record?: string }

export type ItemResult = { index: number; status: number; data?: unknown; etag?: string; problem?: Record<string, unknown> }
export type BatchAnswer = { results: ItemResult[]; counts: { succeeded: number; failed: number } }

/** An item's refusal as a problem body with its status, or null for an error that is not the item's (a bug, the database gone). */
export type ProblemOf = (error: unknown) => { status: number; body: Record<string, unknown> } | null

/** Thrown when an atomic batch has a failed item: the request's transaction rolls back, so nothing it wrote stays. */
export class AtomicBatchFailed extends Error {
  readonly answer: BatchAnswer
  constructor(answer: BatchAnswer) {
    super('An item of an atomic batch failed')
    this.answer = answer
  }
}

/** The unique value an upsert matches on, by record type. */
const MATCH_FIELDS: Record<string, readonly string[]> = { contact: ['id', 'email'], company: ['id', 'domain'], deal: ['id'] }

export function matchFieldsOf(type: RecordType): readonly string[] {
  return MATCH_FIELDS[type.name]
}

/** The body has at most BATCH_LIMIT entries in `list`, else 422 batch_too_large. */
export function checkBatchSize(list: unknown[], pointer: string): void {
  if (list.length > BATCH_LIMIT) {
    throw new ValidationError(
      `A batch takes at most ${BATCH_LIMIT} items; this one has ${list.length}`,
      [{ pointer, code: 'max_items', message: `must have at most ${BATCH_LIMIT} items` }],
      'batch_too_large',
    )
  }
}

/** The record's JSON reduced to the fields asked for (id always kept), or whole when none were. */
function selectFields(record: string, fields: readonly string[] | undefined): unknown {
  const parsed = JSON.parse(record) as Record<string, unknown>
  if (!fields) return parsed
  return Object.fromEntries(Object.entries(parsed).filter(([name]) => name === 'id' || fields.includes(name)))
}

/** `fields` of a batch/read names fields of the type, else 422 with the pointer of the first unknown one. */
export function checkFields(type: RecordType, fields: readonly string[] | undefined): void {
  const unknown = fields?.findIndex((name) => !type.byName.has(name)) ?? -1
  if (fields && unknown >= 0) {
    throw new ValidationError(`fields: ${type.label} has no field ${fields[unknown]}`, [
      { pointer: `/fields/${unknown}`, code: 'enum', message: `is not a field of ${type.label}` },
    ])
  }
}

/** Checks a body against its route schema (the HTTP layer's validator: 422 with pointers into the item). */
export type Validate = (schema: TSchema, value: unknown) => Record<string, unknown>

/** An update input without the members that address it (id, if_match): the PATCH body. */
function patchBody(input: Record<string, unknown>): Record<string, unknown> {
  const { id: _id, if_match: _ifMatch, ...body } = input
  return body
}

function ifMatchOf(input: Record<string, unknown>): string | undefined {
  const value = input.if_match
  if (value === undefined) return undefined
  if (typeof value !== 'string') {
    throw new ValidationError('if_match must be an ETag', [{ pointer: '/if_match', code: 'type', message: 'must be a string' }])
  }
  return value
}

function objectInput(input: unknown): Record<string, unknown> {
  if (input && typeof input === 'object' && !Array.isArray(input)) return input as Record<string, unknown>
  throw new ValidationError('An input must be an object', [{ pointer: '', code: 'type', message: 'must be an object' }])
}

const IdRow = rowType(Type.Object({ id: Type.String() }))

/** The value an upsert item matches on: a string (422 without), an id checked as a path id is (404). */
function matchValue(field: string, value: unknown): string {
  if (typeof value !== 'string') {
    throw new ValidationError(`${field} is required to match on it`, [
      { pointer: `/${field}`, code: 'required', message: `is required with match_on ${field}` },
    ])
  }
  return field === 'id' ? checkId(value) : value
}

/** The visible record whose unique `field` equals the input's, or null: the policies decide what is visible. */
async function matchedId(db: DatabaseTransactionConnection, type: RecordType, field: string, value: unknown): Promise<string | null> {
  const matched = matchValue(field, value)
  if (field === 'id') return matched
  return db.maybeOneFirst(sql.type(IdRow)`select t.id from ${type.table} as t where t.${sql.identifier([field])} = lower(${matched})`)
}

const MatchRow = rowType(Type.Object({ value: Type.String(), id: Type.String() }))

/**
 * Every input of an upsert at once (the optimistic pass of runBatch): one lookup of all match
 * values under the caller's policies, one INSERT for the new records (createRecords) and one
 * UPDATE per set of fields for the matched ones (updateRecords). A value that repeats in the batch
 * runs the items one by one, since each must see the writes of the ones before it.
 */
export async function upsertAll(
  db: DatabaseTransactionConnection,
  type: RecordType,
  inputs: readonly unknown[],
  options: { matchOn?: string; validate: Validate },
): Promise<ItemAnswer[]> {
  const field = options.matchOn ?? 'id'
  const items = inputs.map(objectInput)
  const values = items.map((item) => matchValue(field, item[field]))
  const oneByOne = async () => {
    const answers: ItemAnswer[] = []
    for (const input of inputs) answers.push(await runItem(db, type, 'upsert', input, options))
    return answers
  }
  if (new Set(values.map((value) => value.toLowerCase())).size < values.length) return oneByOne()
  const ids =
    field === 'id'
      ? new Map(values.map((value) => [value, value]))
      : new Map(
          (
            await db.any(sql.type(MatchRow)`
              select v.value, t.id from unnest(${sql.array(values, 'text')}) as v(value)
               -- Lateral: one index lookup per value, where a join would scan the table under its policies.
               cross join lateral (
                 select t.id from ${type.table} as t where t.${sql.identifier([field])} = lower(v.value)
               ) as t`)
          ).map((row) => [row.value, row.id]),
        )
  // Two values that PostgreSQL lowers alike find the same record: one by one, as the single requests would.
  if (new Set(ids.values()).size < ids.size) return oneByOne()
  const schemas = SCHEMAS[type.name]
  const created = values.flatMap((value, index) => (ids.has(value) ? [] : [index]))
  const updated = values.flatMap((value, index) => (ids.has(value) ? [index] : []))
  const createdRecords = await createRecords(
    db,
    type,
    created.map((index) => options.validate(schemas.create, patchBody(items[index]))),
  )
  const updatedRecords = await updateRecords(
    db,
    type,
    updated.map((index) => ({
      id: ids.get(values[index]) as string,
      body: options.validate(schemas.update, patchBody(items[index])),
      ifMatch: ifMatchOf(items[index]),
    })),
  )
  const answers: ItemAnswer[] = []
  for (const [position, index] of created.entries()) answers[index] = { status: 201, record: createdRecords[position] }
  for (const [position, index] of updated.entries()) answers[index] = { status: 200, record: updatedRecords[position] }
  return answers
}

/**
 * Every input of an update at once (the optimistic pass of runBatch): one UPDATE per set of fields
 * (updateRecords). An id that repeats in the batch runs the items one by one, since each must see
 * the writes of the ones before it.
 */
export async function updateAll(
  db: DatabaseTransactionConnection,
  type: RecordType,
  inputs: readonly unknown[],
  validate: Validate,
): Promise<ItemAnswer[]> {
  const items = inputs.map(objectInput)
  const ids = items.map((item) => checkId(typeof item.id === 'string' ? item.id : undefined))
  if (new Set(ids).size < ids.length) {
    const answers: ItemAnswer[] = []
    for (const input of inputs) answers.push(await runItem(db, type, 'update', input, { validate }))
    return answers
  }
  const schemas = SCHEMAS[type.name]
  const changes = items.map((item, index) => ({
    id: ids[index],
    body: validate(schemas.update, patchBody(item)),
    ifMatch: ifMatchOf(item),
  }))
  return (await updateRecords(db, type, changes)).map((record) => ({ status: 200, record }))
}

/** Every input of a create at once, in one INSERT: the optimistic pass of runBatch. */
export async function createAll(
  db: DatabaseTransactionConnection,
  type: RecordType,
  inputs: readonly unknown[],
  validate: Validate,
): Promise<ItemAnswer[]> {
  const bodies = inputs.map((input) => validate(SCHEMAS[type.name].create, input))
  return (await createRecords(db, type, bodies)).map((record) => ({ status: 201, record }))
}

/** One item of a batch, exactly as its single route runs it. */
export async function runItem(
  db: DatabaseTransactionConnection,
  type: RecordType,
  operation: BatchOperation,
  input: unknown,
  options: { matchOn?: string; validate: Validate },
): Promise<ItemAnswer> {
  const schemas = SCHEMAS[type.name]
  const validate = options.validate
  switch (operation) {
    case 'read': {
      const record = await readRecord(db, type, checkId(typeof input === 'string' ? input : undefined))
      if (record === null) throw new NotFoundError(`No such ${type.label}`)
      return { status: 200, record }
    }
    case 'delete':
      await deleteRecord(db, type, checkId(typeof input === 'string' ? input : undefined))
      return { status: 204 }
    case 'create':
      return { status: 201, record: await createRecord(db, type, validate(schemas.create, input)) }
    case 'update': {
      const item = objectInput(input)
      const id = checkId(typeof item.id === 'string' ? item.id : undefined)
      const body = validate(schemas.update, patchBody(item))
      return { status: 200, record: await updateRecord(db, type, id, body, ifMatchOf(item)) }
    }
    case 'upsert': {
      const item = objectInput(input)
      const field = options.matchOn ?? 'id'
      const id = await matchedId(db, type, field, item[field])
      if (id === null) return { status: 201, record: await createRecord(db, type, validate(schemas.create, patchBody(item))) }
      const body = validate(schemas.update, patchBody(item))
      return { status: 200, record: await updateRecord(db, type, id, body, ifMatchOf(item)) }
    }
  }
}

/** An item failed in the optimistic pass: its savepoint is rolled back and the batch runs again item by item. */
class ItemFailed extends Error {}

function succeeded(index: number, answer: ItemAnswer, fields: readonly string[] | undefined): ItemResult {
  if (answer.record === undefined) return { index, status: answer.status }
  return { index, status: answer.status, data: selectFields(answer.record, fields), etag: etagOf(answer.record) }
}

/**
 * Runs every input in order, in the request's transaction. First optimistically, all items in one
 * savepoint (`runAll`, e.g. one INSERT for a create, else one round trip per statement of an item); when an item fails, that savepoint
 * is rolled back and the batch runs again with each item in a savepoint of its own: an item that
 * fails with a problem the single route would answer is rolled back alone and carries that problem.
 * Any other error (a bug, the database gone) ends the request. Atomic: when an item failed,
 * AtomicBatchFailed ends the request, so its transaction rolls back everything (the Idempotency-Key
 * claim too), and the items that succeeded answer 424.
 */
export async function runBatch(
  db: DatabaseTransactionConnection,
  inputs: readonly unknown[],
  atomic: boolean,
  run: (db: DatabaseTransactionConnection, input: unknown) => Promise<ItemAnswer>,
  problemOf: ProblemOf,
  options: { fields?: readonly string[]; runAll?: (db: DatabaseTransactionConnection) => Promise<ItemAnswer[]> } = {},
): Promise<BatchAnswer> {
  const { fields } = options
  const runEach = async (batch: DatabaseTransactionConnection) => {
    const answers: ItemAnswer[] = []
    for (const input of inputs) answers.push(await run(batch, input))
    return answers
  }
  try {
    return await db.transaction(async (batch) => {
      let answers: ItemAnswer[]
      try {
        answers = await (options.runAll ?? runEach)(batch)
      } catch (error) {
        if (problemOf(error)) throw new ItemFailed()
        throw error
      }
      return { results: answers.map((answer, index) => succeeded(index, answer, fields)), counts: { succeeded: answers.length, failed: 0 } }
    })
  } catch (error) {
    if (!(error instanceof ItemFailed)) throw error
  }
  const results: ItemResult[] = []
  for (const [index, input] of inputs.entries()) {
    try {
      results.push(succeeded(index, await db.transaction((item) => run(item, input)), fields))
    } catch (error) {
      const problem = problemOf(error)
      if (!problem) throw error
      results.push({ index, status: problem.status, problem: problem.body })
    }
  }
  const failed = results.filter((result) => result.problem).length
  if (atomic && failed > 0) {
    // Nothing was written: every item counts as failed, those that would have succeeded as 424.
    throw new AtomicBatchFailed({
      results: results.map((result) => (result.problem ? result : { index: result.index, status: 424 })),
      counts: { succeeded: 0, failed: results.length },
    })
  }
  return { results, counts: { succeeded: results.length - failed, failed } }
}
