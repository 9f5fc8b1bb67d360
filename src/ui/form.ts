// Form posts: application/x-www-form-urlencoded, at most 64 KiB, read into a plain map.
import type { IncomingMessage } from 'node:http'
import { UnsupportedMediaTypeError, ValidationError } from '../errors.ts'
import { mediaType, readBody } from '../http/body.ts'
import { isStorableString } from '../http/route.ts'

const FORM_LIMIT = 64 * 1024

export type Form = { get: (name: string) => string; has: (name: string) => boolean }

export async function readForm(req: IncomingMessage): Promise<Form> {
  const type = mediaType(req)
  if (type !== 'application/x-www-form-urlencoded')
    throw new UnsupportedMediaTypeError('Send the form as application/x-www-form-urlencoded')
  const params = new URLSearchParams((await readBody(req, FORM_LIMIT)).toString('utf8'))
  // Bytes that are not UTF-8 decode to U+FFFD; a NUL survives decoding and PostgreSQL cannot store it.
  for (const [name, value] of params) {
    if (!isStorableString(name) || !isStorableString(value))
      throw new ValidationError(`The field ${JSON.stringify(name.replaceAll('\u0000', ''))} contains a NUL character`)
  }
  return { get: (name) => params.get(name) ?? '', has: (name) => params.has(name) }
}
