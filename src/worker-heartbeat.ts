// Kill safety for graphile-worker. A pool that dies without shutting down (kill -9, a lost
// machine) leaves its jobs locked for 4 hours. Every pool of this service therefore beats into
// crm.worker_heartbeats every few seconds; each beat (of any live pool, including a restarted
// one) also force-unlocks the jobs of pools that have been silent for longer than STALE_AFTER,
// via graphile_worker.force_unlock_workers. Jobs are then picked up again within about
// STALE_AFTER + BEAT_INTERVAL. Each job must tolerate running twice: deliver_webhook re-reads its
// delivery by id and generation, so at worst a delivery is sent twice (receivers deduplicate).
import { hostname } from 'node:os'
import type { WorkerEvents } from 'graphile-worker'
import pg from 'pg'
import type { Logger } from './log.ts'

export const BEAT_INTERVAL_MS = 5_000
/** Well above any event-loop stall or GC pause, well below graphile-worker's 4 hours. */
export const STALE_AFTER_MS = 30_000

export type WorkerHeartbeat = { stop: () => Promise<void> }

export function startWorkerHeartbeat(options: {
  events: WorkerEvents
  databaseUrl: string
  logger: Logger
  intervalMs?: number
  staleAfterMs?: number
}): WorkerHeartbeat {
  const { events, logger } = options
  const intervalMs = options.intervalMs ?? BEAT_INTERVAL_MS
  const staleAfter = `${Math.round((options.staleAfterMs ?? STALE_AFTER_MS) / 1000)} seconds`
  const pool = new pg.Pool({ connectionString: options.databaseUrl, max: 1, idleTimeoutMillis: 0 })
  pool.on('error', () => {}) // a broken idle connection is replaced on the next beat
  const timers = new Map<string, NodeJS.Timeout>()
  const host = `${hostname()}:${process.pid}`

  const beat = async (workerId: string) => {
    try {
      const { rows } = await pool.query<{ unlocked: string[] }>('select crm.worker_heartbeat($1, $2, $3::interval) as unlocked', [
        workerId,
        host,
        staleAfter,
      ])
      if (rows[0].unlocked.length > 0) logger.warn('unlocked the jobs of stopped workers', { workers: rows[0].unlocked.join(',') })
    } catch (error) {
      logger.warn('worker heartbeat failed', { error: (error as Error).message })
    }
  }

  events.on('pool:create', ({ workerPool }) => {
    void beat(workerPool.id)
    const timer = setInterval(() => void beat(workerPool.id), intervalMs)
    timer.unref()
    timers.set(workerPool.id, timer)
  })
  events.on('pool:release', ({ workerPool }) => {
    clearInterval(timers.get(workerPool.id))
    timers.delete(workerPool.id)
    // Released pools have handed their jobs back already; only the row is left to remove.
    void pool.query('select crm.worker_stopped($1)', [workerPool.id]).catch(() => {})
  })

  return {
    stop: async () => {
      for (const timer of timers.values()) clearInterval(timer)
      for (const workerId of timers.keys()) await pool.query('select crm.worker_stopped($1)', [workerId]).catch(() => {})
      timers.clear()
      await pool.end()
    },
  }
}
