// One way to build HTML: the `html` tag escapes every interpolated value unless it is already
// SafeHtml (the result of another `html` call), so a page cannot forget to escape.

export class SafeHtml {
  readonly text: string
  constructor(text: string) {
    this.text = text
  }
  toString(): string {
    return this.text
  }
}

const ESCAPES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;', '`': '&#96;' }

export function escapeHtml(value: string): string {
  return value.replace(/[&<>"'`]/g, (char) => ESCAPES[char])
}

type Value = SafeHtml | string | number | boolean | null | undefined | readonly Value[]

function render(value: Value): string {
  if (value === null || value === undefined || value === false) return ''
  if (value instanceof SafeHtml) return value.text
  if (Array.isArray(value)) return value.map(render).join('')
  return escapeHtml(String(value))
}

export function html(strings: TemplateStringsArray, ...values: Value[]): SafeHtml {
  let out = strings[0]
  for (let i = 0; i < values.length; i++) out += render(values[i]) + strings[i + 1]
  return new SafeHtml(out)
}

/** Markup made by code that escapes on its own (the QR encoder's SVG); never user input. */
export function trusted(text: string): SafeHtml {
  return new SafeHtml(text)
}
