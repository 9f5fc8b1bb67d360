// crm.uuid_v7 on every supported server: a version 7 UUID (RFC 9562) whose first 48 bits are the
// clock's milliseconds, and ids made one after another in a session are ordered by when they were
// made (PostgreSQL 18's uuidv7() does it with its sub-millisecond bits; before 18, the SQL
// definition of sql/definitions/01_ids.before_18.sql does the same).
import t from 'tap'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'

const client = await ownerClient(t, await createTestDatabase(t))

t.test('a version 7 UUID carrying the milliseconds of its making', async (t) => {
  const { rows } = await client.query<{ id: string; before: string; after: string }>(
    `select floor(extract(epoch from clock_timestamp()) * 1000)::bigint::text as before, crm.uuid_v7()::text as id,
            floor(extract(epoch from clock_timestamp()) * 1000)::bigint::text as after
       from generate_series(1, 200)`,
  )
  for (const { id, before, after } of rows) {
    const hex = id.replaceAll('-', '')
    const ms = BigInt(`0x${hex.slice(0, 12)}`)
    if (hex[12] !== '7' || !'89ab'.includes(hex[16]) || ms < BigInt(before) || ms > BigInt(after)) {
      t.fail(`${id}: made between ${before} and ${after} ms`)
      return
    }
  }
  t.pass('200 ids: version 7, RFC 9562 variant, their clock')
})

t.test('ids made one after another in a session are ordered', async (t) => {
  const ids: string[] = []
  for (let i = 0; i < 300; i++) ids.push((await client.query<{ id: string }>('select crm.uuid_v7()::text as id')).rows[0].id)
  const unordered = ids.findIndex((id, i) => i > 0 && id <= ids[i - 1])
  t.equal(unordered, -1, unordered === -1 ? '300 in order' : `${ids[unordered - 1]} then ${ids[unordered]}`)
})
