// How many file bodies this process receives at once, and how many bytes their temporary files
// hold together. A receipt is taken before the caller is authenticated (app.ts), so one address
// cannot make the database authenticate more uploads at once than its bound, whatever tokens it
// sends; the body itself is received only after authentication and the workspace's upload slot.
// The bounds keep one address (many workspaces, many tokens) and all clients together from
// filling the sockets and the disk with slow uploads. Counted in each API process, like the
// workspace slots.
import type { IncomingMessage } from 'node:http'
import { RateLimitedError, UnavailableError } from '../errors.ts'
import { addressBlock } from '../webhooks/address-guard.ts'
import { clientOf } from './client-address.ts'
import { createKeyedCounts } from './workspace-slots.ts'

export type UploadReceiptLimits = {
  /** UPLOADS_PER_ADDRESS: bodies received at once from one client address (429 past it). */
  perAddress: number
  /** UPLOADS_TOTAL: bodies received at once by the process (503 past it). */
  total: number
  /** UPLOAD_TEMP_BYTES: bytes of every temporary upload file of the process together (503 past it). */
  tempBytes: number
}

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

export function createUploadReceipts(limits: UploadReceiptLimits): UploadReceipts {
  const byAddress = createKeyedCounts()
  let receipts = 0
  let tempBytes = 0
  return {
    take: (req) => {
      // An IPv6 client by its /64, as the per-address rate limit counts it: a /64 rotates freely.
      const address = addressBlock(clientOf(req).address)
      if (byAddress.count(address) >= limits.perAddress) {
        throw new RateLimitedError(
          RETRY_AFTER_SECONDS,
          'rate_limited',
          `This address already sends ${limits.perAddress} uploads; retry when one has finished`,
        )
      }
      if (receipts >= limits.total) {
        throw new UnavailableError(null, `This server already receives ${limits.total} uploads; retry shortly`)
      }
      const releaseAddress = byAddress.take(address)
      receipts++
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
          receipts--
          releaseAddress()
        },
      }
    },
    inUse: () => ({ receipts, tempBytes }),
  }
}
