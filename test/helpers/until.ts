// Waiting for a condition, never for a fixed time.

/** Polls until `check` answers a truthy value (tests wait for conditions, not for time). */
export async function until<T>(what: string, check: () => Promise<T>, attempts = 600): Promise<NonNullable<T>> {
  let last: unknown
  for (let attempt = 0; attempt < attempts; attempt++) {
    try {
      const value = await check()
      if (value) return value as NonNullable<T>
    } catch (error) {
      last = error
    }
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  throw new Error(`gave up waiting: ${what}${last ? ` (${(last as Error).message})` : ''}`)
}
