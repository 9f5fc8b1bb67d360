// The runner repeats a run's failed assertions at its end (test/run.ts), so a failure in a run of
// thousands is read from its last lines: here, from TAP output as tap writes it, split anywhere.
import t from 'tap'
import { TapFailures } from '../helpers/tap-failures.ts'

const OUTPUT = `TAP version 14
# Subtest: test/a/first.test.ts
    # Subtest: a group
        ok 1 - passes
        not ok 2 - should be equal
          ---
          found: 1
          wanted: 2
          ...
        1..2
    not ok 1 - a group # time=3ms
    1..1
not ok 1 - test/a/first.test.ts # time=40ms
# Subtest: test/b/second.test.ts
    ok 1 - fine
    1..1
ok 2 - test/b/second.test.ts # time=12ms
# Subtest: test/c/third.test.ts
    not ok 1 - the server answered 500
    1..1
not ok 3 - test/c/third.test.ts # time=9ms
1..3
`

t.test('every failed assertion and subtest, by file; not the files themselves', async (t) => {
  for (const size of [1, 7, 64, OUTPUT.length]) {
    const failures = new TapFailures()
    for (let at = 0; at < OUTPUT.length; at += size) failures.add(OUTPUT.slice(at, at + size))
    t.same(
      failures.end(),
      [
        'test/a/first.test.ts: should be equal',
        'test/a/first.test.ts: a group # time=3ms',
        'test/c/third.test.ts: the server answered 500',
      ],
      `in chunks of ${size}`,
    )
  }
})

t.test('a passing run has none, and a long failing one keeps the first few', async (t) => {
  const passing = new TapFailures()
  passing.add('# Subtest: test/b/second.test.ts\n    ok 1 - fine\nok 1 - test/b/second.test.ts\n')
  t.same(passing.end(), [])
  const many = new TapFailures(3)
  many.add('# Subtest: test/d/many.test.ts\n')
  for (let index = 1; index <= 10; index++) many.add(`    not ok ${index} - failure ${index}\n`)
  t.same(many.end(), ['test/d/many.test.ts: failure 1', 'test/d/many.test.ts: failure 2', 'test/d/many.test.ts: failure 3'])
})
