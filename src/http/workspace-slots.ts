// At most a few uploads and a few exports run at once per workspace (docs/api.md section 9): an export
// holds a connection while it streams and an upload holds up to 50 MiB in memory while it is
// inspected and stored, so one workspace cannot take the pool or the memory from the others.
// Counted in each API process (docs/decisions.md): N processes allow N times the limit.
import { RateLimitedError, UnavailableError } from '../errors.ts'

export type WorkspaceWork = 'uploads' | 'exports'

export const WORKSPACE_SLOTS: Record<WorkspaceWork, number> = { uploads: 4, exports: 4 }
const RETRY_AFTER_SECONDS = 10

export type WorkspaceSlots = {
  /** Takes a slot, or throws 429 rate_limited when the workspace has none left; returns its release. */
  take: (work: WorkspaceWork, workspaceId: string) => () => void
  inUse: (work: WorkspaceWork, workspaceId: string) => number
}

export function createWorkspaceSlots(limits: Record<WorkspaceWork, number> = WORKSPACE_SLOTS): WorkspaceSlots {
  const taken = createKeyedCounts()
  const keyOf = (work: WorkspaceWork, workspaceId: string) => `${work}:${workspaceId}`
  return {
    take: (work, workspaceId) => {
      const key = keyOf(work, workspaceId)
      if (taken.count(key) >= limits[work]) {
        throw new RateLimitedError(
          RETRY_AFTER_SECONDS,
          'rate_limited',
          `This workspace already has ${limits[work]} ${work} in progress; retry when one has finished`,
        )
      }
      return taken.take(key)
    },
    inUse: (work, workspaceId) => taken.count(keyOf(work, workspaceId)),
  }
}

/**
 * Counts held per key (a workspace's work, a client address): `take` counts one more and answers
 * its release, which gives it back once however often it is called; a key whose count is back to
 * 0 is forgotten, so the map holds only keys in use. The caller checks its bound before `take`.
 */
export function createKeyedCounts(): { count: (key: string) => number; take: (key: string) => () => void } {
  const counts = new Map<string, number>()
  return {
    count: (key) => counts.get(key) ?? 0,
    take: (key) => {
      counts.set(key, (counts.get(key) ?? 0) + 1)
      let released = false
      return () => {
        if (released) return
        released = true
        const left = (counts.get(key) ?? 1) - 1
        if (left === 0) counts.delete(key)
        else counts.set(key, left)
      }
    },
  }
}

export type StreamSlots = {
  /** Takes one of the process's stream slots, or throws 503 unavailable when none is left; returns its release. */
  take: () => () => void
  inUse: () => number
}

/**
 * Every stream of the process together (exports, errors.csv: a connection held for as long as the
 * client reads), whatever the workspace: the per-workspace slots bound one tenant, this bounds the
 * sum, well under the pool (STREAMS_PER_PROCESS), so slow readers in many workspaces never leave
 * the other requests without a connection. Past it the answer is 503: the service is busy, not
 * the caller over a quota of its own.
 */
export function createStreamSlots(limit: number, what = 'exports and downloads'): StreamSlots {
  let taken = 0
  return {
    take: () => {
      if (taken >= limit) {
        throw new UnavailableError(null, `This server already runs ${limit} ${what} at once; retry shortly`)
      }
      taken++
      let released = false
      return () => {
        if (released) return
        released = true
        taken--
      }
    },
    inUse: () => taken,
  }
}

/** The process's slots that routes doing long work take: per workspace and for streams in all. */
export type RouteSlots = { workspace: WorkspaceSlots; streams: StreamSlots }

export function createRouteSlots(streamsPerProcess: number): RouteSlots {
  return { workspace: createWorkspaceSlots(), streams: createStreamSlots(streamsPerProcess) }
}

/**
 * The slots a route's work takes, whoever runs it (the API's router or a page calling the route's
 * handler): the workspace's own slot first (429: its quota), then the process's stream slot (503).
 * Answers the releases, to call when the work ends. `workspaceSlotTaken`: a file route's router
 * took it before receiving the body.
 */
export function takeRouteSlots(
  slots: RouteSlots,
  route: { limitedPerWorkspace?: WorkspaceWork; streams?: boolean },
  workspaceId: string,
  workspaceSlotTaken = false,
): (() => void)[] {
  const releases: (() => void)[] = []
  try {
    if (route.limitedPerWorkspace && !workspaceSlotTaken) releases.push(slots.workspace.take(route.limitedPerWorkspace, workspaceId))
    if (route.streams) releases.push(slots.streams.take())
    return releases
  } catch (error) {
    for (const release of releases) release()
    throw error
  }
}
