// Webhook bodies are pure ASCII so that receivers which re-encode the body before checking the
// signature (a common bug) still compute the same bytes we signed.

const NON_ASCII = /[\u0080-\uffff]/g
const HAS_NON_ASCII = /[\u0080-\uffff]/

/**
 * JSON.stringify, then every UTF-16 code unit above U+007F as a lower-case \uXXXX escape. Working
 * per code unit writes characters beyond U+FFFF as surrogate-pair escapes, as JSON requires.
 * Non-ASCII can only occur inside JSON strings, so the escapes are always valid there.
 */
export function asciiJson(value: unknown): string {
  const json = JSON.stringify(value)
  if (json === undefined) throw new TypeError(`asciiJson cannot serialise a value of type ${typeof value}`)
  return escapeNonAscii(json)
}

/** The same escaping for JSON text written elsewhere (PostgreSQL writes delivery bodies). */
export function escapeNonAscii(json: string): string {
  // Most bodies are ASCII already: a search without a match costs less than a replace.
  if (!HAS_NON_ASCII.test(json)) return json
  return json.replace(NON_ASCII, (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`)
}
