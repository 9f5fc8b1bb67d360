// What crm.authenticate answered for a token, kept by the API process so that the token's next
// requests run crm.resume_identity instead (authenticate.ts). Nothing here is trusted on its own:
// every statement that uses an entry proves the token again by its hash and the entry's
// access_version current, and a stale entry is dropped and filled again. So the cache holds no
// expiry and needs no eviction for correctness; it is bounded only for memory.
import type { Caller } from './caller.ts'

export type CachedIdentity = {
  /** The caller as crm.authenticate admitted it, without what belongs to one request. */
  caller: Omit<Caller, 'via' | 'rateLimit' | 'countedIn'>
  /** memberships.access_version when the entry was filled (a bigint, kept as its decimal text). */
  accessVersion: string
}

/** Entries kept at most; past it the oldest filled goes first (a Map iterates in insertion order). */
export const IDENTITY_CACHE_ENTRIES = 10_000

export class IdentityCache {
  #entries = new Map<string, CachedIdentity>()
  #capacity: number

  constructor(capacity = IDENTITY_CACHE_ENTRIES) {
    this.#capacity = capacity
  }

  /** One entry per token, workspace asked for (X-Tenant-Slug, or none) and channel (API or UI). */
  static keyOf(tokenHash: Buffer, slug: string | null, via: string): string {
    return `${tokenHash.toString('base64')} ${slug ?? ''} ${via}`
  }

  get(key: string): CachedIdentity | undefined {
    return this.#entries.get(key)
  }

  set(key: string, identity: CachedIdentity): void {
    this.#entries.delete(key)
    if (this.#entries.size >= this.#capacity) {
      const oldest = this.#entries.keys().next()
      if (!oldest.done) this.#entries.delete(oldest.value)
    }
    this.#entries.set(key, identity)
  }

  delete(key: string): void {
    this.#entries.delete(key)
  }

  get size(): number {
    return this.#entries.size
  }
}
