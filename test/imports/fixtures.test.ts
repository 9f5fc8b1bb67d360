// The sample exports in test/fixtures/csv stand for what users upload: each must inspect
// cleanly and get a mapping a user would accept as it is.
import { createReadStream } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { type CsvRecord, inspectCsv, inspectCsvAsync, readCsvRecords } from '../../src/imports/csv-file.ts'
import { suggestMapping, validateMapping } from '../../src/imports/suggest-mapping.ts'
import { FIXTURES, fixture } from './helpers.ts'

async function collect(records: AsyncIterable<CsvRecord>): Promise<CsvRecord[]> {
  const all: CsvRecord[] = []
  for await (const record of records) all.push(record)
  return all
}

t.test('customers-100.csv as contacts', async (t) => {
  const inspection = inspectCsv(fixture('customers-100.csv'))
  t.equal(inspection.delimiter, ',')
  t.equal(inspection.rowCount, 100)
  t.same(inspection.columns, [
    'Index',
    'Customer Id',
    'First Name',
    'Last Name',
    'Company',
    'City',
    'Country',
    'Phone 1',
    'Phone 2',
    'Email',
    'Subscription Date',
    'Website',
  ])
  t.equal(inspection.sampleRows.length, 5)
  t.same(inspection.sampleRows[0], [
    '1',
    'DD37Cf93aecA6Dc',
    'Sheryl',
    'Baxter',
    'Rasmussen Group',
    'East Leonard',
    'Chile',
    '229.077.5154',
    '397.884.0519x718',
    'zunigavanessa@smith.info',
    '2020-08-24',
    'http://www.stephenson.com/',
  ])
  t.equal(inspection.sampleRows[3][4], 'Dominguez, Mcmillan and Donovan', 'a quoted comma stays inside the value')
  t.equal(inspection.sampleRows[3].length, 12)
  t.equal(inspection.sampleRows[4][6], 'Slovakia (Slovak Republic)')

  const mapping = suggestMapping('contacts', inspection.columns, inspection.sampleRows)
  t.same(mapping, {
    Index: null,
    'Customer Id': null,
    'First Name': 'first_name',
    'Last Name': 'last_name',
    Company: 'company_name',
    City: 'city',
    Country: 'country',
    'Phone 1': 'phone',
    'Phone 2': null,
    Email: 'email',
    'Subscription Date': null,
    Website: null,
  })
  t.same(validateMapping('contacts', inspection.columns, mapping), [], 'the suggestion is a valid mapping')
})

t.test('leads-100.csv as contacts', async (t) => {
  const inspection = inspectCsv(fixture('leads-100.csv'))
  t.equal(inspection.rowCount, 100)
  t.same(inspection.columns, [
    'Index',
    'Account Id',
    'Lead Owner',
    'First Name',
    'Last Name',
    'Company',
    'Phone 1',
    'Phone 2',
    'Email 1',
    'Email 2',
    'Website',
    'Source',
    'Deal Stage',
    'Notes',
  ])
  t.equal(inspection.sampleRows[0][5], 'Grimes, Madden and Huff')
  t.equal(inspection.sampleRows[0][13], 'Speak own such.')
  t.same(suggestMapping('contacts', inspection.columns, inspection.sampleRows), {
    Index: null,
    'Account Id': null,
    'Lead Owner': null,
    'First Name': 'first_name',
    'Last Name': 'last_name',
    Company: 'company_name',
    'Phone 1': 'phone',
    'Phone 2': null,
    'Email 1': 'email',
    'Email 2': null,
    Website: null,
    Source: null,
    'Deal Stage': null,
    Notes: null,
  })
})

t.test('leads-100.csv as deals', async (t) => {
  const { columns, sampleRows } = inspectCsv(fixture('leads-100.csv'))
  const mapping = suggestMapping('deals', columns, sampleRows)
  t.equal(mapping['Deal Stage'], 'stage')
  t.equal(mapping.Company, 'company_name')
  t.equal(mapping['First Name'], null)
})

t.test('organizations-100.csv as companies', async (t) => {
  const inspection = inspectCsv(fixture('organizations-100.csv'))
  t.equal(inspection.rowCount, 100)
  t.same(inspection.columns, [
    'Index',
    'Organization Id',
    'Name',
    'Website',
    'Country',
    'Description',
    'Founded',
    'Industry',
    'Number of employees',
  ])
  t.same(inspection.sampleRows[1], [
    '2',
    '6A7EdDEA9FaDC52',
    'Mckinney, Riley and Day',
    'http://www.hall-buchanan.info/',
    'Finland',
    'User-centric system-worthy leverage',
    '2015',
    'Glass / Ceramics / Concrete',
    '4952',
  ])
  const mapping = suggestMapping('companies', inspection.columns, inspection.sampleRows)
  t.same(mapping, {
    Index: null,
    'Organization Id': null,
    Name: 'name',
    Website: 'website',
    Country: 'country',
    Description: 'description',
    Founded: null,
    Industry: 'industry',
    'Number of employees': 'employee_count',
  })
  t.same(validateMapping('companies', inspection.columns, mapping), [])
})

t.test('people-100.csv as contacts', async (t) => {
  const inspection = inspectCsv(fixture('people-100.csv'))
  t.equal(inspection.rowCount, 100)
  t.same(inspection.columns, ['Index', 'User Id', 'First Name', 'Last Name', 'Sex', 'Email', 'Phone', 'Date of birth', 'Job Title'])
  t.same(inspection.sampleRows[4], [
    '5',
    '1bA7A3dc874da3c',
    'Lori',
    'Todd',
    'Male',
    'buchananmanuel@example.net',
    '689-207-3558x7233',
    '1938-12-01',
    'Veterinary surgeon',
  ])
  t.same(suggestMapping('contacts', inspection.columns, inspection.sampleRows), {
    Index: null,
    'User Id': null,
    'First Name': 'first_name',
    'Last Name': 'last_name',
    Sex: null,
    Email: 'email',
    Phone: 'phone',
    'Date of birth': null,
    'Job Title': 'job_title',
  })
})

t.test('streaming a fixture yields the same records as the inspection counted', async (t) => {
  const records = await collect(readCsvRecords(createReadStream(join(FIXTURES, 'people-100.csv'), { highWaterMark: 1024 }), ','))
  t.equal(records.length, 100)
  t.same(
    records.map((record) => record.row),
    Array.from({ length: 100 }, (_, index) => index + 1),
  )
  t.ok(records.every((record) => record.values.length === 9))
  const engineer = records[9]
  t.same(engineer, {
    row: 10,
    values: [
      '10',
      '8e4FB470FE19bF0',
      'Isaiah',
      'Downs',
      'Male',
      'virginiaterrell@example.org',
      '+1-511-372-1544x8206',
      '1964-09-20',
      'Engineer, site',
    ],
  })
})

t.test('every fixture streams 100 records of a constant width', async (t) => {
  for (const name of ['customers-100.csv', 'leads-100.csv', 'organizations-100.csv', 'people-100.csv']) {
    const bytes = fixture(name)
    const { columns } = inspectCsv(bytes)
    const records = await collect(readCsvRecords(bytes, ','))
    t.equal(records.length, 100, name)
    t.same(await inspectCsvAsync(bytes), inspectCsv(bytes), `${name}: both inspections agree`)
    t.ok(
      records.every((record) => record.values.length === columns.length),
      `${name}: no row is split by a quoted comma`,
    )
  }
})
