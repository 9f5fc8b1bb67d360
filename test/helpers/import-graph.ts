// The import graph of src/: which file imports which, the layer each file belongs to, the imports that
// run back up a layer and the import circles. `make check` runs it (`node test/helpers/import-graph.ts`)
// and fails past the bounds below; test/foundation/import-graph.test.ts proves it finds both kinds.
//
// Layers, lowest first: a file may import its own layer and the ones below it.
//   0 base     src/config.ts, src/errors.ts, src/log.ts, src/uuid.ts, src/cidr.ts
//   1 db       src/db/
//   2 domain   auth, records, members, imports, exports, webhooks, oauth, mail, audit, src/paging.ts,
//              src/worker-heartbeat.ts
//   3 http     src/http/, src/ui/
//   4 entry    src/cli/, src/service.ts, src/worker.ts
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'

export const LAYERS = ['base', 'db', 'domain', 'http', 'entry'] as const

const ROOT_FILES: Record<string, number> = {
  'src/config.ts': 0,
  'src/errors.ts': 0,
  'src/log.ts': 0,
  'src/uuid.ts': 0,
  'src/cidr.ts': 0,
  'src/paging.ts': 2,
  'src/worker-heartbeat.ts': 2,
  'src/service.ts': 4,
  'src/worker.ts': 4,
}
const FOLDERS: Record<string, number> = {
  db: 1,
  auth: 2,
  records: 2,
  members: 2,
  imports: 2,
  exports: 2,
  webhooks: 2,
  oauth: 2,
  mail: 2,
  audit: 2,
  http: 3,
  ui: 3,
  cli: 4,
}

/** Where the repository stands; lower these as the structure improves, never raise them. */
export const BOUNDS = { backUpImports: 0, circles: 0 }

/** The layer of a file under src/, or undefined for one no rule places (which the check reports). */
export function layerOf(path: string): number | undefined {
  const parts = path.split('/')
  return parts.length === 2 ? ROOT_FILES[path] : FOLDERS[parts[1]]
}

// Static imports and re-exports (`import x from`, `import type`, `export * from`), imports for their
// effect (`import './x.ts'`) and dynamic `import('...')` of relative paths; packages are outside the graph.
const IMPORT =
  /(?:^|\n)\s*(?:import|export)\s[^'"]*?from\s*['"](\.{1,2}\/[^'"]+)['"]|(?:^|\n)\s*import\s*['"](\.{1,2}\/[^'"]+)['"]|import\(\s*['"](\.{1,2}\/[^'"]+)['"]\s*\)/g

export type ImportGraph = Map<string, Set<string>>

/** Every .ts file under `dir` of `root`, with the files of `root` it imports (paths relative to root). */
export function readImportGraph(root: string, dir = 'src'): ImportGraph {
  const graph: ImportGraph = new Map()
  const visit = (path: string): void => {
    for (const name of readdirSync(path)) {
      const child = join(path, name)
      if (statSync(child).isDirectory()) visit(child)
      else if (name.endsWith('.ts')) {
        const imports = new Set<string>()
        for (const match of readFileSync(child, 'utf8').matchAll(IMPORT)) {
          imports.add(relative(root, resolve(dirname(child), match[1] ?? match[2] ?? match[3])))
        }
        graph.set(relative(root, child), imports)
      }
    }
  }
  visit(join(root, dir))
  return graph
}

/** Imports from a file to a file of a higher layer, as `from -> to`. */
export function backUpImports(graph: ImportGraph): string[] {
  const found: string[] = []
  for (const [from, imports] of graph) {
    for (const to of imports) {
      const [fromLayer, toLayer] = [layerOf(from), layerOf(to)]
      if (fromLayer !== undefined && toLayer !== undefined && toLayer > fromLayer) found.push(`${from} -> ${to}`)
    }
  }
  return found.sort()
}

/** Files that no layer rule places. */
export function unplaced(graph: ImportGraph): string[] {
  return [...graph.keys()].filter((path) => layerOf(path) === undefined).sort()
}

/** The import circles: each strongly connected set of two or more files (Tarjan's algorithm). */
export function circles(graph: ImportGraph): string[][] {
  let next = 0
  const index = new Map<string, number>()
  const low = new Map<string, number>()
  const stack: string[] = []
  const onStack = new Set<string>()
  const found: string[][] = []
  const connect = (file: string): void => {
    index.set(file, next)
    low.set(file, next)
    next++
    stack.push(file)
    onStack.add(file)
    for (const to of graph.get(file) ?? []) {
      if (!graph.has(to)) continue
      if (!index.has(to)) {
        connect(to)
        low.set(file, Math.min(low.get(file) as number, low.get(to) as number))
      } else if (onStack.has(to)) low.set(file, Math.min(low.get(file) as number, index.get(to) as number))
    }
    if (low.get(file) === index.get(file)) {
      const members: string[] = []
      let member: string
      do {
        member = stack.pop() as string
        onStack.delete(member)
        members.push(member)
      } while (member !== file)
      if (members.length > 1) found.push(members.sort())
    }
  }
  for (const file of graph.keys()) if (!index.has(file)) connect(file)
  return found
}

if (import.meta.main) {
  const graph = readImportGraph(resolve(import.meta.dirname, '../..'))
  const back = backUpImports(graph)
  const circled = circles(graph)
  const loose = unplaced(graph)
  console.log(`import graph of src/: ${graph.size} files`)
  console.log(`imports running back up a layer: ${back.length} (at most ${BOUNDS.backUpImports})`)
  for (const line of back) console.log(`  ${line}`)
  console.log(`import circles: ${circled.length} (at most ${BOUNDS.circles})`)
  for (const circle of circled) console.log(`  ${circle.join(' <-> ')}`)
  if (loose.length > 0) console.log(`files no layer places (add them to test/helpers/import-graph.ts): ${loose.join(', ')}`)
  if (back.length > BOUNDS.backUpImports || circled.length > BOUNDS.circles || loose.length > 0) process.exit(1)
}
