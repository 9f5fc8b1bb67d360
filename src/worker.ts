// The graphile-worker runner. Tasks live in workers/, one file each, named after the task.
import { EventEmitter } from 'node:events'
import { Logger, type Runner, run, type WorkerEvents } from 'graphile-worker'
import pg from 'pg'
import { crontab, taskList } from '../workers/index.ts'
import type { Config } from './config.ts'
import type { Logger as AppLogger } from './log.ts'
import { startWorkerHeartbeat } from './worker-heartbeat.ts'

export type WorkerHandle = { readonly runner: Runner; stop: () => Promise<void> }

/** After the runner died (its database connection broke), how long to wait before starting it again. */
const RESTART_DELAYS_MS = [500, 1000, 2000, 5000]

/**
 * graphile-worker 0.18's local queue, released while the database is down, can leave the promise
 * that returns its jobs unattached: when returning fails, the rejection is unhandled and Node ends
 * the process (API included, under `crm serve`). Nothing is lost by going on: those jobs stay
 * locked to the dead pool, whose locks are released when the runner restarts (releaseLocks below)
 * or by the heartbeat. Every other unhandled rejection still ends the process, as by default.
 */
const LOCAL_QUEUE_RETURN_FAILED = 'Error occurred whilst returning jobs from local queue to database queue'
let unhandledRejectionGuard: ((reason: unknown) => void) | null = null

export function guardAgainstLocalQueueRejections(logger: AppLogger): void {
  if (unhandledRejectionGuard !== null) return
  unhandledRejectionGuard = (reason: unknown) => {
    if (reason instanceof Error && reason.message.startsWith(LOCAL_QUEUE_RETURN_FAILED)) {
      logger.warn('the stopped worker could not hand its queued jobs back; they are released with its locks', { error: reason.message })
      return
    }
    throw reason
  }
  process.on('unhandledRejection', unhandledRejectionGuard)
}

/**
 * Starts the runner. `databaseUrl` names the worker's login role (crm_worker, src/db/runtime-role.ts),
 * never the owner: graphile-worker's schema is installed and migrated by `migrate` beforehand, so
 * the runner only checks that it is current.
 */
export async function startWorker(options: { databaseUrl: string; config: Config; logger: AppLogger }): Promise<WorkerHandle> {
  const { config, logger } = options
  guardAgainstLocalQueueRejections(logger)
  // Kill safety: see src/worker-heartbeat.ts.
  const events = new EventEmitter() as WorkerEvents
  const heartbeat = startWorkerHeartbeat({ events, databaseUrl: options.databaseUrl, logger })
  // Pools of the current runner: when it dies, their leftover locks are released at once.
  let poolIds = new Set<string>()
  events.on('pool:create', ({ workerPool }) => void poolIds.add(workerPool.id))
  const launch = async () => {
    // The runner gets a pool of ours, whose error listeners stay for the pool's whole life.
    // graphile-worker removes the listeners of a pool it made itself as soon as its runner dies,
    // before that pool has closed its idle connections; a connection broken in that window (the
    // database restarting is what kills a runner) would then be an unhandled 'error' event and
    // take the whole process down.
    const pgPool = new pg.Pool({ connectionString: options.databaseUrl, max: config.workerConcurrency + 2 })
    pgPool.on('error', (error) => logger.warn('worker database connection lost while idle', { error: error.message }))
    pgPool.on('connect', (client) =>
      client.on('error', (error) => logger.warn('worker database connection lost', { error: error.message })),
    )
    let launched: Runner
    try {
      launched = await run({
        events,
        pgPool,
        taskList: taskList(config),
        crontab,
        noHandleSignals: true,
        logger: new Logger((scope) => (level, message) => {
          if (level === 'error') logger.error(message, { worker: scope.label ?? 'worker' })
          else if (level === 'warning') logger.warn(message, { worker: scope.label ?? 'worker' })
          else logger.debug(message, { worker: scope.label ?? 'worker' })
        }),
        preset: {
          worker: {
            concurrentJobs: config.workerConcurrency,
            pollInterval: 1000,
            // Measured: a local queue and batched completion take the bare job rate from ~1,300/s to
            // ~11,000/s on two cores (bench/), and LISTEN/NOTIFY still wakes the worker at once.
            localQueue: { size: 100 },
            completeJobBatchDelay: 0,
            failJobBatchDelay: 0,
          },
        },
      })
    } catch (error) {
      await pgPool.end().catch(() => {})
      throw error
    }
    // The pool outlives its runner only until the runner has settled (stopped or died).
    launched.promise.catch(() => {}).finally(() => pgPool.end().catch(() => {}))
    return launched
  }
  let runner = await launch()
  let stopping = false

  // graphile-worker stops its runner for good when a database connection breaks mid-job (a
  // PostgreSQL restart, a failover): the process would live on without a worker, or `crm worker`
  // would exit. Supervise it: start a new runner once the database answers again.
  const supervise = async () => {
    for (;;) {
      await runner.promise.catch(() => {})
      if (stopping) return
      const deadPools = [...poolIds]
      poolIds = new Set()
      logger.error('the worker stopped unexpectedly (database connection lost?); restarting it when the database answers', {
        pools: deadPools.join(','),
      })
      for (let attempt = 0; ; attempt++) {
        await new Promise((resolve) => setTimeout(resolve, RESTART_DELAYS_MS[Math.min(attempt, RESTART_DELAYS_MS.length - 1)]))
        if (stopping) return
        try {
          runner = await launch()
        } catch (error) {
          logger.warn('worker restart failed; retrying', { error: (error as Error).message })
          continue
        }
        if (stopping) {
          await runner.stop().catch(() => {})
          return
        }
        logger.info('worker restarted')
        // The dead pools run nothing any more, but jobs they held may still be locked to them.
        await releaseLocks(options.databaseUrl, deadPools).catch((error) =>
          logger.warn('could not release the locks of the stopped pools', { error: (error as Error).message }),
        )
        break
      }
    }
  }
  const supervision = supervise()

  return {
    get runner() {
      return runner
    },
    stop: async () => {
      stopping = true
      await runner.stop().catch(() => {})
      await supervision
      await heartbeat.stop()
    },
  }
}

async function releaseLocks(databaseUrl: string, workerIds: string[]): Promise<void> {
  if (workerIds.length === 0) return
  const client = new pg.Client({ connectionString: databaseUrl })
  client.on('error', () => {})
  await client.connect()
  try {
    await client.query('select graphile_worker.force_unlock_workers($1::text[])', [workerIds])
    for (const id of workerIds) await client.query('select crm.worker_stopped($1)', [id])
  } finally {
    await client.end().catch(() => {})
  }
}
