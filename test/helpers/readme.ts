// The README's code blocks as a user copies them, for tests that run what the README says rather
// than a copy of it: the webhook verifier (test/webhooks/verifiers.ts) and the quick start
// (test/foundation/readme-quick-start.test.ts).
import { readFileSync } from 'node:fs'

export const README = new URL('../../README.md', import.meta.url)

/** The fenced blocks of one language (```sh, ```ts), in order; within one `## ` section when named. */
export function readmeBlocks(language: string, section?: string): string[] {
  let text = readFileSync(README, 'utf8')
  if (section !== undefined) {
    const start = text.indexOf(`\n## ${section}\n`)
    if (start < 0) throw new Error(`README.md has no section "## ${section}"`)
    const end = text.indexOf('\n## ', start + 1)
    text = text.slice(start, end < 0 ? undefined : end)
  }
  return text
    .split(`\n\`\`\`${language}\n`)
    .slice(1)
    .map((part) => part.slice(0, part.indexOf('\n```') + 1))
}
