// The list grammar without a database: parsing, checking, and the SQL it turns into.
import t, { type Test } from 'tap'
import { InvalidParameterError } from '../../src/errors.ts'
import { toApiError } from '../../src/http/problem.ts'
import { decodeCursor, encodeCursor } from '../../src/paging.ts'
import { CONTACT, DEAL } from '../../src/records/fields.ts'
import { checkValue, cursorColumns, parseListRequest } from '../../src/records/list-parameters.ts'
import { customFieldCandidates, escapeLike, keysetCondition, listQuery, orderKeys } from '../../src/records/list-query.ts'
import { parseQueryString } from '../../src/records/query-string.ts'
import { phoneDigits, prefixQuery, searchPart } from '../../src/records/search.ts'

function refuses400(t: Test, fn: () => unknown, message?: string) {
  try {
    fn()
    t.fail(`${message ?? 'call'} should throw`)
  } catch (error) {
    t.equal(toApiError(error).status, 400, message ?? '400')
  }
}

function parse(query: string, search = false) {
  return parseListRequest(DEAL, parseQueryString(`/api/deals?${query}`), { search })
}

function invalid(t: Test, query: string, pattern?: RegExp, search = false) {
  try {
    parse(query, search)
    t.fail(`${query} should be refused`)
  } catch (error) {
    t.ok(error instanceof InvalidParameterError, `${query}: an InvalidParameterError`)
    const answer = toApiError(error)
    t.equal(answer.status, 400, `${query}: 400`)
    t.equal(answer.code, 'invalid_parameter', `${query}: invalid_parameter`)
    if (pattern) t.match(answer.message, pattern, `${query}: ${answer.message}`)
  }
}

t.test('query strings are decoded strictly', async (t) => {
  t.same(
    [...parseQueryString('/x?a=1&b=two+words&c=%C3%A9')],
    [
      ['a', '1'],
      ['b', 'two words'],
      ['c', 'é'],
    ],
  )
  t.same([...parseQueryString('/x')], [])
  t.same([...parseQueryString('/x?')], [])
  t.same(
    [...parseQueryString('/x?&&a=&b')],
    [
      ['a', ''],
      ['b', ''],
    ],
  )
  for (const bad of ['a=%ZZ', 'a=%', 'a=%C3', 'a=%FF%FE', 'a=%00', 'a=x%0Ay', 'a=1&a=2', `a=${'x'.repeat(5000)}`, '%E0%A4%A=1']) {
    refuses400(t, () => parseQueryString(`/x?${bad}`), bad.slice(0, 40))
  }
  refuses400(t, () => parseQueryString(`/x?${Array.from({ length: 61 }, (_, i) => `p${i}=1`).join('&')}`))
})

t.test('defaults', async (t) => {
  const request = parse('')
  t.equal(request.limit, 50)
  t.equal(request.sortText, 'created_at,id')
  t.same(request.filters, [])
  t.equal(request.cursor, null)
  t.equal(parse('q=x', true).sortText, 'score', 'search orders by score by default')
})

t.test('limit', async (t) => {
  t.equal(parse('limit=1').limit, 1)
  t.equal(parse('limit=200').limit, 200)
  for (const bad of ['0', '201', '-1', '1.5', 'abc', '1e2', ' 5', '99999999999999999999'])
    invalid(t, `limit=${encodeURIComponent(bad)}`, /limit/)
})

t.test('filters: every operator, checked per kind', async (t) => {
  const request = parse(
    'filter[stage]=won&filter[amount][gte]=1000&filter[amount][lt]=5000.5&filter[name][contains]=ACME&filter[name][starts_with]=glo' +
      '&filter[close_date][lte]=2026-12-31&filter[company_id][is_null]=true&filter[stage][in]=won,lost&filter[currency][ne]=EUR' +
      '&filter[created_at][gt]=2026-01-01T00:00:00Z&filter[custom_fields.tier]=gold&updated_since=2026-11-01',
  )
  t.equal(request.filters.length, 12)
  const byName = (name: string) => request.filters.filter((f) => f.kind === 'field' && f.field.name === name)
  t.same(
    byName('amount').map((f) => (f.kind === 'field' ? [f.op, f.values] : null)),
    [
      ['gte', ['1000']],
      ['lt', ['5000.5']],
    ],
  )
  t.same(
    byName('stage').map((f) => (f.kind === 'field' ? [f.op, f.values] : null)),
    [
      ['eq', ['won']],
      ['in', ['won', 'lost']],
    ],
  )
  t.same(
    byName('updated_at').map((f) => (f.kind === 'field' ? [f.op, f.values] : null)),
    [['gte', ['2026-11-01T00:00:00Z']]],
  )
  t.same(
    request.filters.find((f) => f.kind === 'custom'),
    { kind: 'custom', key: 'tier', value: 'gold' },
  )
  const isNull = byName('company_id')[0]
  t.equal(isNull.kind === 'field' && isNull.isNull, true)
})

t.test('filters: hostile and unknown', async (t) => {
  invalid(t, 'filter[nope]=1', /no filterable field nope/)
  invalid(t, 'filter[custom_fields]=1', /no filterable field/)
  invalid(t, 'filter[amount][like]=1', /unknown operator like/)
  invalid(t, 'filter[amount][contains]=1', /does not support contains/)
  invalid(t, 'filter[id][gt]=1', /does not support gt/)
  invalid(t, 'filter[amount]=1;drop table crm.deals', /decimal/)
  invalid(t, "filter[amount]=1' or '1'='1", /decimal/)
  invalid(t, 'filter[amount]=1e999', /decimal/)
  invalid(t, `filter[amount]=${'9'.repeat(40)}`, /decimal/)
  invalid(t, 'filter[company_id]=not-a-uuid', /UUID/)
  invalid(t, 'filter[close_date]=2026-02-30', /date/)
  invalid(t, 'filter[created_at][gt]=yesterday', /RFC 3339/)
  invalid(t, 'filter[created_at][gt]=2026-01-01T25:00:00Z', /RFC 3339/)
  invalid(t, 'filter[company_id][is_null]=yes', /true or false/)
  invalid(t, 'filter[name][contains]=', /empty/)
  invalid(t, `filter[stage][in]=${Array.from({ length: 101 }, () => 'a').join(',')}`, /at most 100/)
  invalid(t, 'filter[custom_fields.Bad-Key]=1', /custom field keys/)
  invalid(t, 'filter[custom_fields.tier][gt]=1', /equality/)
  invalid(t, 'filter[stage]=a&filter[stage][eq]=b', /more than once/)
  invalid(t, 'filter[updated_at][gte]=2026-01-01&updated_since=2026-01-01', /more than once/)
  invalid(t, 'filter=1', /Unknown query parameter filter/)
  invalid(t, 'filter[a][b][c]=1', /not a filter/)
  invalid(t, 'filter[name)%20or%201%3D1--]=x', /no filterable field/)
  invalid(t, 'filter[name)%20or%201=1--]=x', /not a filter/)
  invalid(t, 'nope=1', /Unknown query parameter nope/)
  invalid(t, 'q=x', /Unknown query parameter q/)
  invalid(t, `filter[name]=${'x'.repeat(1001)}`, /too long/)
})

t.test('values are normalised for their kind', async (t) => {
  t.equal(checkValue('lowercase', 'Ann@Example.COM', 'p'), 'ann@example.com')
  t.equal(checkValue('uuid', '01935F3C-9B00-7D4E-8C1A-1F2E3D4C5B6A', 'p'), '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a')
  t.equal(checkValue('timestamp', '2026-11-22T03:00:21.123Z', 'p'), '2026-11-22T03:00:21.123Z')
  t.equal(checkValue('timestamp', '2026-11-22T03:00', 'p'), '2026-11-22T03:00Z')
  t.equal(checkValue('timestamp', '2026-11-22T03:00:00+02:00', 'p'), '2026-11-22T03:00:00+02:00')
  t.equal(checkValue('integer', '-42', 'p'), '-42')
  refuses400(t, () => checkValue('integer', '3000000000', 'p'))
  refuses400(t, () => checkValue('json', '{}', 'p'))
})

t.test('sort', async (t) => {
  t.equal(parse('sort=name,-amount').sortText, 'name,-amount,-id', 'id follows the direction of the last key')
  t.equal(parse('sort=-amount,name').sortText, '-amount,name,id')
  t.equal(parse('sort=name').sortText, 'name,id')
  t.equal(parse('sort=-id').sortText, '-id')
  invalid(t, 'sort=nope', /cannot be sorted by nope/)
  invalid(t, 'sort=custom_fields', /cannot be sorted/)
  invalid(t, 'sort=name,name', /twice/)
  invalid(t, 'sort=id,name', /last tie-breaker/)
  invalid(t, 'sort=name;drop', /comma-separated/)
  invalid(t, 'sort=--name', /comma-separated/)
  invalid(t, 'sort=a,b,c,d,e', /./)
  invalid(t, 'sort=name,amount,stage,currency,close_date', /at most 4/)
})

t.test('search text', async (t) => {
  t.equal(parse('q=%20Acme%20', true).q, 'Acme')
  invalid(t, 'q=', /empty/, true)
  invalid(t, 'q=%20%20', /empty/, true)
  invalid(t, `q=${'a'.repeat(201)}`, /too long/, true)
  invalid(t, 'limit=5', /q is required/, true)
  t.equal(phoneDigits('+1 (555) 010-0199'), '15550100199')
  t.equal(phoneDigits('12'), null)
  t.equal(phoneDigits('ann 555'), null)
  t.equal(prefixQuery("o'brien & co:*"), 'o:* & brien:* & co:*', 'only letters and digits reach to_tsquery')
  t.equal(prefixQuery('!!!'), null)
})

t.test('cursors round-trip and refuse tampering', async (t) => {
  const request = parse('sort=-amount,name')
  const text = encodeCursor(request.sortText, ['100.00', 'Acme', '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'])
  t.same(parse(`sort=-amount,name&cursor=${text}`).cursor, { values: ['100.00', 'Acme', '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'] })
  t.same(
    parse(`sort=-amount,name&cursor=${encodeCursor(request.sortText, [null, 'Acme', '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'])}`).cursor
      ?.values[0],
    null,
    'null for a nullable key',
  )
  invalid(t, `cursor=${text}`, /another sort/)
  invalid(t, 'cursor=!!!', /cursor is not valid/)
  invalid(t, `cursor=${Buffer.from('not json').toString('base64url')}`, /cursor is not valid/)
  invalid(t, `cursor=${Buffer.from('[1,2]').toString('base64url')}`, /cursor is not valid/)
  for (const values of [
    ['1; drop table x', 'a', '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'],
    ['1', 'a'],
    ['1', 'a', 'nope'],
    ['1', null, '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'],
    [1, 'a', '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'],
  ]) {
    invalid(
      t,
      `sort=-amount,name&cursor=${Buffer.from(JSON.stringify({ s: '-amount,name,id', k: values })).toString('base64url')}`,
      /cursor is not valid/,
    )
  }
  invalid(t, `cursor=${'A'.repeat(3000)}`, /cursor is not valid/)
  invalid(t, `cursor=${'A'.repeat(5000)}`, /cursor is too long/)
  const defaultSort = parse('')
  invalid(
    t,
    `cursor=${encodeCursor(defaultSort.sortText, ['2026-01-01', '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'])}`,
    /cursor is not valid/,
    false,
  )
  t.same(
    decodeCursor(encodeCursor('score', ['3.25', '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a']), 'score', cursorColumns([])).values[0],
    '3.25',
  )
  refuses400(t, () => decodeCursor(encodeCursor('score', ['NaN', '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a']), 'score', cursorColumns([])))
})

t.test('the SQL: identifiers from the whitelist, values as parameters', async (t) => {
  const request = parse(
    `filter[name][contains]=${encodeURIComponent("50%_off' or 1=1")}&filter[stage][in]=won,lost&sort=-amount&cursor=${encodeCursor('-amount,-id', ['10.00', '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'])}`,
  )
  const query = listQuery(DEAL, request)
  t.notMatch(query.sql, /50%|or 1=1|won/, 'no value is spliced into the text')
  t.match(query.sql, /"t"\."name" ilike \$slonik_\d+/)
  t.match(query.sql, /"t"\."stage" = any\(\$slonik_\d+::"?text"?\[\]\)/)
  t.match(query.sql, /order by "t"\."amount" desc nulls last, "t"\."id" desc nulls last/)
  t.match(
    query.sql,
    /limit '51'\) as p/,
    'the page size (a validated integer) is in the text, so the prepared statement can keep a generic plan',
  )
  t.ok(query.values.includes("%50\\%\\_off' or 1=1%"), 'LIKE wildcards are escaped')
  t.equal(escapeLike('a\\b%c_d'), 'a\\\\b\\%c\\_d')
  t.same(customFieldCandidates('42'), ['42', 42])
  t.same(customFieldCandidates('true'), ['true', true])
  t.same(customFieldCandidates('null'), ['null', null])
  t.same(customFieldCandidates('0x10'), ['0x10'])
})

t.test('keyset conditions', async (t) => {
  const id = '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'
  const byDefault = parse('')
  const fast = keysetCondition(orderKeys(byDefault, null), { values: ['1795278421123456', id] })
  t.match(
    fast.sql,
    /\(\("t"\."created_at", "t"\."id"\) > \(\(timestamptz 'epoch' \+ \$slonik_\d+::bigint \* interval '1 microsecond'\), \$slonik_\d+::uuid\)\)/,
    'a row comparison when nothing is nullable',
  )
  const nullable = keysetCondition(orderKeys(parse('sort=-amount'), null), { values: ['10.00', id] })
  t.match(nullable.sql, /"t"\."amount" < \$slonik_\d+::numeric or "t"\."amount" is null/, 'nulls come last')
  const fromNull = keysetCondition(orderKeys(parse('sort=-amount'), null), { values: [null, id] })
  t.match(fromNull.sql, /"t"\."amount" is null and "t"\."id" < \$slonik_\d+::uuid/, 'after a null, only the remaining nulls')
  const searchRequest = parse('q=acme', true)
  const part = searchPart(DEAL, 'acme')
  const bySearch = keysetCondition(orderKeys(searchRequest, part.score), { values: ['2.5', id] })
  t.match(bySearch.sql, /::float8/)
  t.match(searchPart(CONTACT, '555-0199').where.sql, /crm\.contact_search_text/)
})

t.test("a list statement's frame is kept per type, sort and page size; a search's is built each time", async (t) => {
  const stage = listQuery(DEAL, parse('filter[stage]=won&limit=20&sort=-amount'))
  const name = listQuery(DEAL, parse('filter[name][contains]=acme&limit=20&sort=-amount'))
  const [stageBefore, stageAfter] = stage.sql.split(/"t"\."stage"[^)]*?\$slonik_1::text/)
  t.ok(name.sql.startsWith(stageBefore), 'the same text before the conditions')
  t.ok(name.sql.endsWith(stageAfter), 'and after them')
  t.same(stage.values, ['won'])
  t.same(name.values, ['%acme%'])
  t.match(listQuery(DEAL, parse('limit=21&sort=-amount')).sql, /limit '22'/, 'another page size, another frame')
  const contacts = parseListRequest(CONTACT, parseQueryString('/api/contacts?limit=20&sort=first_name'))
  t.match(listQuery(CONTACT, contacts).sql, /"crm"\."contacts"/, 'another type, another frame')
  const first = listQuery(DEAL, parse('q=acme', true), searchPart(DEAL, 'acme'))
  const second = listQuery(DEAL, parse('q=globex', true), searchPart(DEAL, 'globex'))
  t.ok(first.values.includes('acme') || first.values.some((value) => String(value).includes('acme')), "the first search's words")
  t.notOk(
    second.values.some((value) => String(value).includes('acme')),
    "the second search has none of the first's",
  )
})

t.test("a list statement kept from an earlier request carries this request's values", async (t) => {
  const cursor = encodeCursor('-amount,-id', ['10.00', '01935f3c-9b00-7d4e-8c1a-1f2e3d4c5b6a'])
  const first = listQuery(DEAL, parse('filter[stage]=won&limit=33&sort=-amount'))
  const second = listQuery(DEAL, parse('filter[stage]=lost&limit=33&sort=-amount'))
  t.equal(second.sql, first.sql, 'the same text')
  t.same([first.values, second.values], [['won'], ['lost']], 'each its own value')
  const paged = listQuery(DEAL, parse(`filter[stage]=lost&limit=33&sort=-amount&cursor=${cursor}`))
  t.not(paged.sql, first.sql, 'a cursor, another condition text')
  t.same(paged.values.slice(0, 1), ['lost'], 'the filter value first, then the keyset values')
  t.ok(paged.values.includes('10.00'), "the cursor's values")
})
