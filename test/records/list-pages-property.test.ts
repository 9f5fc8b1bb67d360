// Paging as a property: for any sort, page size and filter, the pages of a list, walked by their
// cursors, hold exactly the rows the database gives for that order, each rendered as the record's
// JSON function renders it, each page cut at its size; a search's pages are its one page of 200.
// The rows are made to break a page's assembly: names holding the character that joins a page's
// records (U+001E), line breaks, quotes and braces; equal names, amounts, dates and creation times,
// so the tie-breakers decide; nulls.
import fc from 'fast-check'
import t from 'tap'
import { type Client, startWorld } from './helpers.ts'

const SORTABLE = ['name', 'amount', 'close_date', 'stage', 'created_at'] as const

async function walk(client: Client, path: string): Promise<{ pages: unknown[][]; texts: string[] }> {
  const pages: unknown[][] = []
  const texts: string[] = []
  let next: string | null = path
  while (next) {
    const response = await client.get(next)
    if (response.status !== 200) throw new Error(`${next}: ${response.status} ${response.text}`)
    pages.push(response.body.data)
    texts.push(response.text)
    const link = response.headers.get('link')
    next = link ? /^<([^>]+)>; rel="next"$/.exec(link)![1] : null
    if (pages.length > 200) throw new Error('the cursors did not end')
  }
  return { pages, texts }
}

t.test("a list's pages are the database's order, cut at the page size, whatever the sort", async (t) => {
  const world = await startWorld(t)
  const ann = world.as('ann@acme.test')
  const names = [
    'Deal \u001e one',
    'Deal\u001e',
    '\u001e',
    'line\nbreak',
    'quote " and \\ slash',
    '}, {',
    '},\u001e{',
    'Zeta',
    'zeta',
    'Ünïcode ✓',
  ]
  const amounts = [null, '0.00', '10.00', '10.00', '99.99']
  const dates = [null, '2026-01-01', '2026-01-01', '2026-06-30']
  const stages = ['lead', 'won', 'lost']
  // Rows inserted as the owner, so creation times can tie (the API's would all differ).
  const times = ['2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00.000001Z', '2026-02-01T00:00:00Z']
  for (let i = 0; i < 36; i++) {
    await world.owner(
      `insert into crm.deals (workspace_id, owner_id, created_by, updated_by, name, amount, stage, close_date, created_at, updated_at, custom_fields)
       values ($1, $2, $2, $2, $3, $4, $5, $6, $7, $7, $8)`,
      [
        world.tenant.id,
        ann.member.id,
        names[i % names.length],
        amounts[i % amounts.length],
        stages[i % stages.length],
        dates[i % dates.length],
        times[i % times.length],
        JSON.stringify({ note: names[(i * 7) % names.length] }),
      ],
    )
  }

  const sortArbitrary = fc
    .uniqueArray(fc.constantFrom(...SORTABLE), { minLength: 0, maxLength: 3 })
    .chain((fields) => fc.tuple(...fields.map((field) => fc.boolean().map((descending) => ({ field, descending })))))
  await fc.assert(
    fc.asyncProperty(sortArbitrary, fc.integer({ min: 1, max: 9 }), fc.option(fc.constantFrom(...stages)), async (sort, limit, stage) => {
      const query = new URLSearchParams({ limit: String(limit) })
      if (sort.length > 0) query.set('sort', sort.map((key) => (key.descending ? '-' : '') + key.field).join(','))
      if (stage) query.set('filter[stage]', stage)
      const { pages, texts } = await walk(ann, `/api/deals?${query}`)

      const keys = sort.length > 0 ? sort : [{ field: 'created_at', descending: false }]
      // id breaks ties in the direction of the last key (docs/api.md section 5: id is always the last tie-breaker).
      const order = [...keys, { field: 'id', descending: keys.at(-1)!.descending }]
        .map((key) => `${key.field} ${key.descending ? 'desc' : 'asc'} nulls last`)
        .join(', ')
      const { rows } = await world.owner(
        `select crm.deal_json(t)::text as record from crm.deals t
          where workspace_id = $1 and ($2::text is null or stage = $2) order by ${order}`,
        [world.tenant.id, stage],
      )
      const expected = rows.map((row) => JSON.parse(row.record))
      t.same(pages.flat(), expected, `${query}: the pages hold the database's rows in its order`)
      const sizes = pages.map((page) => page.length)
      const full = sizes.slice(0, -1)
      t.ok(
        full.every((size) => size === limit) && sizes.at(-1)! <= limit && (sizes.length === 1 || sizes.at(-1)! > 0),
        `${query}: every page but the last is full, none is longer, none after the first is empty (${sizes.join(',')})`,
      )
      t.ok(
        texts.every((text) => !text.includes('\u001e')),
        `${query}: no raw U+001E reaches a body`,
      )
    }),
    { numRuns: 40 },
  )

  // A search orders by its score (then id) unless sorted: its pages, walked, are its one page of 200.
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom('deal', 'zeta', 'line break', 'one'),
      sortArbitrary,
      fc.integer({ min: 1, max: 9 }),
      async (q, sort, limit) => {
        const query = new URLSearchParams({ q })
        if (sort.length > 0) query.set('sort', sort.map((key) => (key.descending ? '-' : '') + key.field).join(','))
        const { pages: whole } = await walk(ann, `/api/deals/search?${query}&limit=200`)
        t.equal(whole.length, 1, `${query}: one page of 200 holds every match`)
        t.ok(whole[0].length > 3, `${query}: the search finds several rows (${whole[0].length})`)
        const { pages } = await walk(ann, `/api/deals/search?${query}&limit=${limit}`)
        t.same(pages.flat(), whole[0], `${query}&limit=${limit}: the pages walked are the one page`)
        t.ok(
          pages.slice(0, -1).every((page) => page.length === limit),
          `${query}&limit=${limit}: every page but the last is full`,
        )
      },
    ),
    { numRuns: 25 },
  )
})
