// Form posts (application/x-www-form-urlencoded: the pages' forms, the OAuth token and revocation
// endpoints): at most 64 KiB, read under the same receipt as JSON bodies, so slow senders of forms
// are bounded per address and in all as JSON senders are (upload-receipts.ts).
import type { IncomingMessage } from 'node:http'
import { readBody } from './body.ts'
import { isStorableString, type Services } from './route.ts'
import type { BodyReceipts } from './upload-receipts.ts'

const FORM_LIMIT = 64 * 1024

/** The form's fields, read while holding one of `receipts` (429 or 503 when none is left). */
export async function receiveForm(
  req: IncomingMessage,
  services: Services,
  receipts: BodyReceipts = services.bodyReceipts,
): Promise<URLSearchParams> {
  const release = receipts.take(req)
  try {
    return new URLSearchParams((await readBody(req, FORM_LIMIT, services.config.bodyIdleTimeoutMs)).toString('utf8'))
  } finally {
    release()
  }
}

/** The first field whose name or value PostgreSQL cannot store (a NUL survives UTF-8 decoding), if any. */
export function fieldWithNul(fields: URLSearchParams): string | undefined {
  for (const [name, value] of fields) {
    if (!isStorableString(name) || !isStorableString(value)) return name.replaceAll('\u0000', '')
  }
  return undefined
}
