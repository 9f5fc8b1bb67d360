// One batch of an import, set-wise, in the batch's transaction. The caller has opened the batch
// (crm.begin_import_batch: the importing user's proven context, via = import) and switched to
// crm_api, so every statement here obeys row-level security like an API request would.
//
// The rows are staged, typed and checked in temporary tables (check-batch.ts), then landed: the
// missing company_name companies created, then one INSERT and one UPDATE statement, so that the
// outbox triggers write the events of the whole batch at once. A dry run lands inside a savepoint
// that it rolls back, so its counts are exactly a real run's.
//
// The target table's CHECK constraints are evaluated once per row, by the landing statements
// themselves: a batch is landed without the import's own pass over them, under a savepoint. Only
// when a constraint refuses the batch (23514) is the landing rolled back, the pass run to report
// each broken row with its message, and the clean rows landed again. The caller asks for the pass
// first (checkConstraintsFirst) once a batch of the run has fallen back, so that a file with bad
// rows throughout does not pay for a refused landing in every batch.
import Type from 'typebox'
import { sql } from '../db/pool.ts'
import { rowType } from '../db/typed-rows.ts'
import { commaList, execute, ident, type Queryable, readOne, readRows, rowIsClean, workspace } from './batch-statements.ts'
import {
  checkCompanyCreation,
  checkConstraints,
  checkReferencesAndScope,
  checkRequired,
  checkRowRules,
  completeRows,
  matchExistingRecords,
  stageRows,
  typeRows,
} from './check-batch.ts'
import { type BatchMapping, batchMappingOf, type ImportPlan } from './import-plan.ts'

export type RowProblem = { row: number; column_name: string | null; field: string | null; message: string }
export type BatchCounts = { created: number; updated: number; skipped: number; failed: number; companies_created: number }
/** constraintsBroken: a CHECK constraint refused a row of the batch (its landing was repeated after the import's pass). */
export type BatchOutcome = { rows: number; lastRow: number; counts: BatchCounts; errors: RowProblem[]; constraintsBroken: boolean }

const CHECK_VIOLATION = '23514'

/** Lands one batch: the rows after `afterRow`, at most `limit` of them. */
export async function landBatch(
  db: Queryable,
  plan: ImportPlan,
  afterRow: number,
  limit: number,
  checkConstraintsFirst = false,
): Promise<BatchOutcome> {
  const batch = batchMappingOf(plan)
  const staged = await stageRows(db, batch, afterRow, limit)
  if (staged.rows === 0)
    return {
      rows: 0,
      lastRow: afterRow,
      counts: { created: 0, updated: 0, skipped: 0, failed: 0, companies_created: 0 },
      errors: [],
      constraintsBroken: false,
    }

  await typeRows(db, batch)
  await checkRowRules(db, batch)
  await matchExistingRecords(db, batch)
  await completeRows(db, batch)
  await checkReferencesAndScope(db, batch)
  await checkRequired(db, batch)
  if (checkConstraintsFirst) await checkConstraints(db, batch)

  // What follows is repeated after the constraints' pass when a constraint refuses the landing:
  // the company checks too, since they judge only the rows found clean so far.
  await execute(db, sql.fragment`savepoint import_checked`)
  let constraintsChecked = checkConstraintsFirst
  let landed: Landed
  for (;;) {
    try {
      landed = await landCheckedRows(db, batch)
      break
    } catch (error) {
      if (constraintsChecked || (error as { code?: string }).code !== CHECK_VIOLATION) throw error
      await execute(db, sql.fragment`rollback to savepoint import_checked`)
      await checkConstraints(db, batch)
      constraintsChecked = true
    }
  }
  const { companiesCreated, inserted, updated } = landed
  const errors = await readProblems(db, plan)
  await execute(db, plan.dryRun ? sql.fragment`rollback to savepoint import_land` : sql.fragment`release savepoint import_land`)
  await execute(db, sql.fragment`drop table import_stage, import_typed, import_problems`)

  const counts = {
    created: inserted.created,
    updated: updated.updated,
    skipped: updated.skipped,
    failed: new Set(errors.map((error) => error.row)).size,
    companies_created: companiesCreated,
  }
  return { rows: staged.rows, lastRow: staged.lastRow, counts, errors, constraintsBroken: constraintsChecked && !checkConstraintsFirst }
}

type Landed = {
  companiesCreated: number
  inserted: { created: number; conflicts: number[] }
  updated: { updated: number; skipped: number; refused: number[] }
}

/** The clean rows written (inside savepoint import_land, which the caller releases or, on a dry run, rolls back). */
async function landCheckedRows(db: Queryable, batch: BatchMapping): Promise<Landed> {
  await checkCompanyCreation(db, batch)
  await execute(db, sql.fragment`savepoint import_land`)
  const companiesCreated = await createNamedCompanies(db, batch)
  const firstStage = await setFirstStage(db, batch)
  const inserted = await insertNewRecords(db, batch, firstStage)
  const updated = await updateMatchedRecords(db, batch)
  await reportRefusedWrites(db, batch, inserted.conflicts, updated.refused)
  return { companiesCreated, inserted, updated }
}

const CreatedCompany = rowType(Type.Object({ row: Type.Integer(), id: Type.String() }))

/** The companies named by company_name that do not exist yet, one per name; answers how many. */
async function createNamedCompanies(db: Queryable, batch: BatchMapping): Promise<number> {
  if (!batch.companyName) return 0
  const linked = await readRows(
    db,
    sql.type(CreatedCompany)`
    with wanted as (
      select distinct on (lower(t.company_name)) t.company_name from import_typed t
       where t.company_name is not null and t.company_id is null and ${rowIsClean}
       order by lower(t.company_name), t.row),
    inserted as (
      insert into crm.companies (workspace_id, name, created_by, updated_by)
      select c.workspace_id, w.company_name, c.user_id, c.user_id
        from wanted w, (select (select crm.current_workspace_id()) as workspace_id, (select crm.current_user_id()) as user_id offset 0) c
       order by w.company_name returning id, name)
    update import_typed t set company_id = i.id from inserted i where lower(t.company_name) = lower(i.name) and t.company_id is null
    returning t.row, i.id`,
  )
  return new Set(linked.map((row) => row.id)).size
}

/**
 * A deal without a stage column gets the workspace's first stage here, once per batch: left null,
 * tg_deals__before_write would look it up row by row (an RLS query, with its context helper, a
 * row). Answers whether the INSERT carries the stage.
 */
async function setFirstStage(db: Queryable, batch: BatchMapping): Promise<boolean> {
  if (batch.plan.type !== 'deals' || batch.maps('stage')) return false
  await execute(
    db,
    sql.fragment`
    update import_typed t set stage = (select ds.key from crm.deal_stages ds where ds.workspace_id = ${workspace} order by ds.position limit 1)
     where t.target_id is null`,
  )
  return true
}

const InsertedRow = rowType(Type.Object({ row: Type.Integer(), landed: Type.Boolean() }))

/**
 * The new rows, in one INSERT. A row that collides with a record this user cannot see (RLS hid it
 * from the match) is a duplicate too. The plain INSERT is tried first, under a savepoint: ON
 * CONFLICT's speculative insertion (probe every unique index, then insert and confirm) cost 10-15 µs
 * a row in isolation. Only when a unique index refuses the plain statement is it rolled back and
 * repeated with ON CONFLICT DO NOTHING, which lands the others and names the colliding rows.
 */
async function insertNewRecords(db: Queryable, batch: BatchMapping, withStage: boolean): Promise<{ created: number; conflicts: number[] }> {
  const fromFile = batch.setColumns.filter((name) => name !== 'owner_id' && name !== 'custom_fields')
  const columns = [
    'workspace_id',
    'id',
    'owner_id',
    'custom_fields',
    'created_by',
    'updated_by',
    ...fromFile,
    ...(withStage ? ['stage'] : []),
  ]
  const insertInto = sql.fragment`insert into ${batch.type.table} (${commaList(columns.map((name) => sql.fragment`${ident(name)}`))})
      select ${commaList(columns.map((name) => sql.fragment`t.${ident(name)}`))}
        from import_typed t where t.target_id is null and ${rowIsClean}
       order by t.row`
  await execute(db, sql.fragment`savepoint import_insert`)
  try {
    const created = await execute(db, insertInto)
    await execute(db, sql.fragment`release savepoint import_insert`)
    return { created, conflicts: [] }
  } catch (error) {
    if ((error as { code?: string }).code !== '23505') throw error
    await execute(db, sql.fragment`rollback to savepoint import_insert`)
  }
  const rows = await readRows(
    db,
    sql.type(InsertedRow)`
    with inserted as (
      ${insertInto}
      on conflict do nothing
      returning id)
    select t.row, (i.id is not null) as landed
      from import_typed t left join inserted i on i.id = t.id
     where t.target_id is null and ${rowIsClean}`,
  )
  const conflicts = rows.filter((row) => !row.landed).map((row) => row.row)
  return { created: rows.length - conflicts.length, conflicts }
}

const MatchedRow = rowType(Type.Object({ row: Type.Integer(), unchanged: Type.Boolean(), landed: Type.Boolean() }))
const MatchedCount = rowType(Type.Object({ count: Type.Integer() }))

/**
 * The matched rows (upsert), in one UPDATE of those that change. A row the file leaves as it is
 * is skipped; RLS skips those the user may not update, and they are refused.
 */
async function updateMatchedRecords(db: Queryable, batch: BatchMapping): Promise<{ updated: number; skipped: number; refused: number[] }> {
  if (batch.plan.mode !== 'upsert') return { updated: 0, skipped: 0, refused: [] }
  const set = batch.setColumns
  if (set.length === 0) {
    const { count } = await readOne(
      db,
      sql.type(MatchedCount)`select count(*)::int as count from import_typed t where t.target_id is not null and ${rowIsClean}`,
    )
    return { updated: 0, skipped: count, refused: [] }
  }
  await execute(
    db,
    sql.fragment`
    update import_typed t
       set unchanged = (${commaList(set.map((name) => sql.fragment`r.${ident(name)}`))}, null) is not distinct from (${commaList(set.map((name) => sql.fragment`t.${ident(name)}`))}, null)
      from ${batch.type.table} r
     where r.workspace_id = ${workspace} and r.id = t.target_id`,
  )
  const rows = await readRows(
    db,
    sql.type(MatchedRow)`
    with changed as (
      update ${batch.type.table} r
         set ${commaList(set.map((name) => sql.fragment`${ident(name)} = t.${ident(name)}`))}
        from import_typed t
       where r.workspace_id = ${workspace} and r.id = t.target_id and not t.unchanged and ${rowIsClean}
      returning r.id)
    select t.row, t.unchanged, (c.id is not null) as landed
      from import_typed t left join changed c on c.id = t.target_id
     where t.target_id is not null and ${rowIsClean}`,
  )
  return {
    updated: rows.filter((row) => !row.unchanged && row.landed).length,
    skipped: rows.filter((row) => row.unchanged).length,
    refused: rows.filter((row) => !row.unchanged && !row.landed).map((row) => row.row),
  }
}

/** The rows the database itself refused: a key taken by an invisible record, an update RLS skipped. */
async function reportRefusedWrites(db: Queryable, batch: BatchMapping, conflicts: number[], refused: number[]): Promise<void> {
  const { keyField } = batch
  const label = batch.type.label
  if (conflicts.length > 0) {
    await execute(
      db,
      sql.fragment`
      insert into import_problems (row, field, message)
      select unnest(${sql.array(conflicts, 'int4')}), ${keyField}::text,
             ${`duplicate: ${keyField ? `this ${keyField}` : 'a unique value'} is already taken by a ${label} you cannot see`}::text`,
    )
  }
  if (refused.length > 0) {
    await execute(
      db,
      sql.fragment`
      insert into import_problems (row, field, message)
      select unnest(${sql.array(refused, 'int4')}), null::text, ${`your role may not update this ${label}`}::text`,
    )
  }
}

const Problem = rowType(Type.Object({ row: Type.Integer(), field: Type.Union([Type.String(), Type.Null()]), message: Type.String() }))

/** The batch's problems in the job's report order: by row, then in the order they were found. */
async function readProblems(db: Queryable, plan: ImportPlan): Promise<RowProblem[]> {
  const problems = await readRows(db, sql.type(Problem)`select row, field, message from import_problems order by row, ordinal`)
  const columnOfField = new Map<string, string>()
  for (const [column, target] of Object.entries(plan.mapping)) if (typeof target === 'string') columnOfField.set(target, column)
  return problems.map(({ row, field, message }) => ({
    row,
    column_name: field ? (columnOfField.get(field) ?? null) : null,
    field,
    message,
  }))
}
