// axe-core in the page under test. The pages' CSP allows scripts from their own origin only, so
// the engine is evaluated through the DevTools protocol (which the CSP does not govern), not injected.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import type { Page } from 'playwright-core'

const AXE_SOURCE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8')

/** The ids and targets of axe's violations on the page as it is now (WCAG 2.x A and AA rules). */
export async function axeViolations(page: Page): Promise<string[]> {
  await page.evaluate(AXE_SOURCE)
  return page.evaluate(async () => {
    const axe = (
      globalThis as unknown as {
        axe: { run: (options: unknown) => Promise<{ violations: { id: string; nodes: { target: unknown[] }[] }[] }> }
      }
    ).axe
    const result = await axe.run({ runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice'] } })
    return result.violations.map((violation) => `${violation.id}: ${violation.nodes.map((node) => JSON.stringify(node.target)).join(' ')}`)
  })
}

/** Whether the page itself scrolls sideways (an element may scroll inside its own box). */
export async function pageScrollsSideways(page: Page): Promise<boolean> {
  return page.evaluate(() => document.documentElement.scrollWidth > document.documentElement.clientWidth)
}
