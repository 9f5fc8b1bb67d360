// How much the V8 heap of this process grows while an operation runs: the tests of parsers fed
// hostile input (a line of 50 MiB of commas) assert a bound on it. The heap is collected first, so
// the baseline holds live objects only, then sampled every millisecond (a timer, so waiting for I/O
// does not spin) until the operation settles. The parsers under test work through their input in
// chunks with turns of the event loop between them, so whatever they keep across chunks is seen;
// garbage made and dropped within one chunk may be missed, at most a chunk's worth.
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'

export const MiB = 1024 * 1024

setFlagsFromString('--expose-gc')
const collectGarbage = runInNewContext('gc') as () => void

export type HeapGrowth<T> = { result: T; growthBytes: number; samples: number }

export async function heapGrowthDuring<T>(operation: () => Promise<T>): Promise<HeapGrowth<T>> {
  collectGarbage()
  const baseline = process.memoryUsage().heapUsed
  let peak = baseline
  let samples = 0
  const sample = () => {
    peak = Math.max(peak, process.memoryUsage().heapUsed)
    samples++
  }
  const timer = setInterval(sample, 1)
  try {
    const result = await operation()
    sample()
    return { result, growthBytes: peak - baseline, samples }
  } finally {
    clearInterval(timer)
  }
}
