// A record type's shape is written down in more than one place: the field lists of
// src/records/fields.ts (the whitelist, and through it the schemas of src/records/schemas.ts and
// /api/openapi.json), the SQL renderers crm.<type>_json and crm.<type>_jsonb, the column grants
// to crm_api, and the constraint → field map of src/records/constraints.ts. This test reads the
// migrated database and fails, naming the place to fix, when any of them disagrees with the others.
import type pg from 'pg'
import t from 'tap'
import { Compile } from 'typebox/compile'
import { RECORD_CONSTRAINT_FIELDS } from '../../src/records/constraints.ts'
import { COMPANY, RECORD_TYPES, type RecordType } from '../../src/records/fields.ts'
import { SCHEMAS } from '../../src/records/schemas.ts'
import { createTestDatabase, ownerClient } from '../helpers/database.ts'
import { createTenant } from '../helpers/fixtures.ts'

const FIELDS_FILE = 'src/records/fields.ts'
const CONSTRAINTS_FILE = 'src/records/constraints.ts'

/**
 * Columns crm_api may INSERT that the database fills and the client never sends: the tenant, the
 * id and the authors. Imports send them (sql/definitions/50_imports_and_exports.sql grants them for that, and its
 * policies allow only the caller's own values); the API never does. Only id, created_by and
 * updated_by are fields; workspace_id is not part of the JSON at all.
 */
const FILLED_BY_DATABASE = ['workspace_id', 'id', 'created_by', 'updated_by']

const sorted = (names: Iterable<string>) => [...names].sort()
const difference = (left: Iterable<string>, right: Iterable<string>) => {
  const exclude = new Set(right)
  return sorted([...left].filter((name) => !exclude.has(name)))
}

/** The names only one of two places holds, each side labelled (": only in crm.contact_json: x; only in fields.ts: y"), or nothing. */
function mismatch(left: string, leftNames: Iterable<string>, right: string, rightNames: Iterable<string>): string {
  const leftOnly = difference(leftNames, rightNames)
  const rightOnly = difference(rightNames, leftNames)
  const parts = [
    leftOnly.length ? `only in ${left}: ${leftOnly.join(', ')}` : '',
    rightOnly.length ? `only in ${right}: ${rightOnly.join(', ')}` : '',
  ]
  const text = parts.filter(Boolean).join('; ')
  return text ? `: ${text}` : ''
}

/** One row of the type, made as the owner with every nullable field left empty. */
async function insertEmptyRow(db: pg.Client, type: RecordType, workspaceId: string, ownerId: string): Promise<string> {
  const { rows } = await db.query(
    type.name === 'contact'
      ? `insert into crm.contacts (workspace_id, owner_id, first_name) values ($1, $2, 'Ann') returning id`
      : `insert into crm.${type.path} (workspace_id, owner_id, name) values ($1, $2, 'Globex') returning id`,
    [workspaceId, ownerId],
  )
  return rows[0].id
}

/** One row of the type with every field set. */
async function insertFullRow(db: pg.Client, type: RecordType, workspaceId: string, ownerId: string, companyId: string): Promise<string> {
  const insert: Record<RecordType['name'], string> = {
    company: `insert into crm.companies (workspace_id, owner_id, name, domain, website, industry, phone, city, country, employee_count, annual_revenue, description, custom_fields)
              values ($1, $2, 'Initech', 'initech.example', 'https://initech.example', 'Software', '+1 555 010 0199', 'Austin', 'US', 120, 2500000, 'TPS reports', '{"tier": "gold"}')`,
    contact: `insert into crm.contacts (workspace_id, owner_id, first_name, last_name, email, phone, job_title, city, country, company_id, custom_fields)
              values ($1, $2, 'Ann', 'Lee', 'ann@initech.example', '+1 555 010 0100', 'CTO', 'Austin', 'US', $3, '{"vip": true}')`,
    deal: `insert into crm.deals (workspace_id, owner_id, name, amount, currency, stage, close_date, company_id, custom_fields)
           values ($1, $2, 'Initech renewal', 12500, 'EUR', 'proposal', '2026-12-31', $3, '{"source": null}')`,
  }
  const values = type.name === 'company' ? [workspaceId, ownerId] : [workspaceId, ownerId, companyId]
  const { rows } = await db.query(`${insert[type.name]} returning id`, values)
  return rows[0].id
}

type Constraint = { name: string; kind: string; columns: string[] }

/** The unique, check and foreign-key constraints of a table, with unique indexes (the API's duplicates are indexes). */
async function constraintsOf(db: pg.Client, table: string): Promise<Constraint[]> {
  const { rows } = await db.query(
    `select c.conname as name, c.contype::text as kind,
            array(select a.attname::text from unnest(c.conkey) as k join pg_attribute a on a.attrelid = c.conrelid and a.attnum = k) as columns
       from pg_constraint c
      where c.conrelid = $1::regclass and c.contype in ('u', 'c', 'f')
     union all
     select i.relname, 'unique index',
            array(select a.attname::text from unnest(x.indkey::int2[]) as k join pg_attribute a on a.attrelid = x.indrelid and a.attnum = k)
       from pg_index x join pg_class i on i.oid = x.indexrelid
      where x.indrelid = $1::regclass and x.indisunique and not x.indisprimary
        and not exists (select from pg_constraint c where c.conindid = x.indexrelid)
      order by 1`,
    [table],
  )
  return rows
}

t.test("every copy of a record type's shape agrees with its field list", async (t) => {
  const url = await createTestDatabase(t)
  const db = await ownerClient(t, url)
  const tenant = await createTenant(url, { members: { 'admin@shape.test': 'admin' } })
  const admin = tenant.members['admin@shape.test']
  const company = await insertEmptyRow(db, COMPANY, tenant.id, admin.id)

  for (const type of RECORD_TYPES) {
    const table = `crm.${type.path}`
    const fieldNames = type.fields.map((field) => field.name)
    const writable = type.fields.filter((field) => field.writable).map((field) => field.name)

    t.test(`${type.path}: the JSON renderers show exactly the fields`, async (t) => {
      const id = await insertEmptyRow(db, type, tenant.id, admin.id)
      const {
        rows: [rendered],
      } = await db.query(
        `select array(select json_object_keys(crm.${type.name}_json(t))) as json,
                array(select jsonb_object_keys(crm.${type.name}_jsonb(t))) as jsonb
           from ${table} t where t.id = $1`,
        [id],
      )
      const json = `crm.${type.name}_json (sql/)`
      t.same(
        rendered.json,
        fieldNames,
        `${json} and the ${type.path} fields of ${FIELDS_FILE} agree, in order${mismatch(json, rendered.json, FIELDS_FILE, fieldNames)}`,
      )
      // jsonb keeps its keys sorted, so only the set can be compared.
      const jsonb = `crm.${type.name}_jsonb (sql/, the outbox's renderer)`
      t.same(
        sorted(rendered.jsonb),
        sorted(fieldNames),
        `${jsonb} and the ${type.path} fields of ${FIELDS_FILE} agree${mismatch(jsonb, rendered.jsonb, FIELDS_FILE, fieldNames)}`,
      )
    })

    t.test(`${type.path}: the response schema accepts what crm.${type.name}_json renders, empty and full`, async (t) => {
      const validator = Compile(SCHEMAS[type.name].record)
      for (const id of [await insertEmptyRow(db, type, tenant.id, admin.id), await insertFullRow(db, type, tenant.id, admin.id, company)]) {
        const {
          rows: [{ record }],
        } = await db.query(`select crm.${type.name}_json(t) as record from ${table} t where t.id = $1`, [id])
        const problems = validator.Errors(record).map((error) => `${error.instancePath} ${error.message}`)
        t.same(
          problems,
          [],
          `the response schema of ${type.path} (built in src/records/schemas.ts from ${FIELDS_FILE}) accepts ${JSON.stringify(record)}`,
        )
      }
    })

    t.test(`${type.path}: the columns are the fields and crm_api may write exactly the writable ones`, async (t) => {
      const { rows } = await db.query(
        `select a.attname as name,
                has_column_privilege('crm_api', a.attrelid, a.attnum, 'INSERT') as insert,
                has_column_privilege('crm_api', a.attrelid, a.attnum, 'UPDATE') as update
           from pg_attribute a
          where a.attrelid = $1::regclass and a.attnum > 0 and not a.attisdropped`,
        [table],
      )
      const columns = rows.map((row) => row.name as string)
      t.same(
        sorted(columns),
        sorted(['workspace_id', ...fieldNames]),
        `the columns of ${table} are workspace_id and the ${type.path} fields of ${FIELDS_FILE}${mismatch(`the table (sql/)`, columns, FIELDS_FILE, ['workspace_id', ...fieldNames])}`,
      )
      const insertable = rows.filter((row) => row.insert).map((row) => row.name as string)
      const updatable = rows.filter((row) => row.update).map((row) => row.name as string)
      const insertableByClient = difference(insertable, FILLED_BY_DATABASE)
      const insertGrant = `the insert grant to crm_api on ${table} (sql/)`
      t.same(
        insertableByClient,
        sorted(writable),
        `${insertGrant}, less ${FILLED_BY_DATABASE.join(', ')}, is the writable ${type.path} fields of ${FIELDS_FILE}${mismatch(insertGrant, insertableByClient, FIELDS_FILE, writable)}`,
      )
      const updateGrant = `the update grant to crm_api on ${table} (sql/)`
      t.same(
        sorted(updatable),
        sorted(writable),
        `${updateGrant} is the writable ${type.path} fields of ${FIELDS_FILE}${mismatch(updateGrant, updatable, FIELDS_FILE, writable)}`,
      )
      t.same(
        difference(FILLED_BY_DATABASE, insertable),
        [],
        `crm_api may insert ${FILLED_BY_DATABASE.join(', ')} into ${table} (imports send them): FILLED_BY_DATABASE of this test lists only such columns`,
      )
    })

    t.test(`${type.path}: the schemas are built from the fields`, async (t) => {
      const schemas = SCHEMAS[type.name]
      const properties = (schema: unknown) => Object.keys((schema as { properties: Record<string, unknown> }).properties)
      t.same(
        properties(schemas.record),
        fieldNames,
        `the response schema of ${type.path} (src/records/schemas.ts) shows every field in order`,
      )
      t.same(
        sorted(properties(schemas.create)),
        sorted(fieldNames),
        `the create schema of ${type.path} accepts every field (read-only ones are ignored)`,
      )
      t.same(
        sorted(properties(schemas.update)),
        sorted(fieldNames),
        `the update schema of ${type.path} accepts every field (read-only ones are ignored)`,
      )
      const example = `the example ${type.label} of src/records/schemas.ts`
      t.same(
        sorted(Object.keys(schemas.exampleRecord)),
        sorted(fieldNames),
        `${example} shows every field${mismatch(example, Object.keys(schemas.exampleRecord), FIELDS_FILE, fieldNames)}`,
      )
    })

    t.test(`${type.path}: every constraint a client can break points at one of its fields`, async (t) => {
      for (const constraint of await constraintsOf(db, table)) {
        const clientColumns = constraint.columns.filter((column) => writable.includes(column))
        // A constraint on columns the client cannot write (none today) cannot fail on client input.
        if (clientColumns.length === 0) continue
        const pointer = RECORD_CONSTRAINT_FIELDS[constraint.name]
        t.ok(
          pointer,
          `${constraint.name} (${constraint.kind} on ${constraint.columns.join(', ')}) of ${table} has an entry in the map of ${CONSTRAINTS_FILE}`,
        )
        if (!pointer) continue
        const field = pointer.slice(1)
        t.ok(
          pointer.startsWith('/') && constraint.columns.includes(field) && type.byName.has(field),
          `${CONSTRAINTS_FILE} points ${constraint.name} at ${pointer}: a ${type.path} field the constraint covers (${clientColumns.join(', ')})`,
        )
      }
    })
  }

  t.test('every entry of the constraint map names a constraint or unique index of the database', async (t) => {
    const { rows } = await db.query(
      `select conname::text as name from pg_constraint where connamespace = 'crm'::regnamespace
       union select relname::text from pg_class where relkind = 'i' and relnamespace = 'crm'::regnamespace`,
    )
    const existing = new Set(rows.map((row) => row.name as string))
    for (const name of Object.keys(RECORD_CONSTRAINT_FIELDS)) {
      t.ok(existing.has(name), `${name} in the map of ${CONSTRAINTS_FILE} is a constraint or unique index of schema crm (sql/)`)
    }
  })
})
