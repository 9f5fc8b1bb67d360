// The failed assertions of a tap run, by test file, gathered from its TAP output as it streams: the
// runner prints them again at the end, next to the "N passed, N failed" line, so a failure in a
// long run is read from the run's last lines rather than lost in thousands of others.

const FILE = /^# Subtest: (test\/\S+\.test\.ts)\s*$/
const NOT_OK = /^(\s*)not ok \d+ - (.*)$/

export class TapFailures {
  readonly found: string[] = []
  #file = '(no file)'
  #partial = ''
  readonly #limit: number

  constructor(limit = 50) {
    this.#limit = limit
  }

  /** Feeds a chunk of TAP output (lines may be split across chunks). */
  add(chunk: string): void {
    const lines = (this.#partial + chunk).split('\n')
    this.#partial = lines.pop() ?? ''
    for (const line of lines) this.#line(line)
  }

  /** The failures seen, the last partial line included. */
  end(): string[] {
    if (this.#partial) this.#line(this.#partial)
    this.#partial = ''
    return this.found
  }

  #line(line: string): void {
    const file = FILE.exec(line)
    if (file) {
      this.#file = file[1]
      return
    }
    const failure = NOT_OK.exec(line)
    // A file's own line (no indentation) repeats what its assertions said.
    if (failure && failure[1].length > 0 && this.found.length < this.#limit) {
      this.found.push(`${this.#file}: ${failure[2].trim()}`)
    }
  }
}
