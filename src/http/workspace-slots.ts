// At most a few uploads and a few exports run at once per workspace (API.md section 9): an export
// holds a connection while it streams and an upload holds up to 50 MiB in memory while it is
// inspected and stored, so one workspace cannot take the pool or the memory from the others.
// Counted in each API process (docs/decisions.md): N processes allow N times the limit.
import { RateLimitedError } from '../errors.ts'

export type WorkspaceWork = 'uploads' | 'exports'

export const WORKSPACE_SLOTS: Record<WorkspaceWork, number> = { uploads: 4, exports: 4 }
const RETRY_AFTER_SECONDS = 10

export type WorkspaceSlots = {
  /** Takes a slot, or throws 429 rate_limited when the workspace has none left; returns its release. */
  take: (work: WorkspaceWork, workspaceId: string) => () => void
  inUse: (work: WorkspaceWork, workspaceId: string) => number
}

export function createWorkspaceSlots(limits: Record<WorkspaceWork, number> = WORKSPACE_SLOTS): WorkspaceSlots {
  const taken = new Map<string, number>()
  const keyOf = (work: WorkspaceWork, workspaceId: string) => `${work}:${workspaceId}`
  return {
    take: (work, workspaceId) => {
      const key = keyOf(work, workspaceId)
      const count = taken.get(key) ?? 0
      if (count >= limits[work]) {
        throw new RateLimitedError(
          RETRY_AFTER_SECONDS,
          'rate_limited',
          `This workspace already has ${limits[work]} ${work} in progress; retry when one has finished`,
        )
      }
      taken.set(key, count + 1)
      let released = false
      return () => {
        if (released) return
        released = true
        const left = (taken.get(key) ?? 1) - 1
        if (left === 0) taken.delete(key)
        else taken.set(key, left)
      }
    },
    inUse: (work, workspaceId) => taken.get(keyOf(work, workspaceId)) ?? 0,
  }
}
