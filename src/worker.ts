// The graphile-worker runner. Tasks live in workers/, one file each, named after the task.
import { EventEmitter } from 'node:events'
import { run, Logger, type Runner, type WorkerEvents } from 'graphile-worker'
import type { Config } from './config.ts'
import type { Logger as AppLogger } from './log.ts'
import { taskList, crontab } from '../workers/index.ts'
import { startWorkerHeartbeat } from './worker-heartbeat.ts'

export type WorkerHandle = { runner: Runner; stop: () => Promise<void> }

export async function startWorker(options: { databaseUrl: string; config: Config; logger: AppLogger }): Promise<WorkerHandle> {
  const { config, logger } = options
  // Kill safety: see src/worker-heartbeat.ts.
  const events = new EventEmitter() as WorkerEvents
  const heartbeat = startWorkerHeartbeat({ events, databaseUrl: options.databaseUrl, logger })
  const runner = await run({
    events,
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
        connectionString: options.databaseUrl,
        concurrentJobs: config.workerConcurrency,
        maxPoolSize: config.workerConcurrency + 2,
        pollInterval: 1000,
        // Measured: a local queue and batched completion take the bare job rate from ~1,300/s to
        // ~11,000/s on two cores (bench/), and LISTEN/NOTIFY still wakes the worker at once.
        localQueue: { size: 100 },
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    },
  })
  return {
    runner,
    stop: async () => {
      await runner.stop()
      await heartbeat.stop()
    },
  }
}
