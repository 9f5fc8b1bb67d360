// The first half of a batch: its rows staged, typed and checked set-wise in temporary tables,
// each problem a row of pg_temp.import_problems (a row with a problem is not landed). The phases
// run in this order, which is also the order of a row's problems in the job's report.
//
// pg_temp.import_typed is a copy of the target table (LIKE, defaults included, NOT NULL dropped)
// plus what the checks need: the matched record (target_id, target_owner), the row it repeats,
// the file's custom fields and company_name.
import type { FragmentSqlToken } from 'slonik'
import Type from 'typebox'
import { sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { type FieldSpec, requiredOnCreate } from '../records/fields.ts'
import { commaList, execute, ident, type Queryable, readOne, rowIsClean, workspace } from './batch-statements.ts'
import type { BatchMapping } from './import-plan.ts'

const UUID_TEXT = '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
const INTEGER_TEXT = '^[+-]?[0-9]{1,10}$'
const MONEY_TEXT = '^[+-]?[0-9]{1,16}([.][0-9]{1,2})?$'

const TYPE_MESSAGE: Partial<Record<FieldSpec['kind'], string>> = {
  uuid: 'must be a UUID',
  integer: 'must be a whole number',
  numeric: 'must be a decimal number with at most two decimal places, such as 12500.00',
  date: 'must be a date (YYYY-MM-DD)',
}

const cell = (index: number) => sql.fragment`crm.import_cell(r.cells[${index}::int])`

/** Reports, with one statement, every typed row `where` selects. */
function reportRows(db: Queryable, field: string | null, message: FragmentSqlToken, where: FragmentSqlToken) {
  return execute(
    db,
    sql.fragment`insert into import_problems (row, field, message) select t.row, ${field}::text, ${message} from import_typed t where ${where} order by t.row`,
  )
}

const StagedSummary = rowType(Type.Object({ rows: Type.Integer(), last_row: Type.Integer() }))

/** pg_temp.import_stage: the batch's rows of crm.import_rows, each mapped cell read by crm.import_cell (trimmed, empty → null, the export's formula guard taken off). */
export async function stageRows(db: Queryable, batch: BatchMapping, afterRow: number, limit: number) {
  const { fields, custom, companyName } = batch
  const keyedObject =
    custom.length === 0
      ? sql.fragment`'{}'::jsonb`
      : sql.fragment`jsonb_build_object(${commaList(custom.map((mapped) => sql.fragment`${mapped.key}::text, ${cell(mapped.index)}`))})`
  // The whole-object column first, so a custom_fields.<key> column of the same file wins.
  const customObject = batch.customObject
    ? sql.fragment`coalesce(crm.import_json_object(${cell(batch.customObject.index)}), '{}'::jsonb) || ${keyedObject}`
    : keyedObject
  await execute(
    db,
    sql.fragment`
    create temp table import_stage on commit drop as
    select r.row, coalesce(array_length(r.cells, 1), 0) as cell_count, r.repeat_of,
           ${commaList([
             ...fields.map((mapped) => sql.fragment`${cell(mapped.index)} as ${ident(mapped.field.name)}`),
             sql.fragment`${customObject} as custom_new`,
             sql.fragment`${companyName ? cell(companyName.index) : sql.fragment`null::text`} as company_name`,
             sql.fragment`${batch.customObject ? cell(batch.customObject.index) : sql.fragment`null::text`} as custom_object`,
           ])}
      from crm.import_rows r
     where r.workspace_id = ${workspace} and r.import_id = ${batch.plan.importId} and r.row > ${afterRow}
     order by r.row
     limit ${limit}`,
  )
  const summary = await readOne(
    db,
    sql.type(StagedSummary)`select count(*)::int as rows, coalesce(max(row), 0)::int as last_row from import_stage`,
  )
  return { rows: summary.rows, lastRow: summary.last_row }
}

/** The typed value of a staged text value, or null when it does not cast (reported separately). */
function typedValue(field: FieldSpec, value: FragmentSqlToken): FragmentSqlToken {
  switch (field.kind) {
    case 'uuid':
      return sql.fragment`case when ${value} ~ ${UUID_TEXT} then lower(${value})::uuid end`
    case 'integer':
      return sql.fragment`case when ${value} ~ ${INTEGER_TEXT} and ${value}::int8 between -2147483648 and 2147483647 then ${value}::int4 end`
    case 'numeric':
      return sql.fragment`case when ${value} ~ ${MONEY_TEXT} then ${value}::numeric end`
    case 'date':
      return sql.fragment`crm.import_date(${value})`
    case 'lowercase':
      return field.name === 'domain' ? sql.fragment`rtrim(lower(${value}), '.')` : sql.fragment`lower(${value})`
    default:
      if (field.name === 'currency') return sql.fragment`coalesce(upper(${value}), 'USD')`
      if (field.name === 'stage') {
        // A stage is named by its key or its label, in any case.
        return sql.fragment`coalesce(
          (select ds.key from crm.deal_stages ds where ds.workspace_id = ${workspace} and ds.key = lower(${value})),
          (select ds.key from crm.deal_stages ds where ds.workspace_id = ${workspace} and lower(ds.label) = lower(${value}) order by ds.position limit 1))`
      }
      return value
  }
}

/**
 * pg_temp.import_typed filled from the staged rows in one pass: the cast values, the context's
 * workspace and user, and the companies that company_name names.
 */
export async function typeRows(db: Queryable, batch: BatchMapping): Promise<void> {
  const { fields, companyName, keyField } = batch
  await execute(db, sql.fragment`create temp table import_typed (like ${batch.type.table} including defaults) on commit drop`)
  await execute(
    db,
    sql.fragment`
    alter table import_typed
      ${commaList(batch.allColumns.map((name) => sql.fragment`alter column ${ident(name)} drop not null`))},
      add column row integer, add column target_id uuid, add column target_owner uuid, add column repeat_of integer,
      add column custom_new jsonb, add column company_name text, add column unchanged boolean not null default false`,
  )
  await execute(
    db,
    sql.fragment`create temp table import_problems (row integer not null, field text, message text not null, ordinal serial) on commit drop`,
  )
  // Each typed column with its value: the file's cast cells, the importing user as the owner when
  // the file has no owner_id, the company that company_name names when no company_id cell does.
  const assigned = fields.map((mapped) => ({
    column: mapped.field.name,
    value: typedValue(mapped.field, sql.fragment`s.${ident(mapped.field.name)}`),
  }))
  if (companyName) {
    const companyId = assigned.find((pair) => pair.column === 'company_id')
    if (companyId) companyId.value = sql.fragment`coalesce(${companyId.value}, n.id)`
    else assigned.push({ column: 'company_id', value: sql.fragment`n.id` })
  }
  if (!batch.maps('owner_id')) assigned.unshift({ column: 'owner_id', value: sql.fragment`c.user_id` })
  const repeatOf = keyField && batch.maps(keyField) ? sql.fragment`s.repeat_of` : sql.fragment`null::int`
  // Existing companies named by company_name are linked here, in the same pass (an UPDATE
  // afterwards rewrote every row of the batch). = any (array(...)): one probe of
  // companies_name_lower per distinct name; with "in (select ...)" the planner, still reading the
  // statistics of an empty companies table, joined every company with every row (measured: 170 ms
  // a batch of 5,000 rows against 1,000 companies).
  const namedCompanies = companyName
    ? sql.fragment`with named as materialized (
      select distinct on (lower(c.name)) c.id, lower(c.name) as name
        from crm.companies c
       where c.workspace_id = ${workspace}
         and lower(c.name) = any (array(select distinct lower(s.company_name) from import_stage s where s.company_name is not null))
       order by lower(c.name), c.created_at, c.id)`
    : sql.fragment``
  await execute(
    db,
    sql.fragment`
    insert into import_typed (${commaList([sql.fragment`row, repeat_of, custom_new, custom_fields, company_name, workspace_id, created_by, updated_by`, ...assigned.map((pair) => sql.fragment`${ident(pair.column)}`)])})
    ${namedCompanies}
    select ${commaList([sql.fragment`s.row, ${repeatOf}, s.custom_new, '{}'::jsonb || s.custom_new, s.company_name, c.workspace_id, c.user_id, c.user_id`, ...assigned.map((pair) => pair.value)])}
      from import_stage s
     cross join (select (select crm.current_workspace_id()) as workspace_id, (select crm.current_user_id()) as user_id offset 0) c
     ${companyName ? sql.fragment`left join named n on n.name = lower(s.company_name)` : sql.fragment``}`,
  )
  await execute(db, sql.fragment`create index on import_typed (row)`)
}

/** Rules of a row on its own: its number of cells, every value that did not cast, company_name's length. */
export async function checkRowRules(db: Queryable, batch: BatchMapping): Promise<void> {
  const columnCount = batch.plan.columns.length
  await execute(
    db,
    sql.fragment`
    insert into import_problems (row, field, message)
    select s.row, null, format('has %s values but the header has %s columns', s.cell_count, ${columnCount}::int)
      from import_stage s where s.cell_count <> ${columnCount}::int`,
  )
  for (const { field } of batch.fields) {
    const name = ident(field.name)
    const message =
      field.name === 'stage'
        ? sql.fragment`format('stage must be one of the workspace''s stages: %s', (select string_agg(ds.key, ', ' order by ds.position) from crm.deal_stages ds where ds.workspace_id = ${workspace}))`
        : TYPE_MESSAGE[field.kind]
          ? sql.fragment`${`${field.name} ${TYPE_MESSAGE[field.kind]}`}::text`
          : null
    if (!message) continue
    await execute(
      db,
      sql.fragment`
      insert into import_problems (row, field, message)
      select s.row, ${field.name}::text, ${message} from import_stage s join import_typed t on t.row = s.row
       where s.${name} is not null and t.${name} is null`,
    )
  }
  if (batch.customObject) {
    await execute(
      db,
      sql.fragment`
      insert into import_problems (row, field, message)
      select s.row, 'custom_fields', 'custom_fields must be a JSON object, such as {"tier": "gold"}' from import_stage s
       where s.custom_object is not null and crm.import_json_object(s.custom_object) is null`,
    )
  }
  if (batch.companyName) {
    await reportRows(
      db,
      'company_name',
      sql.fragment`'company_name is longer than 255 characters'`,
      sql.fragment`length(t.company_name) > 255`,
    )
  }
}

/**
 * The typed rows whose owner (in column `owner`) the member's scope for `action` does not cover:
 * crm.owners_outside_scope, given the batch's owners, judges them all once per statement. The
 * cast makes "= any" read the subquery's one value as the array, not as a set of rows.
 */
function ownerOutsideScope(batch: BatchMapping, action: 'import' | 'update', owner: 'owner_id' | 'target_owner'): FragmentSqlToken {
  return sql.fragment`t.${ident(owner)} = any ((select crm.owners_outside_scope(${batch.plan.type}, ${action}, array(select distinct o.${ident(owner)} from import_typed o)))::uuid[])`
}

/**
 * The record each row's key matches (upsert) or collides with (create), and what that means: a
 * repeat within the file, a duplicate of an existing record, or a match the user may not update.
 */
export async function matchExistingRecords(db: Queryable, batch: BatchMapping): Promise<void> {
  const { keyField, plan } = batch
  if (!keyField) return
  const key = ident(keyField)
  const label = batch.type.label
  // = any (array(...)): one probe of the key's unique index per key of the batch; a join let the
  // planner, blind to the temp table's size, read the whole target table in every batch.
  await execute(
    db,
    sql.fragment`
    update import_typed t set target_id = r.id, target_owner = r.owner_id
      from (select r.id, r.owner_id, r.${key} as key from ${batch.type.table} r
             where r.workspace_id = ${workspace} and r.${key} = any (array(select t.${key} from import_typed t where t.${key} is not null))) r
     where r.key = t.${key}`,
  )
  // Repeats within the file were marked once for the whole run (crm.mark_import_repeats).
  if (batch.maps(keyField)) {
    await reportRows(
      db,
      keyField,
      sql.fragment`format('duplicate: %s repeats row %s of this file', ${keyField}::text, t.repeat_of)`,
      sql.fragment`t.repeat_of is not null`,
    )
  }
  if (plan.mode === 'create') {
    await reportRows(
      db,
      keyField,
      sql.fragment`format('duplicate: a %s with this %s already exists', ${label}::text, ${keyField}::text)`,
      sql.fragment`t.target_id is not null and t.repeat_of is null`,
    )
  } else {
    await reportRows(
      db,
      null,
      sql.fragment`${`your role may not update this ${label}`}::text`,
      sql.fragment`t.target_id is not null and ${ownerOutsideScope(batch, 'update', 'target_owner')}`,
    )
  }
}

/**
 * The values the file leaves out: a matched row keeps its record's (so the checks judge the row as
 * it will be), an empty cell in a column that cannot be null gets the record's value or, on a new
 * row, the default (stage: the trigger picks the first).
 */
export async function completeRows(db: Queryable, batch: BatchMapping): Promise<void> {
  const { plan, setColumns } = batch
  const matched = sql.fragment`from ${batch.type.table} r where r.workspace_id = ${workspace} and r.id = t.target_id`
  if (plan.mode === 'upsert') {
    const kept = batch.allColumns.filter((name) => !setColumns.includes(name) && name !== 'custom_fields')
    await execute(
      db,
      sql.fragment`
      update import_typed t
         set ${commaList([...kept.map((name) => sql.fragment`${ident(name)} = r.${ident(name)}`), sql.fragment`custom_fields = r.custom_fields || t.custom_new`])}
        ${matched}`,
    )
  }
  const defaulted = ['id', 'owner_id', 'currency', 'stage'].filter((name) => batch.maps(name))
  if (defaulted.length === 0) return
  if (plan.mode === 'upsert') {
    await execute(
      db,
      sql.fragment`
      update import_typed t
         set ${commaList(defaulted.map((name) => sql.fragment`${ident(name)} = coalesce(t.${ident(name)}, r.${ident(name)})`))}
        ${matched}`,
    )
  }
  await execute(
    db,
    sql.fragment`
    update import_typed t set id = coalesce(t.id, crm.uuid_v7()), owner_id = coalesce(t.owner_id, (select crm.current_user_id()))
     where t.target_id is null and (t.id is null or t.owner_id is null)`,
  )
}

/**
 * What a row refers to: its owner (a member, within the import scope for a new record, within the
 * update scope for a matched one given to another owner) and its company_id (a company the user
 * can see).
 */
export async function checkReferencesAndScope(db: Queryable, batch: BatchMapping): Promise<void> {
  await reportRows(
    db,
    'owner_id',
    sql.fragment`'owner_id must be a member of this workspace'`,
    // Asked of a function: a scoped token without workspace:admin sees only its own membership.
    sql.fragment`t.owner_id = any ((select crm.non_member_ids(array(select distinct o.owner_id from import_typed o)))::uuid[])`,
  )
  await reportRows(
    db,
    'owner_id',
    sql.fragment`'your role may not import records for this owner'`,
    sql.fragment`t.target_id is null and ${ownerOutsideScope(batch, 'import', 'owner_id')}`,
  )
  if (batch.maps('owner_id')) {
    await reportRows(
      db,
      'owner_id',
      sql.fragment`'your role may not give this record to that owner'`,
      sql.fragment`t.target_id is not null and ${ownerOutsideScope(batch, 'update', 'owner_id')}`,
    )
  }
  if (batch.maps('company_id')) {
    await reportRows(
      db,
      'company_id',
      sql.fragment`'company_id must be a company you can see'`,
      sql.fragment`t.company_id is not null and not exists (select from crm.companies c where c.workspace_id = ${workspace} and c.id = t.company_id)`,
    )
  }
}

/** Every required text field. */
export async function checkRequired(db: Queryable, batch: BatchMapping): Promise<void> {
  const required = batch.type.fields.filter(requiredOnCreate)
  for (const field of required) {
    await reportRows(db, field.name, sql.fragment`${`${field.name} is required`}::text`, sql.fragment`t.${ident(field.name)} is null`)
  }
}

/** Every CHECK constraint of the target table, each broken one reported with its row (crm.import_check_constraints, one scan). */
export async function checkConstraints(db: Queryable, batch: BatchMapping): Promise<void> {
  await execute(db, sql.fragment`select crm.import_check_constraints(${batch.plan.type})`)
}

const MayCreateCompanies = rowType(Type.Object({ may_create: Type.Boolean() }))

/** A company_name that names no company is created when the user may import companies. */
export async function checkCompanyCreation(db: Queryable, batch: BatchMapping): Promise<void> {
  if (!batch.companyName) return
  const { may_create: mayCreate } = await readOne(
    db,
    sql.type(MayCreateCompanies)`select crm.grant_scope('companies', 'import') is not null as may_create`,
  )
  if (mayCreate) return
  await reportRows(
    db,
    'company_name',
    sql.fragment`format('no company is named %s, and your role may not create companies', t.company_name)`,
    sql.fragment`t.company_name is not null and t.company_id is null and ${rowIsClean}`,
  )
}
