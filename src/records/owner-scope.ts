// The condition of the record tables' scoped policies (<table>_select_scoped, _update_scoped,
// _delete_scoped, and the export's filter), as one SQL fragment for code that must ask it outside
// a policy: which rows an export reads, and which buttons a page shows. The policies themselves
// still decide every read and write.
import { sql } from '../db/pool.ts'

type Fragment = ReturnType<typeof sql.fragment>

/**
 * Whether the caller's grant of `action` on `resource` covers a record of this owner: the grant is
 * `all`, or the owner is one of those its own/team scope covers. False without a grant. The
 * context reads are scalar subqueries, evaluated once per statement, not once per row.
 */
export function ownerWithinGrant(resource: string, action: string, owner: Fragment): Fragment {
  return sql.fragment`coalesce((select crm.grant_scope(${resource}, ${action})) = 'all'
    or ${owner} = any ((select crm.scope_owner_ids(${resource}, ${action}))::uuid[]), false)`
}
