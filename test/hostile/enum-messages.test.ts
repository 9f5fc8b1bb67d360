// A field with a fixed set of values says them when it is wrong ("stage must be one of lead,
// qualified, ..."; issue 43 item 4): every enum of every route's body schema, through the sentence
// the validator gives (src/http/validation-messages.ts), and the deal's stage, whose values are the
// workspace's own stages, refused by the database with them listed, from the API and in SQL alike.
import t from 'tap'
import type { TSchema } from 'typebox'
import { allRoutes } from '../../src/http/routes/index.ts'
import { fieldMessage } from '../../src/http/validation-messages.ts'
import { ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'
import { startTestServer } from '../helpers/server.ts'

type Schema = {
  anyOf?: Schema[]
  enum?: unknown[]
  const?: unknown
  properties?: Record<string, Schema>
  items?: Schema
  patternProperties?: Record<string, Schema>
  additionalProperties?: Schema | boolean
}

/** The fixed values a schema allows (an enum, or a union of constants, null aside), or null. */
function fixedValues(schema: Schema): unknown[] | null {
  if (schema.enum) return schema.enum
  const choices = schema.anyOf?.filter((choice) => (choice as { type?: string }).type !== 'null')
  if (choices?.length === 1) return fixedValues(choices[0])
  if (choices?.length && choices.every((choice) => 'const' in choice)) return choices.map((choice) => choice.const)
  return null
}

/** Every pointer in a body schema whose value is one of fixed values, with those values. */
function enumPointers(schema: Schema, pointer = ''): [string, unknown[]][] {
  const values = fixedValues(schema)
  if (values) return [[pointer, values]]
  const found: [string, unknown[]][] = []
  for (const choice of schema.anyOf ?? []) found.push(...enumPointers(choice, pointer))
  for (const [name, property] of Object.entries(schema.properties ?? {})) found.push(...enumPointers(property, `${pointer}/${name}`))
  if (schema.items) found.push(...enumPointers(schema.items, `${pointer}/0`))
  for (const inner of Object.values(schema.patternProperties ?? {})) found.push(...enumPointers(inner, `${pointer}/key`))
  if (typeof schema.additionalProperties === 'object') found.push(...enumPointers(schema.additionalProperties, `${pointer}/key`))
  return found
}

t.test("every enum field's message lists its values", async (t) => {
  let checked = 0
  for (const route of allRoutes()) {
    for (const body of [route.body, route.formBody]) {
      if (!body) continue
      for (const [pointer, values] of enumPointers(body as Schema)) {
        const message = fieldMessage(body as TSchema, pointer)
        const listed = values.every((value) => message.includes(String(value)))
        t.ok(listed, `${route.method} ${route.path} ${pointer}: "${message}" names ${values.join(', ')}`)
        checked++
      }
    }
  }
  t.ok(checked >= 10, `${checked} enum fields checked`)
})

t.test('a stage the workspace does not have is refused with its stages listed, in the API and in SQL', async (t) => {
  const server = await startTestServer(t)
  const tenant = await createTenant(server.databaseUrl, { members: { 'ada@stages.test': 'admin' } })
  const token = tenant.members['ada@stages.test'].token
  const stages = (await server.request('GET', '/api/deal-stages', { token })).body.data.map((stage: { key: string }) => stage.key)
  const expected = `stage must be one of ${stages.join(', ')}`
  t.match(expected, /^stage must be one of lead, qualified, /)

  const created = await server.request('POST', '/api/deals', { token, body: { name: 'Renewal', stage: 'nope' } })
  t.equal(created.status, 422, created.text)
  t.equal(created.body.code, 'validation_failed')
  t.equal(created.body.detail, expected)
  t.match(created.body.errors, [{ pointer: '/stage', message: expected }])

  const batchCreate = await server.request('POST', '/api/deals/batch/create', {
    token,
    body: {
      inputs: [
        { name: 'Kept', stage: 'won' },
        { name: 'Refused', stage: 'nope' },
      ],
    },
  })
  t.match(
    batchCreate.body.results,
    [{ status: 201 }, { status: 422, problem: { detail: expected } }],
    'a batch create names them per item (a create with a stage skips the deal trigger)',
  )

  const deal = (await server.request('POST', '/api/deals', { token, body: { name: 'Renewal' } })).body.data
  const updated = await server.request('PATCH', `/api/deals/${deal.id}`, { token, body: { stage: 'closed' } })
  t.equal(updated.status, 422, updated.text)
  t.equal(updated.body.detail, expected, 'an update says it too')

  const batch = await server.request('POST', '/api/deals/batch/update', { token, body: { inputs: [{ id: deal.id, stage: 'closed' }] } })
  t.equal(batch.status, 200, batch.text)
  t.match(batch.body.results, [{ status: 422, problem: { detail: expected, errors: [{ pointer: '/stage' }] } }], 'and a batch item')

  const owner = await ownerClient(t, server.databaseUrl)
  const refused = await owner
    .query(`update crm.deals set stage = 'nope' where id = $1`, [deal.id])
    .then(() => null)
    .catch((error: { message: string; code: string }) => error)
  t.match(refused, { code: 'CR422', message: expected }, 'the database refuses any writer with the same sentence')
})
