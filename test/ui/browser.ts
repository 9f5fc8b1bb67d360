// Real-browser tests drive Debian's Chromium through playwright-core (no browser download). When
// Chromium or playwright-core is missing, the file is skipped with a plain reason.
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { BrowserContext, Page } from 'playwright-core'
import { hashPassword } from '../../src/auth/passwords.ts'
import { withOwner } from '../helpers/fixtures.ts'

type Test = { teardown: (fn: () => unknown) => void; plan: (count: number, comment?: string) => void }

export const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium'
export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
]

export type Browser = { context: BrowserContext; page: Page; screenshot: (name: string) => Promise<void> }

/** A fresh Chromium profile for this file, or null (and the file is marked skipped). */
export async function openBrowser(t: Test): Promise<Browser | null> {
  if (!existsSync(CHROMIUM)) {
    const reason = `browser tests skipped: no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM_PATH)`
    console.error(reason)
    t.plan(0, reason)
    return null
  }
  let playwright: typeof import('playwright-core')
  try {
    playwright = await import('playwright-core')
  } catch {
    const reason = 'browser tests skipped: playwright-core is not installed (npm install)'
    console.error(reason)
    t.plan(0, reason)
    return null
  }
  const profile = mkdtempSync(join(tmpdir(), 'crm-ui-chromium-'))
  const context = await playwright.chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 1200, height: 860 },
  })
  t.teardown(async () => {
    await context.close()
    rmSync(profile, { recursive: true, force: true })
  })
  context.setDefaultTimeout(15_000)
  const page = context.pages()[0] ?? (await context.newPage())
  const directory = process.env.UI_SCREENSHOT_DIR
  return {
    context,
    page,
    // Screenshots for docs/screenshots: `UI_SCREENSHOT_DIR=docs/screenshots node test/run.ts test/ui`.
    screenshot: async (name) => {
      if (!directory) return
      mkdirSync(directory, { recursive: true })
      await page.screenshot({ path: join(directory, `${name}.png`), fullPage: true })
    },
  }
}

export async function setPassword(databaseUrl: string, email: string, password: string): Promise<void> {
  const hash = await hashPassword(password)
  await withOwner(databaseUrl, (client) => client.query('update crm.users set password_hash = $1 where email = lower($2)', [hash, email]))
}

export async function signIn(page: Page, baseUrl: string, email: string, password: string): Promise<void> {
  await page.goto(`${baseUrl}/sign-in`)
  await page.getByLabel('Email').fill(email)
  await page.getByLabel('Password').fill(password)
  await page.getByRole('button', { name: 'Sign in' }).click()
}

/** Visible form fields without a label (accessibility basics: every input has one). */
export async function unlabelledFields(page: Page): Promise<string[]> {
  return page.evaluate(() =>
    [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
      .filter((element) => !(element as HTMLInputElement).labels?.length && !element.getAttribute('aria-label'))
      .map((element) => element.outerHTML),
  )
}

/**
 * axe-core's violations on the current page (WCAG 2.1 A and AA rules), one line each: rule, impact
 * and the first offending element. Evaluated through the browser's debugging protocol, which the
 * page's Content-Security-Policy does not govern.
 */
export async function axeViolations(page: Page): Promise<string[]> {
  const { readFileSync } = await import('node:fs')
  const { createRequire } = await import('node:module')
  const source = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8')
  await page.evaluate(source)
  return page.evaluate(async () => {
    const axe = (globalThis as unknown as { axe: { run: (context: unknown, options: unknown) => Promise<any> } }).axe
    const results = await axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } })
    return results.violations.map((v: any) => `${v.id} (${v.impact}): ${v.nodes[0]?.html ?? ''}`)
  })
}
