// Form posts of the pages: application/x-www-form-urlencoded, read into a plain map (form-body.ts).
import type { IncomingMessage } from 'node:http'
import { UnsupportedMediaTypeError, ValidationError } from '../errors.ts'
import { mediaType } from '../http/body.ts'
import { fieldWithNul, receiveForm } from '../http/form-body.ts'
import type { Services } from '../http/route.ts'
import type { BodyReceipts } from '../http/upload-receipts.ts'

export type Form = {
  get: (name: string) => string
  has: (name: string) => boolean
  /**
   * Throws 422 unless every field is the CSRF token or one of `expected` (a name, or a pattern of
   * names), each sent once: a field the page's form does not have, or a second value the handler
   * would not read (`get` answers the first), is a forged form, refused before anything is written.
   */
  expectOnly: (expected: (string | RegExp)[]) => void
}

/** A field's name as an error message quotes it: at most 40 characters. */
const quoted = (name: string) => JSON.stringify(name.length > 40 ? `${name.slice(0, 40)}…` : name)

function formOf(params: URLSearchParams): Form {
  return {
    get: (name) => params.get(name) ?? '',
    has: (name) => params.has(name),
    expectOnly: (expected) => {
      const seen = new Set<string>()
      for (const name of params.keys()) {
        if (name !== 'csrf' && !expected.some((allowed) => (typeof allowed === 'string' ? allowed === name : allowed.test(name))))
          throw new ValidationError(`The form has no field ${quoted(name)}`)
        if (seen.has(name)) throw new ValidationError(`The field ${quoted(name)} is sent more than once`)
        seen.add(name)
      }
    },
  }
}

/** A form without fields: what a page that is not a form post sees. */
export const EMPTY_FORM: Form = formOf(new URLSearchParams())

/** The form of a page; a signed-in page's holds the receipts of its own kind (`receipts`). */
export async function readForm(req: IncomingMessage, services: Services, receipts?: BodyReceipts): Promise<Form> {
  const type = mediaType(req)
  if (type !== 'application/x-www-form-urlencoded')
    throw new UnsupportedMediaTypeError('Send the form as application/x-www-form-urlencoded')
  const params = await receiveForm(req, services, receipts)
  const refused = fieldWithNul(params)
  if (refused !== undefined) throw new ValidationError(`The field ${quoted(refused)} contains a NUL character`)
  return formOf(params)
}
