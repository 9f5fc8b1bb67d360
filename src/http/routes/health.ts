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
    summary:
      'The database answers and every migration is applied; lists the read replicas by position with their state (never their addresses)',
    tag: 'operations',
    auth: 'none',
    errors: [503],
    response: Type.Object({
      status: Type.Literal('ready'),
      replicas: Type.Optional(
        Type.Array(
          Type.Object({
            position: Type.Integer({ description: "the standby's place in READ_REPLICA_URLS, from 1 (its address is in the logs only)" }),
            state: Type.Union(
              ['starting', 'serving', 'lagging', 'down', 'promoted', 'refused'].map((state) => Type.Literal(state)),
              { description: 'refused: the server is not a standby of this primary (another cluster, or a forked timeline); never read' },
            ),
            lag_ms: Type.Union([Type.Integer(), Type.Null()], { description: 'replay lag at the last check' }),
            hot_standby_feedback: Type.Union([Type.Boolean(), Type.Null()], {
              description: 'the standby reported hot_standby_feedback on at the last check (exports go only to such a standby)',
            }),
            reads: Type.Integer({ description: 'reads this process has had answered by the standby' }),
            long_reads: Type.Integer({ description: 'exports this process has had answered by the standby' }),
          }),
          { description: 'READ_REPLICA_URLS: a standby that is not serving leaves its reads to the primary (still ready)' },
        ),
      ),
    }),
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
      const replicas = services.readRouting?.report()
      return { body: { status: 'ready', ...(replicas ? { replicas } : {}) } }
    },
  },
)
