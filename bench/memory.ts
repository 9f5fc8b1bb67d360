// Memory under a steady mixed load: is anything kept per request? The real API runs in a child
// process started with --expose-gc; every SAMPLE_SECONDS it collects garbage and reports its RSS and
// V8 heap, while the parent drives the soak's mixed load (reads, creates with Idempotency-Key,
// updates, CSV uploads) for BENCH_MEMORY_SECONDS (default 120). A leak shows as heap used after
// a full GC that keeps rising; RSS alone also moves with how much heap V8 decides to keep.
//
//   node bench/memory.ts
//   BENCH_MEMORY_SECONDS=300 node bench/memory.ts
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { Load } from '../test/faults/load.ts'
import { API_NODE_FLAGS, apiNodeFlagsLabel, benchWorkspace, provision, startBenchApi } from './_database.ts'

const SELF = fileURLToPath(import.meta.url)
const SECONDS = Number(process.env.BENCH_MEMORY_SECONDS ?? 120)
const SAMPLE_SECONDS = 10

type Sample = { seconds: number; rss: number; heapUsed: number; heapTotal: number; external: number }

// Child: the service, reporting its memory after a full collection.
async function serve(databaseUrl: string): Promise<void> {
  const service = await startBenchApi(databaseUrl)
  const collect = (globalThis as { gc?: () => void }).gc
  if (!collect) throw new Error('run the child with --expose-gc')
  const started = Date.now()
  const report = () => {
    collect()
    const usage = process.memoryUsage()
    process.stdout.write(
      JSON.stringify({
        seconds: Math.round((Date.now() - started) / 1000),
        rss: usage.rss,
        heapUsed: usage.heapUsed,
        heapTotal: usage.heapTotal,
        external: usage.external,
      }) + '\n',
    )
  }
  report()
  process.stdout.write(JSON.stringify({ url: service.url }) + '\n')
  setInterval(report, SAMPLE_SECONDS * 1000)
  process.on('SIGTERM', () => void service.stop().then(() => process.exit(0)))
}

async function main(): Promise<string> {
  const database = await provision()
  try {
    const { admin } = await benchWorkspace(database.url)
    const child = spawn(process.execPath, ['--expose-gc', ...API_NODE_FLAGS, SELF, '--serve', database.url], {
      stdio: ['ignore', 'pipe', 'inherit'],
    })
    const samples: Sample[] = []
    const url = await new Promise<string>((resolve, reject) => {
      let buffer = ''
      child.stdout!.on('data', (chunk: Buffer) => {
        buffer += chunk.toString()
        let newline: number
        while ((newline = buffer.indexOf('\n')) >= 0) {
          const message = JSON.parse(buffer.slice(0, newline))
          buffer = buffer.slice(newline + 1)
          if (message.url) resolve(message.url)
          else samples.push(message)
        }
      })
      child.once('exit', (code) => reject(new Error(`the service exited with ${code}`)))
    })
    const load = new Load({ urls: [url], token: admin.token, concurrency: 4, importEveryMs: 2000, importRows: 25 })
    const idle = samples.length
    load.start()
    await new Promise((resolve) => setTimeout(resolve, SECONDS * 1000 + 500))
    await load.stop()
    child.kill('SIGTERM')
    const summary = load.summary()

    const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(1)
    const loaded = samples.slice(idle)
    const steady = loaded.slice(1)
    const heapFirst = steady[0]?.heapUsed ?? 0
    const heapLast = steady.at(-1)?.heapUsed ?? 0
    return [
      '## Memory under mixed load (bench/memory.ts)',
      '',
      `The API in its own process (${apiNodeFlagsLabel()}), ${SECONDS} s of the soak's mixed load (4 concurrent clients: reads, creates with Idempotency-Key, updates, a 25-row CSV upload every 2 s): ${summary.requests.toLocaleString('en')} requests. Every ${SAMPLE_SECONDS} s the process runs a full GC and reports its memory.`,
      '',
      '| seconds | RSS MiB | heap used after GC MiB | heap reserved MiB | external MiB |',
      '|---:|---:|---:|---:|---:|',
      ...samples.map(
        (sample, index) =>
          `| ${index < idle ? 'idle' : sample.seconds} | ${mib(sample.rss)} | ${mib(sample.heapUsed)} | ${mib(sample.heapTotal)} | ${mib(sample.external)} |`,
      ),
      '',
      `Heap used after GC from the first to the last loaded sample: ${mib(heapFirst)} → ${mib(heapLast)} MiB (${heapLast - heapFirst >= 0 ? '+' : ''}${mib(heapLast - heapFirst)} MiB over ${summary.requests.toLocaleString('en')} requests). RSS follows the heap V8 reserves under load, not what it keeps.`,
      '',
    ].join('\n')
  } finally {
    await database.stop()
  }
}

const [mode, argument] = process.argv.slice(2)
if (mode === '--serve') await serve(argument)
else process.stdout.write((await main()) + '\n')
