// A bounded wait for a database connection. Slonik queues requests for a busy pool without limit;
// this gate admits at most `capacity` requests to the pool at once, lets others wait up to
// `maxWaitMs`, and then refuses them with 503 so a saturated service sheds load instead of piling up.
import { UnavailableError } from '../../errors.ts'

export type AdmissionGate = { run: <T>(fn: () => Promise<T>) => Promise<T>; inFlight: () => number; waiting: () => number }

export function createAdmissionGate(capacity: number, maxWaitMs: number): AdmissionGate {
  let active = 0
  const queue: { admit: () => void; timer: NodeJS.Timeout }[] = []

  const release = () => {
    const next = queue.shift()
    if (next) {
      clearTimeout(next.timer)
      next.admit()
    } else {
      active--
    }
  }

  const admitted = async <T>(fn: () => Promise<T>): Promise<T> => {
    try {
      return await fn()
    } finally {
      release()
    }
  }

  const enter = (): Promise<void> => {
    if (active < capacity) {
      active++
      return Promise.resolve()
    }
    return new Promise((resolve, reject) => {
      const entry = {
        admit: () => resolve(),
        timer: setTimeout(() => {
          queue.splice(queue.indexOf(entry), 1)
          reject(new UnavailableError(null, `All ${capacity} database connections stayed busy for ${maxWaitMs} ms; retry shortly`))
        }, maxWaitMs),
      }
      queue.push(entry)
    })
  }

  return {
    // A free slot is taken at once, without waiting a turn of the event loop for an already
    // settled promise (every request passes here).
    run: (fn) => {
      if (active < capacity) {
        active++
        return admitted(fn)
      }
      return enter().then(() => admitted(fn))
    },
    inFlight: () => active,
    waiting: () => queue.length,
  }
}
