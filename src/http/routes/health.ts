// Liveness and readiness for load balancers and orchestrators.
import Type from 'typebox'
import { schemaIsCurrent } from '../../db/migrate.ts'
import { sql } from '../../db/pool.ts'
import { rowType } from '../../db/typed-rows.ts'
import { UnavailableError } from '../../errors.ts'
import { defineRoutes } from '../route.ts'

const NewestMigration = rowType(Type.Object({ number: Type.Union([Type.Integer(), Type.Null()]) }))

export default defineRoutes(
  {
    method: 'GET',
    path: '/healthz',
    summary: 'The process is up (does not touch the database)',
    tag: 'operations',
    auth: 'none',
    response: Type.Object({ status: Type.Literal('ok') }),
    handler: async () => ({ body: { status: 'ok' } }),
  },
  {
    method: 'GET',
    path: '/readyz',
    summary: 'The database answers and every migration is applied',
    tag: 'operations',
    auth: 'none',
    errors: [503],
    response: Type.Object({ status: Type.Literal('ready') }),
    handler: async ({ services }) => {
      let current: boolean
      try {
        current = await schemaIsCurrent(async () => ({
          rows: [await services.pool.one(sql.type(NewestMigration)`select max(number) as number from crm.schema_migrations`)],
        }))
      } catch (error) {
        throw new UnavailableError(error)
      }
      if (!current) throw new UnavailableError(null, 'The database schema is behind this version: run crm migrate')
      return { body: { status: 'ready' } }
    },
  },
)
