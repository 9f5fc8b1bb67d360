// WAL positions as the read routing compares them (src/db/request/read-replicas.ts): parsed from pg_lsn's
// text, they order as PostgreSQL orders them, over the whole 64-bit range.
import fc from 'fast-check'
import t from 'tap'
import { parseLsn } from '../../src/db/request/read-replicas.ts'
import { adminQuery } from '../helpers/database.ts'

const lsnText = fc
  .tuple(fc.integer({ min: 0, max: 0xffffffff }), fc.integer({ min: 0, max: 0xffffffff }))
  .map(([high, low]) => `${high.toString(16).toUpperCase()}/${low.toString(16).toUpperCase()}`)

t.test('parsed positions order as pg_lsn does', async (t) => {
  const pairs = fc.sample(fc.tuple(lsnText, lsnText), 200)
  pairs.push(['0/0', 'FFFFFFFF/FFFFFFFF'], ['1/0', '0/FFFFFFFF'], ['16/B374D848', '16/B374D848'])
  const { rows } = await adminQuery(
    `select a, b, sign(a::pg_lsn - b::pg_lsn)::int as order from unnest($1::text[], $2::text[]) as p (a, b)`,
    [pairs.map(([a]) => a), pairs.map(([, b]) => b)],
  )
  for (const row of rows) {
    const [a, b] = [parseLsn(row.a), parseLsn(row.b)]
    t.equal(a < b ? -1 : a > b ? 1 : 0, row.order, `${row.a} against ${row.b}`)
  }
})
