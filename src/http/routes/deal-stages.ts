// GET /api/deal-stages: the workspace's pipeline, in order.
import Type from 'typebox'
import { sql } from '../../db/pool.ts'
import { rowType } from '../../db/typed-rows.ts'
import { DealStageSchema } from '../../records/schemas.ts'
import { defineRoutes } from '../route.ts'

const DealStageRow = rowType(DealStageSchema)

export default defineRoutes({
  method: 'GET',
  path: '/api/deal-stages',
  summary: 'The deal stages of the workspace, in pipeline order',
  tag: 'deals',
  auth: 'required',
  scope: 'deals:read',
  response: Type.Object({ data: Type.Array(DealStageSchema) }),
  errors: [401],
  example: {
    response: {
      data: [
        { key: 'lead', label: 'Lead', position: 0, is_closed: false, is_won: false },
        { key: 'won', label: 'Won', position: 4, is_closed: true, is_won: true },
      ],
    },
  },
  handler: async ({ db }) => {
    const stages = await db.any(sql.type(DealStageRow)`
      select key, label, position, is_closed, is_won from crm.deal_stages
       where workspace_id = (select crm.current_workspace_id())
       order by position`)
    return { body: { data: stages } }
  },
})
