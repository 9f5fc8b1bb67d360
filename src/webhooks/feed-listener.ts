// The events feed's waits (docs/api.md section 8a): one LISTEN connection per process, on the
// channel crm_events that crm.tg_events__notify_feed notifies at the commit of every transaction
// that wrote events, with the workspace as the payload. A waiting client holds no connection, only
// an entry here; a notification wakes the entries of its workspace, which then ask the database.
import pg from 'pg'
import type { Logger } from '../log.ts'

export const FEED_CHANNEL = 'crm_events'

export type FeedListener = {
  /**
   * Connects and listens, once (later calls share it); rejects when the database cannot be
   * reached. A request calls it before its first query, so an event committed after that query's
   * snapshot is always notified to this process.
   */
  ready: () => Promise<void>
  /**
   * How many notifications the process has received: read before a query, passed to `wait`, so a
   * notification that arrived between the query and the wait is not missed.
   */
  epoch: () => number
  /**
   * Resolves 'woken' when the workspace has had a notification after `since` (at once if it
   * already has) or the listening connection was lost (the waiter asks the database again, and
   * `ready` connects anew); 'timeout' at `ms`; 'closed' when `signal` aborts or the listener stops.
   */
  wait: (workspaceId: string, since: number, ms: number, signal?: AbortSignal) => Promise<WaitOutcome>
  /** Entries waiting now (tests and the bench). */
  waiting: () => number
  /** Waits begun since the process started (tests). */
  begun: () => number
  stop: () => Promise<void>
}

export type WaitOutcome = 'woken' | 'timeout' | 'closed'

type Waiter = { wake: (outcome: WaitOutcome) => void }

export function createFeedListener(url: string, logger: Logger): FeedListener {
  let client: pg.Client | null = null
  let connecting: Promise<void> | null = null
  let epoch = 0
  let begun = 0
  let stopped = false
  // The epoch of each workspace's last notification; one number per workspace that had events.
  const notified = new Map<string, number>()
  const waiters = new Map<string, Set<Waiter>>()

  const wakeAll = () => {
    for (const set of waiters.values()) for (const waiter of set) waiter.wake('woken')
  }
  const lost = (reason: string) => {
    if (client === null) return
    logger.warn('the events feed lost its listening connection; waiting clients ask again', { reason })
    const gone = client
    client = null
    connecting = null
    gone.end().catch(() => {})
    // Notifications may have been missed while it was down: everything counts as notified.
    epoch++
    for (const workspace of notified.keys()) notified.set(workspace, epoch)
    wakeAll()
  }

  const connect = async () => {
    const next = new pg.Client({ connectionString: url, application_name: 'crm events feed listener' })
    next.on('notification', (message) => {
      if (message.channel !== FEED_CHANNEL || !message.payload) return
      epoch++
      notified.set(message.payload, epoch)
      const set = waiters.get(message.payload)
      if (set) for (const waiter of set) waiter.wake('woken')
    })
    next.on('error', (error) => lost(error.message))
    next.on('end', () => lost('connection ended'))
    await next.connect()
    await next.query(`listen ${FEED_CHANNEL}`)
    if (stopped) {
      await next.end()
      return
    }
    client = next
  }

  return {
    ready: () => {
      if (client !== null || stopped) return Promise.resolve()
      connecting ??= connect().catch((error: unknown) => {
        connecting = null
        throw error
      })
      return connecting
    },
    epoch: () => epoch,
    wait: (workspaceId, since, ms, signal) => {
      if (stopped || signal?.aborted) return Promise.resolve('closed')
      if ((notified.get(workspaceId) ?? -1) > since || client === null) return Promise.resolve('woken')
      begun++
      return new Promise<WaitOutcome>((resolve) => {
        let set = waiters.get(workspaceId)
        if (!set) waiters.set(workspaceId, (set = new Set()))
        const waiter: Waiter = {
          wake: (outcome) => {
            clearTimeout(timer)
            signal?.removeEventListener('abort', onAbort)
            const entries = waiters.get(workspaceId)
            entries?.delete(waiter)
            if (entries?.size === 0) waiters.delete(workspaceId)
            resolve(outcome)
          },
        }
        const onAbort = () => waiter.wake('closed')
        const timer = setTimeout(() => waiter.wake('timeout'), ms)
        signal?.addEventListener('abort', onAbort, { once: true })
        set.add(waiter)
      })
    },
    begun: () => begun,
    waiting: () => {
      let count = 0
      for (const set of waiters.values()) count += set.size
      return count
    },
    stop: async () => {
      stopped = true
      const current = client
      client = null
      for (const set of waiters.values()) for (const waiter of set) waiter.wake('closed')
      await current?.end().catch(() => {})
    },
  }
}
