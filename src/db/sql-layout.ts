// A deparsed SQL expression (pg_get_expr writes it on one line) laid out over lines as a person
// would write it: broken at its top-level AND and OR, at the clauses of a sub-select, after the
// commas of a long list, inside the parentheses of a long call, each part indented under the part
// it belongs to. Only whitespace changes, never inside a string literal or a quoted identifier:
// re-parsing the result gives the same expression (test/foundation/schema-dump.test.ts checks every
// policy of sql/schema.sql that way).

export const LINE_WIDTH = 120

/** Where each character stands: inside a literal or quoted identifier, and at which nesting depth. */
function scan(text: string): { quoted: boolean[]; depth: number[] } {
  const quoted: boolean[] = []
  const depth: number[] = []
  let level = 0
  for (let i = 0; i < text.length; i++) {
    const char = text[i]
    if (char === "'" || char === '"') {
      // E'...' takes backslash escapes; '' and "" are the quote itself.
      const escapes = char === "'" && i > 0 && /[eE]/.test(text[i - 1]) && (i < 2 || !/\w/.test(text[i - 2]))
      let end = i + 1
      while (end < text.length) {
        if (escapes && text[end] === '\\') end += 2
        else if (text[end] === char && text[end + 1] === char) end += 2
        else if (text[end] === char) break
        else end++
      }
      for (let j = i; j <= Math.min(end, text.length - 1); j++) {
        quoted[j] = true
        depth[j] = level
      }
      i = end
      continue
    }
    if (char === ')' || char === ']') level--
    quoted[i] = false
    depth[i] = level
    if (char === '(' || char === '[') level++
  }
  return { quoted, depth }
}

/** Runs of whitespace outside literals become one space; the ends are trimmed. */
export function collapseWhitespace(text: string): string {
  const { quoted } = scan(text)
  let out = ''
  for (let i = 0; i < text.length; i++) {
    if (!quoted[i] && /\s/.test(text[i])) {
      if (!out.endsWith(' ')) out += ' '
    } else out += text[i]
  }
  return out.trim()
}

/** The text split where a separator (a regular expression anchored with ^) stands at depth 0 outside literals; the separators are kept. */
function splitTopLevel(text: string, separator: RegExp): { parts: string[]; separators: string[] } {
  const { quoted, depth } = scan(text)
  const parts: string[] = []
  const separators: string[] = []
  let from = 0
  for (let i = 0; i < text.length; i++) {
    if (quoted[i] || depth[i] !== 0) continue
    const match = separator.exec(text.slice(i))
    if (!match || i === 0) continue
    parts.push(text.slice(from, i))
    separators.push(match[0])
    from = i + match[0].length
    i = from - 1
  }
  parts.push(text.slice(from))
  return { parts, separators }
}

/**
 * A one-line statement longer than LINE_WIDTH broken before each of its clauses (the keywords,
 * where they stand outside parentheses and literals), the clauses indented by two.
 */
export function breakClauses(statement: string, keywords: RegExp, width = LINE_WIDTH): string {
  if (statement.length <= width) return statement
  const { parts, separators } = splitTopLevel(statement, keywords)
  return parts.map((part, i) => (i === 0 ? part : `${separators[i - 1].trimStart()}${part}`)).join('\n  ')
}

/** The index of the parenthesis that closes the one at open (-1 when none does). */
export function closingParen(text: string, open: number): number {
  const { quoted, depth } = scan(text)
  for (let i = open + 1; i < text.length; i++) {
    if (!quoted[i] && depth[i] === depth[open] && (text[i] === ')' || text[i] === ']')) return i
  }
  return -1
}

const pad = (column: number) => ' '.repeat(column)

/** Whether laid-out text starting at column stays within width, its last line with trailing after it. */
function fits(text: string, column: number, width: number, trailing: number): boolean {
  const lines = text.split('\n')
  return lines.every((line, i) => (i === 0 ? column : 0) + line.length + (i === lines.length - 1 ? trailing : 0) <= width)
}

/**
 * The expression (on one line or not) laid out for a start at column: unchanged when it fits in
 * LINE_WIDTH, else broken where it reads best; continuation lines start with their indentation.
 */
export function layoutExpression(expression: string, column: number, width = LINE_WIDTH): string {
  return layout(collapseWhitespace(expression), column, width)
}

/** trailing: how many characters follow the text on its last line (closing parentheses, a comma). */
function layout(text: string, column: number, width: number, trailing = 0): string {
  if (column + text.length + trailing <= width) return text
  const last = (i: number, parts: unknown[]) => (i === parts.length - 1 ? trailing : 0)

  // a AND b AND c, x OR y: one operand a line, the operator leading.
  const logical = splitTopLevel(text, /^ (AND|OR) /)
  if (logical.parts.length > 1) {
    return logical.parts
      .map((part, i) => {
        if (i === 0) return layout(part, column, width, last(i, logical.parts))
        const operator = logical.separators[i - 1].trim()
        return `${operator} ${layout(part, column + operator.length + 1, width, last(i, logical.parts))}`
      })
      .join(`\n${pad(column)}`)
  }

  // A sub-select: each clause on its own line.
  const clauses = splitTopLevel(text, /^ (FROM|WHERE|GROUP BY|HAVING|ORDER BY|LIMIT|UNION ALL|UNION) /)
  if (clauses.parts.length > 1) {
    return clauses.parts
      .map((part, i) => {
        if (i === 0) return layout(part, column, width, last(i, clauses.parts))
        const keyword = clauses.separators[i - 1].trim()
        return `${keyword} ${layout(part, column + keyword.length + 1, width, last(i, clauses.parts))}`
      })
      .join(`\n${pad(column)}`)
  }

  // CASE WHEN ... THEN ... ELSE ... END: a branch a line.
  if (/^CASE /.test(text) && text.endsWith(' END')) {
    const branches = splitTopLevel(text.slice(5, -4), /^ (WHEN|ELSE) /)
    if (branches.parts.length > 1 || /^WHEN /.test(branches.parts[0])) {
      const lines = branches.parts.map((part, i) => (i === 0 ? part : `${branches.separators[i - 1].trim()} ${part}`))
      return `CASE ${lines.map((line) => layout(line, column + 5, width, 0)).join(`\n${pad(column + 5)}`)}\n${pad(column)}END`
    }
  }

  // a, b, c (the arguments of a call): as many a line as fit, broken after a comma.
  const items = splitTopLevel(text, /^, /)
  if (items.parts.length > 1) {
    const lines: string[] = []
    for (const item of items.parts) {
      const previous = lines.length - 1
      const candidate = previous >= 0 ? `${lines[previous]}, ${item}` : item
      if (previous >= 0 && column + candidate.length + 1 <= width) lines[previous] = candidate
      else lines.push(item)
    }
    if (lines.length > 1) {
      return lines.map((line, i) => layout(line, column, width, i === lines.length - 1 ? trailing : 1)).join(`,\n${pad(column)}`)
    }
  }

  // Wrapped whole in parentheses: the inside, one column in.
  const { quoted } = scan(text)
  if ((text[0] === '(' || text[0] === '[') && closingParen(text, 0) === text.length - 1) {
    const inner = text.slice(1, -1)
    const leading = inner.startsWith(' ') ? ' ' : ''
    return `${text[0]}${leading}${layout(inner.trimStart(), column + 1 + leading.length, width, trailing + 1)}${text.at(-1)}`
  }

  // A call or a group inside a longer expression: the longest one's inside, two columns in.
  let best: { open: number; close: number } | null = null
  for (let i = 0; i < text.length; i++) {
    if (quoted[i] || (text[i] !== '(' && text[i] !== '[')) continue
    const close = closingParen(text, i)
    if (close < 0) break
    if (!best || close - i > best.close - best.open) best = { open: i, close }
    i = close
  }
  if (best && best.close - best.open > 2) {
    const head = text.slice(0, best.open + 1)
    const inner = text.slice(best.open + 1, best.close)
    const tail = text.slice(best.close)
    const leading = inner.startsWith(' ') ? ' ' : ''
    const underParen = column + head.length + leading.length
    const after = trailing + tail.length
    const body = inner.trimStart()
    // The inside on the next line when it fits there whole, else broken (under its parenthesis when
    // that stands near the left).
    if (column + 2 + body.length + after <= width) return `${head}\n${pad(column + 2)}${body}${tail}`
    if (underParen <= width / 2) {
      const under = `${head}${leading}${layout(body, underParen, width, after)}${tail}`
      if (fits(under, column, width, trailing)) return under
    }
    return `${head}\n${pad(column + 2)}${layout(body, column + 2, width, after)}${tail}`
  }
  return text
}

/**
 * A string literal too long for its line as adjacent literals, one a line from column on: SQL
 * joins literals that only whitespace with a newline separates, so the value is the same. Broken
 * after a space, never inside a doubled quote.
 */
export function wrapLiteral(literal: string, column: number, width = LINE_WIDTH): string {
  if (column + literal.length <= width || !literal.startsWith("'") || !literal.endsWith("'")) return literal
  const room = width - column - 2
  const words = literal.slice(1, -1).split(/(?<= )/)
  const lines: string[] = []
  for (const word of words) {
    const last = lines.length - 1
    if (last >= 0 && lines[last].length + word.length <= room) lines[last] += word
    else lines.push(word)
  }
  return lines.map((line) => `'${line}'`).join(`\n${pad(column)}`)
}

/**
 * A line that names a routine with its arguments (`create function crm.f(a uuid, b text)`,
 * `grant execute on function crm.f(...) to ...`), when longer than width: one argument a line,
 * indented by two, the closing parenthesis back at the line's indentation.
 */
export function breakArguments(line: string, width = LINE_WIDTH, opener = /\bcrm\.[a-z_0-9]+\(/i): string {
  if (line.length <= width) return line
  const open = line.search(opener)
  if (open < 0) return line
  const paren = line.indexOf('(', open)
  const close = closingParen(line, paren)
  if (close < 0 || close - paren < 2) return line
  const indent = /^\s*/.exec(line)?.[0] ?? ''
  const { parts } = splitTopLevel(line.slice(paren + 1, close), /^, /)
  return `${line.slice(0, paren + 1)}\n${parts.map((part) => `${indent}  ${part.trim()}`).join(',\n')}\n${indent}${line.slice(close)}`
}

/** A function's definition as pg_get_functiondef writes it, its long header lines and SQL-standard body laid out. */
export function layoutFunctionDefinition(definition: string, width = LINE_WIDTH): string {
  return definition
    .split('\n')
    .map((line, index) => {
      if (line.length <= width) return line
      if (index === 0) return breakArguments(line, width)
      if (/^ RETURNS TABLE\(/.test(line)) return breakArguments(line, width, /TABLE\(/)
      if (/^RETURN /.test(line)) return `RETURN ${layoutExpression(line.slice(7), 7, width)}`
      return line
    })
    .join('\n')
}
