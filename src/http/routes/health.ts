// Liveness and readiness for load balancers and orchestrators.
import Type from 'typebox'
import { schemaIsCurrent } from '../../db/migrate.ts'
import { sql } from '../../db/pool.ts'
import { rowType } from '../../db/typed-rows.ts'
import { UnavailableError } from '../../errors.ts'
import { defineRoutes } from '../route.ts'

const ContextCarrierType = Type.Union([Type.Literal('parameter'), Type.Literal('keyed_proof')], {
  description:
    "how the request context travels (docs/operations.md): parameter (the fast carrier, when the schema's owner may set it) or keyed_proof",
})
const Readiness = rowType(
  Type.Object({ number: Type.Union([Type.Integer(), Type.Null()]), context_carrier: Type.Union([ContextCarrierType, Type.Null()]) }),
)

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
      context_carrier: ContextCarrierType,
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
      let readiness: { number: number | null; context_carrier: 'parameter' | 'keyed_proof' | null }
      try {
        readiness = await services.pool.one(
          sql.type(Readiness)`select (select max(number) from crm.schema_migrations) as number,
                                     (select variant from crm.schema_definitions where name = '02_request_context') as context_carrier`,
        )
      } catch (error) {
        throw new UnavailableError(error)
      }
      if (!schemaIsCurrent(readiness.number) || readiness.context_carrier === null) {
        throw new UnavailableError(null, 'The database schema is behind this version: run crm migrate')
      }
      const replicas = services.readRouting?.report()
      return { body: { status: 'ready', context_carrier: readiness.context_carrier, ...(replicas ? { replicas } : {}) } }
    },
  },
)
