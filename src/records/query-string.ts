// Query strings are parsed here, strictly, from the raw bytes of the URL: bad percent-encoding,
// bytes that are not UTF-8, control characters, repeated or oversized parameters are a
// 400 invalid_parameter, never a lenient guess (node's querystring keeps malformed escapes as
// they are) and never a 500.
import { InvalidParameterError } from '../errors.ts'

export const MAX_PARAMETERS = 60
export const MAX_NAME_LENGTH = 200
export const MAX_VALUE_LENGTH = 4000

// C0 controls (NUL included), DEL, C1 controls; tabs and line breaks have no place in a parameter.
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/

function decode(part: string, what: string): string {
  let text: string
  try {
    text = decodeURIComponent(part.replaceAll('+', ' '))
  } catch {
    throw new InvalidParameterError(`${what} is not valid percent-encoded UTF-8`)
  }
  if (CONTROL.test(text)) throw new InvalidParameterError(`${what} contains a control character`)
  return text
}

/** The parameters of a request URL, each name at most once. */
export function parseQueryString(url: string | undefined): Map<string, string> {
  const parameters = new Map<string, string>()
  const at = (url ?? '').indexOf('?')
  if (at === -1) return parameters
  const search = (url ?? '').slice(at + 1)
  if (search === '') return parameters
  const parts = search.split('&')
  if (parts.length > MAX_PARAMETERS) throw new InvalidParameterError(`At most ${MAX_PARAMETERS} query parameters are accepted`)
  for (const part of parts) {
    if (part === '') continue
    const equals = part.indexOf('=')
    const rawName = equals === -1 ? part : part.slice(0, equals)
    const rawValue = equals === -1 ? '' : part.slice(equals + 1)
    if (rawName.length > MAX_NAME_LENGTH * 3) throw new InvalidParameterError('A query parameter name is too long')
    const name = decode(rawName, 'A query parameter name')
    if (name.length > MAX_NAME_LENGTH) throw new InvalidParameterError('A query parameter name is too long')
    if (rawValue.length > MAX_VALUE_LENGTH * 3) throw new InvalidParameterError(`${safeName(name)} is too long`)
    const value = decode(rawValue, safeName(name))
    if (value.length > MAX_VALUE_LENGTH)
      throw new InvalidParameterError(`${safeName(name)} is too long (at most ${MAX_VALUE_LENGTH} characters)`)
    if (parameters.has(name)) throw new InvalidParameterError(`${safeName(name)} is given more than once`)
    parameters.set(name, value)
  }
  return parameters
}

/** A parameter name fit to quote back in an error message (printable, short). */
export function safeName(name: string): string {
  const printable = name.replace(/[^\x20-\x7e]/g, '?')
  return printable.length > 60 ? `${printable.slice(0, 60)}…` : printable
}
