// One batch of an import, set-wise, in the batch's transaction. The caller has opened the batch
// (crm.begin_import_batch: the importing user's proven context, via = import) and switched to
// crm_api, so every statement here obeys row-level security like an API request would.
//
// 1. stage:   the batch's rows of crm.import_rows, each mapped cell trimmed, empty → null
// 2. type:    pg_temp.import_typed is a copy of the target table (LIKE, defaults included, NOT NULL
//             dropped) filled with the cast values and the company_name links in one pass; cells
//             that do not cast are problems
// 3. check:   matches (upsert), in-file repeats (marked once per run by crm.mark_import_repeats),
//             owners and scopes, company_id and stage lookups, required fields, and every CHECK
//             constraint of the target table read from the catalog (one scan for all of them)
// 4. land:    missing company_name companies created, then one INSERT and one UPDATE
//             statement: the outbox triggers write the events of the whole batch at once
// A dry run does 4 inside a savepoint that it rolls back, so its counts are exactly a real run's.
import { pgQueryText, sql } from '../db/pool.ts'
import { COMPANY, CONTACT, DEAL, requiredOnCreate, type FieldSpec, type RecordType } from '../records/fields.ts'
import { CUSTOM_FIELD_PREFIX, type ImportType } from './suggest-mapping.ts'

type Fragment = ReturnType<typeof sql.fragment>
type Token = { sql: string; values: readonly unknown[] }

/** What the batch needs from a pg client: the worker hands in a graphile-worker/pg client. */
export type Queryable = { query: (text: string, values?: unknown[]) => Promise<{ rows: any[]; rowCount: number | null }> }

export type ImportPlan = {
  importId: string
  type: ImportType
  columns: string[]
  mapping: Record<string, string | null>
  mode: 'create' | 'upsert'
  matchOn: 'email' | 'domain' | 'id'
  dryRun: boolean
}

export type RowProblem = { row: number; column_name: string | null; field: string | null; message: string }
export type BatchCounts = { created: number; updated: number; skipped: number; failed: number; companies_created: number }
export type BatchOutcome = { rows: number; lastRow: number; counts: BatchCounts; errors: RowProblem[] }

const RECORD_TYPES: Record<ImportType, RecordType> = { contacts: CONTACT, companies: COMPANY, deals: DEAL }
const LABEL: Record<ImportType, string> = { contacts: 'contact', companies: 'company', deals: 'deal' }

const UUID_TEXT = '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
const INTEGER_TEXT = '^[+-]?[0-9]{1,10}$'
const MONEY_TEXT = '^[+-]?[0-9]{1,16}([.][0-9]{1,2})?$'

/** Runs a slonik-built statement on the worker's plain pg client. */
function execute(db: Queryable, token: Token) {
  return db.query(pgQueryText(token.sql), token.values as unknown[])
}

async function run(db: Queryable, token: Token): Promise<any[]> {
  return (await execute(db, token)).rows
}

/** The number of rows a statement wrote. */
async function count(db: Queryable, token: Token): Promise<number> {
  return (await execute(db, token)).rowCount ?? 0
}

/** The natural key a row is matched (upsert) or checked for repeats (create) on. */
export function keyFieldOf(plan: Pick<ImportPlan, 'type' | 'mode' | 'matchOn' | 'mapping'>): string | null {
  const mapped = new Set(Object.values(plan.mapping).filter((field): field is string => typeof field === 'string'))
  if (plan.mode === 'upsert') return plan.matchOn
  if (plan.type === 'contacts' && mapped.has('email')) return 'email'
  if (plan.type === 'companies' && mapped.has('domain')) return 'domain'
  return mapped.has('id') ? 'id' : null
}

/**
 * The cell whose value repeated within the file makes a row a duplicate, and how it is compared
 * (crm.import_key): null when the key field is not mapped to a column.
 */
export function repeatKeyOf(plan: Pick<ImportPlan, 'type' | 'mode' | 'matchOn' | 'mapping' | 'columns'>): { kind: string; column: number } | null {
  const keyField = keyFieldOf(plan)
  if (!keyField) return null
  for (const [column, target] of Object.entries(plan.mapping)) {
    const index = plan.columns.indexOf(column) + 1 // PostgreSQL arrays count from 1
    if (target === keyField && index > 0) return { kind: keyField, column: index }
  }
  return null
}

/** The match_on a type accepts: contacts email or id, companies domain or id, deals id. */
export function matchOnAllowed(type: ImportType, matchOn: string): boolean {
  return matchOn === 'id' || (type === 'contacts' && matchOn === 'email') || (type === 'companies' && matchOn === 'domain')
}

type MappedField = { field: FieldSpec; column: string; index: number }

function mappedFields(plan: ImportPlan, type: RecordType) {
  const fields: MappedField[] = []
  const custom: { key: string; column: string; index: number }[] = []
  let companyName: { column: string; index: number } | null = null
  for (const [column, target] of Object.entries(plan.mapping)) {
    if (target === null || target === undefined) continue
    const index = plan.columns.indexOf(column) + 1 // PostgreSQL arrays count from 1
    if (index === 0) continue
    if (target.startsWith(CUSTOM_FIELD_PREFIX)) custom.push({ key: target.slice(CUSTOM_FIELD_PREFIX.length), column, index })
    else if (target === 'company_name') companyName = { column, index }
    else {
      const field = type.byName.get(target)
      if (field) fields.push({ field, column, index })
    }
  }
  return { fields, custom, companyName }
}

const cell = (index: number) => sql.fragment`nullif(btrim(r.cells[${index}::int]), '')`

/** The typed value of a staged text value, or null when it does not cast (reported separately). */
function typedValue(field: FieldSpec, value: Fragment): Fragment {
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
          (select ds.key from crm.deal_stages ds where ds.workspace_id = (select crm.current_workspace_id()) and ds.key = lower(${value})),
          (select ds.key from crm.deal_stages ds where ds.workspace_id = (select crm.current_workspace_id()) and lower(ds.label) = lower(${value}) order by ds.position limit 1))`
      }
      return value
  }
}

const TYPE_MESSAGE: Partial<Record<FieldSpec['kind'], string>> = {
  uuid: 'must be a UUID',
  integer: 'must be a whole number',
  numeric: 'must be a decimal number with at most two decimal places, such as 12500.00',
  date: 'must be a date (YYYY-MM-DD)',
}

/** Lands one batch: the rows after `afterRow`, at most `limit` of them. */
export async function landBatch(db: Queryable, plan: ImportPlan, afterRow: number, limit: number): Promise<BatchOutcome> {
  const type = RECORD_TYPES[plan.type]
  const label = LABEL[plan.type]
  const table = type.table
  const { fields, custom, companyName } = mappedFields(plan, type)
  const keyField = keyFieldOf(plan)
  const fieldOf = (name: string) => fields.find((mapped) => mapped.field.name === name)
  const ident = (name: string) => sql.identifier([name])
  const workspace = sql.fragment`(select crm.current_workspace_id())`

  // 1. stage
  const customObject = custom.length === 0 ? sql.fragment`'{}'::jsonb` : sql.fragment`jsonb_build_object(${sql.join(custom.map((c) => sql.fragment`${c.key}::text, ${cell(c.index)}`), sql.fragment`, `)})`
  await run(db, sql.unsafe`
    create temp table import_stage on commit drop as
    select r.row, coalesce(array_length(r.cells, 1), 0) as cell_count, r.repeat_of,
           ${sql.join([
             ...fields.map((mapped) => sql.fragment`${cell(mapped.index)} as ${ident(mapped.field.name)}`),
             sql.fragment`${customObject} as custom_new`,
             sql.fragment`${companyName ? cell(companyName.index) : sql.fragment`null::text`} as company_name`,
           ], sql.fragment`, `)}
      from crm.import_rows r
     where r.workspace_id = ${workspace} and r.import_id = ${plan.importId} and r.row > ${afterRow}
     order by r.row
     limit ${limit}`)
  const [{ rows: staged, last_row: lastRow }] = await run(db, sql.unsafe`select count(*)::int as rows, coalesce(max(row), 0)::int as last_row from import_stage`)
  const empty: BatchCounts = { created: 0, updated: 0, skipped: 0, failed: 0, companies_created: 0 }
  if (staged === 0) return { rows: 0, lastRow: afterRow, counts: empty, errors: [] }

  // 2. type
  const allColumns = ['workspace_id', ...type.fields.map((field) => field.name)]
  await run(db, sql.unsafe`create temp table import_typed (like ${table} including defaults) on commit drop`)
  await run(db, sql.unsafe`
    alter table import_typed
      ${sql.join(allColumns.map((name) => sql.fragment`alter column ${ident(name)} drop not null`), sql.fragment`, `)},
      add column row integer, add column target_id uuid, add column target_owner uuid, add column repeat_of integer,
      add column custom_new jsonb, add column company_name text, add column unchanged boolean not null default false`)
  await run(db, sql.unsafe`create temp table import_problems (row integer not null, field text, message text not null, ordinal serial) on commit drop`)
  // Existing companies named by company_name are linked here, in the same pass (an UPDATE
  // afterwards rewrote every row of the batch). = any (array(...)): one probe of
  // companies_name_lower per distinct name; with "in (select ...)" the planner, still reading the
  // statistics of an empty companies table, joined every company with every row (measured: 170 ms
  // a batch of 5,000 rows against 1,000 companies). A company_id cell, when mapped, wins.
  const typedColumns = fields.map((mapped) => mapped.field.name)
  const typedValues = fields.map((mapped) => typedValue(mapped.field, sql.fragment`s.${ident(mapped.field.name)}`))
  if (companyName) {
    const index = typedColumns.indexOf('company_id')
    if (index >= 0) typedValues[index] = sql.fragment`coalesce(${typedValues[index]}, n.id)`
    else {
      typedColumns.push('company_id')
      typedValues.push(sql.fragment`n.id`)
    }
  }
  await run(db, sql.unsafe`
    insert into import_typed (row, repeat_of, custom_new, custom_fields, company_name, workspace_id, created_by, updated_by${fieldOf('owner_id') ? sql.fragment`` : sql.fragment`, owner_id`}${typedColumns.length ? sql.fragment`, ${sql.join(typedColumns.map(ident), sql.fragment`, `)}` : sql.fragment``})
    ${companyName ? sql.fragment`with named as materialized (
      select distinct on (lower(c.name)) c.id, lower(c.name) as name
        from crm.companies c
       where c.workspace_id = ${workspace}
         and lower(c.name) = any (array(select distinct lower(s.company_name) from import_stage s where s.company_name is not null))
       order by lower(c.name), c.created_at, c.id)` : sql.fragment``}
    select s.row, ${keyField && fieldOf(keyField) ? sql.fragment`s.repeat_of` : sql.fragment`null::int`}, s.custom_new, '{}'::jsonb || s.custom_new, s.company_name, c.workspace_id, c.user_id, c.user_id${fieldOf('owner_id') ? sql.fragment`` : sql.fragment`, c.user_id`}${typedValues.length ? sql.fragment`, ${sql.join(typedValues, sql.fragment`, `)}` : sql.fragment``}
      from import_stage s
     cross join (select (select crm.current_workspace_id()) as workspace_id, (select crm.current_user_id()) as user_id offset 0) c
     ${companyName ? sql.fragment`left join named n on n.name = lower(s.company_name)` : sql.fragment``}`)
  await run(db, sql.unsafe`create index on import_typed (row)`)

  const problem = (field: string | null, message: Fragment, where: Fragment) =>
    run(db, sql.unsafe`insert into import_problems (row, field, message) select t.row, ${field}::text, ${message} from import_typed t where ${where} order by t.row`)

  // 3. check: the shape of the row, then every value that did not cast
  await run(db, sql.unsafe`
    insert into import_problems (row, field, message)
    select s.row, null, format('has %s values but the header has %s columns', s.cell_count, ${plan.columns.length}::int)
      from import_stage s where s.cell_count <> ${plan.columns.length}::int`)
  for (const mapped of fields) {
    const name = ident(mapped.field.name)
    const message = mapped.field.name === 'stage'
      ? sql.fragment`format('stage must be one of the workspace''s stages: %s', (select string_agg(ds.key, ', ' order by ds.position) from crm.deal_stages ds where ds.workspace_id = ${workspace}))`
      : TYPE_MESSAGE[mapped.field.kind] ? sql.fragment`${`${mapped.field.name} ${TYPE_MESSAGE[mapped.field.kind]}`}::text` : null
    if (!message) continue
    await run(db, sql.unsafe`
      insert into import_problems (row, field, message)
      select s.row, ${mapped.field.name}::text, ${message} from import_stage s join import_typed t on t.row = s.row
       where s.${name} is not null and t.${name} is null`)
  }
  if (companyName) {
    await problem('company_name', sql.fragment`'company_name is longer than 255 characters'`, sql.fragment`length(t.company_name) > 255`)
  }

  // matches and repeats
  if (keyField) {
    const key = ident(keyField)
    // = any (array(...)): one probe of the key's unique index per key of the batch; a join let the
    // planner, blind to the temp table's size, read the whole target table in every batch.
    await run(db, sql.unsafe`
      update import_typed t set target_id = r.id, target_owner = r.owner_id
        from (select r.id, r.owner_id, r.${key} as key from ${table} r
               where r.workspace_id = ${workspace} and r.${key} = any (array(select t.${key} from import_typed t where t.${key} is not null))) r
       where r.key = t.${key}`)
    // Repeats within the file were marked once for the whole run (crm.mark_import_repeats).
    if (fieldOf(keyField)) {
      await problem(keyField, sql.fragment`format('duplicate: %s repeats row %s of this file', ${keyField}::text, t.repeat_of)`, sql.fragment`t.repeat_of is not null`)
    }
    if (plan.mode === 'create') {
      await problem(keyField, sql.fragment`format('duplicate: a %s with this %s already exists', ${label}::text, ${keyField}::text)`, sql.fragment`t.target_id is not null and t.repeat_of is null`)
    } else {
      await problem(null, sql.fragment`format('your role may not update this %s', ${label}::text)`, sql.fragment`t.target_id is not null and not (
        (select crm.grant_scope(${plan.type}, 'update')) = 'all' or t.target_owner = any ((select crm.scope_owner_ids(${plan.type}, 'update'))::uuid[]))`)
    }
  }

  // Matched rows keep what the file does not set: the constraints then judge the row as it will be.
  const setColumns = new Set<string>(fields.map((mapped) => mapped.field.name).filter((name) => name !== 'id'))
  if (custom.length > 0) setColumns.add('custom_fields')
  if (companyName) setColumns.add('company_id')
  const keptColumns = allColumns.filter((name) => !setColumns.has(name) && name !== 'custom_fields')
  if (plan.mode === 'upsert') {
    await run(db, sql.unsafe`
      update import_typed t
         set ${sql.join([...keptColumns.map((name) => sql.fragment`${ident(name)} = r.${ident(name)}`), sql.fragment`custom_fields = r.custom_fields || t.custom_new`], sql.fragment`, `)}
        from ${table} r
       where r.workspace_id = ${workspace} and r.id = t.target_id`)
  }
  // An empty cell in a column that cannot be null but has a default: a new row gets the default
  // (stage: the trigger picks the first), a matched row keeps its value.
  const defaulted = ['id', 'owner_id', 'currency', 'stage'].filter((name) => fieldOf(name))
  if (defaulted.length > 0) {
    if (plan.mode === 'upsert') {
      await run(db, sql.unsafe`
        update import_typed t
           set ${sql.join(defaulted.map((name) => sql.fragment`${ident(name)} = coalesce(t.${ident(name)}, r.${ident(name)})`), sql.fragment`, `)}
          from ${table} r
         where r.workspace_id = ${workspace} and r.id = t.target_id`)
    }
    await run(db, sql.unsafe`
      update import_typed t set id = coalesce(t.id, crm.uuid_v7()), owner_id = coalesce(t.owner_id, (select crm.current_user_id()))
       where t.target_id is null and (t.id is null or t.owner_id is null)`)
  }

  // owners, scopes, links
  await problem('owner_id', sql.fragment`'owner_id must be a member of this workspace'`,
    sql.fragment`t.owner_id is not null and not exists (select from crm.memberships m where m.workspace_id = ${workspace} and m.user_id = t.owner_id)`)
  await problem('owner_id', sql.fragment`'your role may not import records for this owner'`, sql.fragment`t.target_id is null and not (
    (select crm.grant_scope(${plan.type}, 'import')) = 'all' or t.owner_id = any ((select crm.scope_owner_ids(${plan.type}, 'import'))::uuid[]))`)
  if (fieldOf('owner_id')) {
    await problem('owner_id', sql.fragment`'your role may not give this record to that owner'`, sql.fragment`t.target_id is not null and not (
      (select crm.grant_scope(${plan.type}, 'update')) = 'all' or t.owner_id = any ((select crm.scope_owner_ids(${plan.type}, 'update'))::uuid[]))`)
  }
  if (fieldOf('company_id')) {
    await problem('company_id', sql.fragment`'company_id must be a company you can see'`,
      sql.fragment`t.company_id is not null and not exists (select from crm.companies c where c.workspace_id = ${workspace} and c.id = t.company_id)`)
  }
  for (const required of type.fields.filter(requiredOnCreate)) {
    await problem(required.name, sql.fragment`${`${required.name} is required`}::text`, sql.fragment`t.${ident(required.name)} is null`)
  }
  await run(db, sql.unsafe`select crm.import_check_constraints(${plan.type})`)

  const ok = sql.fragment`not exists (select from import_problems p where p.row = t.row)`
  if (companyName) {
    const [{ may_create: mayCreate }] = await run(db, sql.unsafe`select crm.grant_scope('companies', 'import') is not null as may_create`)
    if (!mayCreate) {
      await problem('company_name', sql.fragment`format('no company is named %s, and your role may not create companies', t.company_name)`,
        sql.fragment`t.company_name is not null and t.company_id is null and ${ok}`)
    }
  }

  // 4. land
  await run(db, sql.unsafe`savepoint import_land`)
  let companiesCreated = 0
  if (companyName) {
    const created = await run(db, sql.unsafe`
      with wanted as (
        select distinct on (lower(t.company_name)) t.company_name from import_typed t
         where t.company_name is not null and t.company_id is null and ${ok}
         order by lower(t.company_name), t.row),
      inserted as (
        insert into crm.companies (workspace_id, name, created_by, updated_by)
        select c.workspace_id, w.company_name, c.user_id, c.user_id
          from wanted w, (select (select crm.current_workspace_id()) as workspace_id, (select crm.current_user_id()) as user_id offset 0) c
         order by w.company_name returning id, name)
      update import_typed t set company_id = i.id from inserted i where lower(t.company_name) = lower(i.name) and t.company_id is null
      returning t.row, i.id`)
    companiesCreated = new Set(created.map((row) => row.id)).size
  }

  // A deal without a stage column gets the workspace's first stage here, once per batch: left null,
  // tg_deals__before_write would look it up row by row (an RLS query, with its context helper, a row).
  const firstStage = plan.type === 'deals' && !fieldOf('stage')
  if (firstStage) {
    await run(db, sql.unsafe`
      update import_typed t set stage = (select ds.key from crm.deal_stages ds where ds.workspace_id = ${workspace} order by ds.position limit 1)
       where t.target_id is null`)
  }

  // new rows: one INSERT. A row that collides with a record this user cannot see (RLS hid it from
  // the match above) is a duplicate too. The plain INSERT is tried first, under a savepoint: ON
  // CONFLICT's speculative insertion (probe every unique index, then insert and confirm) cost 10-15 µs
  // a row in isolation. Only when a unique index refuses the plain statement is it rolled back and
  // repeated with ON CONFLICT DO NOTHING, which lands the others and names the colliding rows.
  const insertColumns = ['workspace_id', 'id', 'owner_id', 'custom_fields', 'created_by', 'updated_by', ...[...setColumns].filter((name) => name !== 'owner_id' && name !== 'custom_fields'), ...(firstStage ? ['stage'] : [])]
  const insertInto = sql.fragment`insert into ${table} (${sql.join(insertColumns.map(ident), sql.fragment`, `)})
      select ${sql.join(insertColumns.map((name) => sql.fragment`t.${ident(name)}`), sql.fragment`, `)}
        from import_typed t where t.target_id is null and ${ok}
       order by t.row`
  let conflicts: number[] = []
  let created = 0
  await run(db, sql.unsafe`savepoint import_insert`)
  try {
    created = await count(db, sql.unsafe`${insertInto}`)
    await run(db, sql.unsafe`release savepoint import_insert`)
  } catch (error) {
    if ((error as { code?: string }).code !== '23505') throw error
    await run(db, sql.unsafe`rollback to savepoint import_insert`)
    const inserted = await run(db, sql.unsafe`
      with inserted as (
        ${insertInto}
        on conflict do nothing
        returning id)
      select t.row, (i.id is not null) as landed
        from import_typed t left join inserted i on i.id = t.id
       where t.target_id is null and ${ok}`)
    conflicts = inserted.filter((row) => !row.landed).map((row) => row.row as number)
    created = inserted.length - conflicts.length
  }

  // matched rows: one UPDATE of the rows that change; RLS skips those the user may not update
  let updated = 0
  let skipped = 0
  let refused: number[] = []
  if (plan.mode === 'upsert' && setColumns.size > 0) {
    const set = [...setColumns]
    await run(db, sql.unsafe`
      update import_typed t
         set unchanged = (${sql.join(set.map((name) => sql.fragment`r.${ident(name)}`), sql.fragment`, `)}, null) is not distinct from (${sql.join(set.map((name) => sql.fragment`t.${ident(name)}`), sql.fragment`, `)}, null)
        from ${table} r
       where r.workspace_id = ${workspace} and r.id = t.target_id`)
    const changed = await run(db, sql.unsafe`
      with changed as (
        update ${table} r
           set ${sql.join(set.map((name) => sql.fragment`${ident(name)} = t.${ident(name)}`), sql.fragment`, `)}
          from import_typed t
         where r.workspace_id = ${workspace} and r.id = t.target_id and not t.unchanged and ${ok}
        returning r.id)
      select t.row, t.unchanged, (c.id is not null) as landed
        from import_typed t left join changed c on c.id = t.target_id
       where t.target_id is not null and ${ok}`)
    for (const row of changed) {
      if (row.unchanged) skipped++
      else if (row.landed) updated++
      else refused.push(row.row)
    }
  } else if (plan.mode === 'upsert') {
    const [{ count }] = await run(db, sql.unsafe`select count(*)::int as count from import_typed t where t.target_id is not null and ${ok}`)
    skipped = count
  }

  if (conflicts.length > 0) {
    await run(db, sql.unsafe`
      insert into import_problems (row, field, message)
      select unnest(${sql.array(conflicts, 'int4')}), ${keyField}::text,
             ${`duplicate: ${keyField ? `this ${keyField}` : 'a unique value'} is already taken by a ${label} you cannot see`}::text`)
  }
  if (refused.length > 0) {
    await run(db, sql.unsafe`
      insert into import_problems (row, field, message)
      select unnest(${sql.array(refused, 'int4')}), null::text, ${`your role may not update this ${label}`}::text`)
  }

  const problems = await run(db, sql.unsafe`select row, field, message from import_problems order by row, ordinal`)
  if (plan.dryRun) await run(db, sql.unsafe`rollback to savepoint import_land`)
  else await run(db, sql.unsafe`release savepoint import_land`)

  const columnOfField = new Map<string, string>()
  for (const [column, target] of Object.entries(plan.mapping)) if (typeof target === 'string') columnOfField.set(target, column)
  const errors: RowProblem[] = problems.map((row) => ({ row: row.row, column_name: row.field ? (columnOfField.get(row.field) ?? null) : null, field: row.field, message: row.message }))
  const failed = new Set(errors.map((error) => error.row)).size
  created = Math.max(0, created)
  await run(db, sql.unsafe`drop table import_stage, import_typed, import_problems`)
  return { rows: staged, lastRow, counts: { created, updated, skipped, failed, companies_created: companiesCreated }, errors }
}
