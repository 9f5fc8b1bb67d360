// How many bodies this process receives at once, per client address and in total, and for file
// bodies how many bytes their temporary files hold together. An upload's receipt is taken before
// the caller is authenticated (route-body.ts), so one address cannot make the database authenticate more
// uploads at once than its bound, whatever tokens it sends; the body itself is received only after
// authentication and the workspace's upload slot. A JSON or form body's receipt is held while it arrives
// (at most JSON_BODY_LIMIT in memory each). The bounds keep one address (many workspaces, many
// tokens) and all clients together from filling the sockets, the memory and the disk with slow
// bodies. Counted in each API process, like the workspace slots.
import type { IncomingMessage } from 'node:http'
import { addressBlock } from '../cidr.ts'
import type { ReceiptBounds, UploadReceiptLimits } from '../config.ts'
import { RateLimitedError, UnavailableError } from '../errors.ts'
import { type ReceivedFile, receiveBodyFile } from './body.ts'
import { clientOf } from './client-address.ts'
import { createKeyedCounts } from './workspace-slots.ts'

/** One body being received: its bytes are counted as they arrive, and all is given back at the end. */
export type UploadReceipt = {
  /** Throws 503 when the body's declared Content-Length cannot fit beside the files being received. */
  checkDeclaredLength: () => void
  /** Counts `bytes` more on the disk; throws 503 when the process's temporary files would pass their cap. */
  reserve: (bytes: number) => void
  release: () => void
}

export type UploadReceipts = {
  /** A receipt for this request's body, or 429 (its address) or 503 (the process) when a bound is reached. */
  take: (req: IncomingMessage) => UploadReceipt
  inUse: () => { receipts: number; tempBytes: number }
}

const RETRY_AFTER_SECONDS = 5

function tempFull(limits: UploadReceiptLimits): UnavailableError {
  return new UnavailableError(null, `Uploads in progress fill this server's space for them (${limits.tempBytes} bytes); retry shortly`)
}

export type BodyReceipts = {
  /** A receipt for this request's body, or 429 (its address) or 503 (the process) when a bound is reached; answers its release. */
  take: (req: IncomingMessage) => () => void
  inUse: () => number
}

/**
 * The process's sets of JSON and form body receipts, made here once, each with the same bounds
 * (JSON_BODIES_PER_ADDRESS, JSON_BODIES_TOTAL) and apart, so one kind of body cannot fill another's:
 * bodies without a caller (sign-in, sign-up, their forms, the OAuth token endpoint), the forms of
 * signed-in pages (read before their session is checked), and the bodies of proven callers.
 */
export function createBodyReceiptSets(bounds: ReceiptBounds): {
  bodyReceipts: BodyReceipts
  sessionFormReceipts: BodyReceipts
  callerBodyReceipts: BodyReceipts
} {
  return {
    bodyReceipts: createBodyReceipts(bounds, 'request bodies'),
    sessionFormReceipts: createBodyReceipts(bounds, 'request bodies'),
    callerBodyReceipts: createBodyReceipts(bounds, 'request bodies'),
  }
}

/** Counts the bodies being received, per client address and in total; `bodies` names them in the refusals. */
export function createBodyReceipts(bounds: ReceiptBounds, bodies: string): BodyReceipts {
  const byAddress = createKeyedCounts()
  let receipts = 0
  return {
    take: (req) => {
      // An IPv6 client by its /64, as the per-address rate limit counts it: a /64 rotates freely.
      const address = addressBlock(clientOf(req).address)
      if (byAddress.count(address) >= bounds.perAddress) {
        throw new RateLimitedError(
          RETRY_AFTER_SECONDS,
          'rate_limited',
          `This address already sends ${bounds.perAddress} ${bodies}; retry when one has finished`,
        )
      }
      if (receipts >= bounds.total) {
        throw new UnavailableError(null, `This server already receives ${bounds.total} ${bodies}; retry shortly`)
      }
      const releaseAddress = byAddress.take(address)
      receipts++
      let released = false
      return () => {
        if (released) return
        released = true
        receipts--
        releaseAddress()
      }
    },
    inUse: () => receipts,
  }
}

export function createUploadReceipts(limits: UploadReceiptLimits): UploadReceipts {
  const bodies = createBodyReceipts(limits, 'uploads')
  let tempBytes = 0
  return {
    take: (req) => {
      const releaseBody = bodies.take(req)
      let reserved = 0
      let released = false
      return {
        checkDeclaredLength: () => {
          // A declared length that cannot fit is refused before a byte of it arrives.
          const declared = Number(req.headers['content-length'])
          if (Number.isFinite(declared) && tempBytes + declared > limits.tempBytes) throw tempFull(limits)
        },
        reserve: (bytes) => {
          if (tempBytes + bytes > limits.tempBytes) throw tempFull(limits)
          tempBytes += bytes
          reserved += bytes
        },
        release: () => {
          if (released) return
          released = true
          tempBytes -= reserved
          releaseBody()
        },
      }
    },
    inUse: () => ({ receipts: bodies.inUse(), tempBytes }),
  }
}

/** An upload received whole: its temporary file, and `release`, which removes the file and gives the receipt back. */
export type ReceivedUpload = { file: ReceivedFile; release: () => Promise<void> }

/**
 * Every upload of the process, the API's and the import wizard's, is received here: a receipt of
 * `receipts` first (429 per address, 503 per process), then `beforeBody` (whatever must pass before
 * a byte is read: authentication, the workspace's slot, each release it takes given to `hold`),
 * then the declared length and every chunk are counted against the cap on temporary files.
 */
export async function receiveUpload(
  receipts: UploadReceipts,
  req: IncomingMessage,
  limits: { limit: number; idleTimeoutMs: number },
  beforeBody?: (hold: (release: () => void) => void) => Promise<void>,
): Promise<ReceivedUpload> {
  const receipt = receipts.take(req)
  const held = [receipt.release]
  const releaseHeld = () => {
    for (const release of held) release()
  }
  try {
    await beforeBody?.((release) => held.push(release))
    receipt.checkDeclaredLength()
    const file = await receiveBodyFile(req, limits.limit, limits.idleTimeoutMs, receipt)
    return {
      file,
      release: async () => {
        try {
          await file.remove()
        } finally {
          releaseHeld()
        }
      },
    }
  } catch (error) {
    releaseHeld()
    throw error
  }
}
