// The database a benchmark runs against: DATABASE_URL when set, otherwise a throwaway embedded
// PostgreSQL with fsync off (the baseline in the same run uses the same server, so ratios are fair).
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

export async function provision(): Promise<{ url: string; stop: () => Promise<void>; label: string }> {
  if (process.env.DATABASE_URL) return { url: process.env.DATABASE_URL, stop: async () => {}, label: 'DATABASE_URL' }
  const { startEmbeddedPostgres } = await import('../src/db/provision.ts')
  const baseDir = mkdtempSync(join(tmpdir(), 'crm-bench-'))
  const database = await startEmbeddedPostgres({ baseDir, database: 'crm_bench', persistent: false, durability: 'none' })
  return {
    url: database.url,
    label: 'embedded PostgreSQL (fsync off)',
    stop: async () => {
      await database.stop()
      rmSync(baseDir, { recursive: true, force: true })
    },
  }
}

/** Migrates the database and makes a fresh workspace with one admin (and an API token for it). */
export async function benchWorkspace(url: string) {
  const { migrate } = await import('../src/db/migrate.ts')
  await migrate(url)
  const { createTenant } = await import('../test/helpers/fixtures.ts')
  const slug = `bench-${Date.now().toString(36)}`
  const tenant = await createTenant(url, { slug, members: { [`admin@${slug}.test`]: 'admin' } })
  return { tenant, slug, admin: tenant.members[`admin@${slug}.test`] }
}
