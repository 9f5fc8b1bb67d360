// Form posts of the pages: application/x-www-form-urlencoded, read into a plain map (form-body.ts).
import type { IncomingMessage } from 'node:http'
import { UnsupportedMediaTypeError, ValidationError } from '../errors.ts'
import { mediaType } from '../http/body.ts'
import { fieldWithNul, receiveForm } from '../http/form-body.ts'
import type { Services } from '../http/route.ts'
import type { BodyReceipts } from '../http/upload-receipts.ts'

export type Form = { get: (name: string) => string; has: (name: string) => boolean }

/** The form of a page; a signed-in page's holds the receipts of its own kind (`receipts`). */
export async function readForm(req: IncomingMessage, services: Services, receipts?: BodyReceipts): Promise<Form> {
  const type = mediaType(req)
  if (type !== 'application/x-www-form-urlencoded')
    throw new UnsupportedMediaTypeError('Send the form as application/x-www-form-urlencoded')
  const params = await receiveForm(req, services, receipts)
  const refused = fieldWithNul(params)
  if (refused !== undefined) throw new ValidationError(`The field ${JSON.stringify(refused)} contains a NUL character`)
  return { get: (name) => params.get(name) ?? '', has: (name) => params.has(name) }
}
