import fc from 'fast-check'
import t from 'tap'
import { MAX_HEADER_CELL_LENGTH } from '../../src/imports/csv-file.ts'
import { IMPORTABLE_FIELDS, normaliseHeader, suggestMapping, validateMapping } from '../../src/imports/suggest-mapping.ts'

const OUR_UUID = '0190f5b2-7c1e-7a3b-9d4e-2f6a8b0c1d2e'

t.test('normaliseHeader', async (t) => {
  t.equal(normaliseHeader('E-mail'), 'email')
  t.equal(normaliseHeader('Email 1'), 'email')
  t.equal(normaliseHeader('email_2'), 'email')
  t.equal(normaliseHeader(' First  Name '), 'firstname')
  t.equal(normaliseHeader('Country/Region'), 'countryregion')
  t.equal(normaliseHeader('Téléphone'), 'telephone')
  t.equal(normaliseHeader('2020'), '')
})

t.test('normaliseHeader strips trailing digits as /\\d+$/ did, without a pattern that backtracks', async (t) => {
  // The reference is the quadratic pattern, safe on these short strings.
  const reference = (header: string) =>
    header
      .normalize('NFKD')
      .replace(/\p{M}/gu, '')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}]/gu, '')
      .replace(/\d+$/, '')
  const headerText = fc.stringMatching(/^[a-zA-Z0-9 _\-éü١٢½]{0,30}$/)
  fc.assert(fc.property(fc.oneof(headerText, fc.string({ maxLength: 30 })), (header) => normaliseHeader(header) === reference(header)))
  // The worst cell the header allows: a run of digits that does not end the name (the time it
  // takes is in bench/request-data.ts; the cap on longer cells is in test/imports/csv-file.test.ts).
  const worst = `a${'7'.repeat(MAX_HEADER_CELL_LENGTH - 2)}x`
  t.equal(normaliseHeader(worst), worst)
  t.equal(normaliseHeader(`a${'7'.repeat(MAX_HEADER_CELL_LENGTH - 1)}`), 'a')
})

t.test('contacts', async (t) => {
  t.same(
    suggestMapping('contacts', [
      'E-mail',
      'Phone Number',
      'Title',
      'Company Name',
      'Organization',
      'Website',
      'first_name',
      'Surname',
      'Mobile',
    ]),
    {
      'E-mail': 'email',
      'Phone Number': 'phone',
      Title: 'job_title',
      'Company Name': 'company_name',
      Organization: null,
      Website: null,
      first_name: 'first_name',
      Surname: 'last_name',
      Mobile: null,
    },
  )
})

t.test('companies', async (t) => {
  t.same(
    suggestMapping('companies', [
      'Company name',
      'Company Domain Name',
      'Website URL',
      'Number of Employees',
      'Annual Revenue',
      'Phone Number',
      'City',
      'Country/Region',
      'About',
      'Company',
    ]),
    {
      'Company name': 'name',
      'Company Domain Name': 'domain',
      'Website URL': 'website',
      'Number of Employees': 'employee_count',
      'Annual Revenue': 'annual_revenue',
      'Phone Number': 'phone',
      City: 'city',
      'Country/Region': 'country',
      About: 'description',
      Company: null,
    },
  )
  t.equal(suggestMapping('companies', ['Employees']).Employees, 'employee_count')
  t.equal(suggestMapping('companies', ['Organization']).Organization, 'name')
})

t.test('deals', async (t) => {
  t.same(suggestMapping('deals', ['Deal Name', 'Value', 'Currency', 'Stage', 'Close Date', 'Company', 'Amount', 'Pipeline']), {
    'Deal Name': 'name',
    Value: 'amount',
    Currency: 'currency',
    Stage: 'stage',
    'Close Date': 'close_date',
    Company: 'company_name',
    Amount: null,
    Pipeline: null,
  })
})

t.test('id fields are suggested only for our own UUIDs', async (t) => {
  const columns = ['ID', 'Company ID', 'owner_id', 'Name']
  t.same(suggestMapping('deals', columns), { ID: null, 'Company ID': null, owner_id: null, Name: 'name' }, 'no samples, no id suggestion')

  const foreign = [['DD37Cf93aecA6Dc', '5Cef8BFA16c5e3c', '42', 'Deal']]
  t.same(suggestMapping('deals', columns, foreign), { ID: null, 'Company ID': null, owner_id: null, Name: 'name' }, 'ids from another tool')

  const ours = [
    [OUR_UUID, OUR_UUID.toUpperCase(), '', 'Deal'],
    [OUR_UUID, '', '', 'Other'],
  ]
  t.same(
    suggestMapping('deals', columns, ours),
    { ID: 'id', 'Company ID': 'company_id', owner_id: null, Name: 'name' },
    'an all-empty column proves nothing',
  )
  t.equal(suggestMapping('companies', columns, ours)['Company ID'], null, 'companies have no company_id')
  t.equal(suggestMapping('contacts', ['Record ID'], [[OUR_UUID]])['Record ID'], 'id')
  t.equal(suggestMapping('contacts', ['Customer Id'], [[OUR_UUID]])['Customer Id'], null, 'another kind of id')
  t.equal(suggestMapping('contacts', ['ID'], [[]]).ID, null, 'a short row')
})

t.test('every suggested field is importable for its type', async (t) => {
  const headers = [
    'First Name',
    'Last Name',
    'Email',
    'Phone',
    'Job Title',
    'City',
    'Country',
    'Company',
    'Name',
    'Domain',
    'Website',
    'Industry',
    'Employees',
    'Revenue',
    'Description',
    'Deal Name',
    'Amount',
    'Currency',
    'Stage',
    'Close Date',
  ]
  for (const type of ['contacts', 'companies', 'deals'] as const) {
    const suggested = Object.values(suggestMapping(type, headers)).filter((field) => field !== null)
    t.ok(
      suggested.every((field) => IMPORTABLE_FIELDS[type].includes(field!)),
      type,
    )
    t.equal(new Set(suggested).size, suggested.length, `${type}: no field twice`)
  }
})

t.test('validateMapping accepts a good mapping', async (t) => {
  const columns = ['First Name', 'Email', 'Company', 'Shoe size', 'Notes']
  t.same(
    validateMapping('contacts', columns, {
      'First Name': 'first_name',
      Email: 'email',
      Company: 'company_name',
      'Shoe size': 'custom_fields.shoe_size',
      Notes: null,
    }),
    [],
  )
  t.same(validateMapping('contacts', columns, { Email: 'email' }), [], 'columns left out are not imported')
})

t.test('validateMapping problems', async (t) => {
  const columns = ['Name', 'Email', 'Email 2', 'Country/Region', 'Size', 'Other', 'a~b']
  const problems = validateMapping('companies', columns, {
    Name: 'name',
    Email: 'email',
    'Email 2': 'name',
    'Country/Region': 'custom_fields.Region',
    Size: 'custom_fields.size',
    Other: 'custom_fields.size',
    'a~b': 42,
    Missing: 'city',
  })
  t.same(
    problems.map((problem) => [problem.pointer, problem.code]),
    [
      ['/mapping/Email', 'unknown_field'],
      ['/mapping/Email 2', 'duplicate_field'],
      ['/mapping/Country~1Region', 'invalid_custom_field_key'],
      ['/mapping/Other', 'duplicate_field'],
      ['/mapping/a~0b', 'invalid_type'],
      ['/mapping/Missing', 'unknown_column'],
    ],
  )
  t.match(problems[0].message, /companies have no field "email"/)
  t.match(problems[1].message, /already mapped from column "Name"/)
  t.match(problems[3].message, /from column "Size"/)
  t.ok(problems.every((problem) => problem.message.length > 0))
})

t.test('validateMapping: company_name is a pseudo-field of contacts and deals only', async (t) => {
  t.same(validateMapping('deals', ['Company'], { Company: 'company_name' }), [])
  t.equal(validateMapping('companies', ['Company'], { Company: 'company_name' })[0].code, 'unknown_field')
})

t.test('validateMapping: custom field keys', async (t) => {
  const codeFor = (target: string) => validateMapping('deals', ['x'], { x: target })[0]?.code
  t.equal(codeFor(`custom_fields.${'a'.repeat(63)}`), undefined, '63 characters')
  t.equal(codeFor(`custom_fields.${'a'.repeat(64)}`), 'invalid_custom_field_key', '64 characters')
  t.equal(codeFor('custom_fields.'), 'invalid_custom_field_key')
  t.equal(codeFor('custom_fields.1st'), 'invalid_custom_field_key')
  t.equal(codeFor('custom_fields.with-dash'), 'invalid_custom_field_key')
})

t.test('validateMapping: a mapping that imports nothing', async (t) => {
  t.same(validateMapping('contacts', ['Email'], { Email: null }), [
    { pointer: '/mapping', code: 'no_fields_mapped', message: 'Map at least one column to a field' },
  ])
  t.same(
    validateMapping('contacts', ['Email'], {}).map((problem) => problem.code),
    ['no_fields_mapped'],
  )
})
