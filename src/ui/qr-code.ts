// A small QR code encoder (ISO/IEC 18004): byte mode, error correction level M, versions 1 to 40,
// the mask with the lowest penalty. Enough for otpauth:// URIs shown on the two-factor screen,
// so the page needs no image library and no third-party service ever sees the secret.
// The structure follows Project Nayuki's reference implementation (MIT).

// Level M, indexed by version (index 0 unused).
const ECC_CODEWORDS_PER_BLOCK = [-1, 10, 16, 26, 18, 24, 16, 18, 22, 22, 26, 30, 22, 22, 24, 24, 28, 28, 26, 26, 26, 26, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28]
const ERROR_CORRECTION_BLOCKS = [-1, 1, 1, 1, 2, 2, 4, 4, 4, 5, 5, 5, 8, 9, 9, 10, 10, 11, 13, 14, 16, 17, 17, 18, 20, 21, 23, 25, 26, 28, 29, 31, 33, 35, 37, 38, 40, 43, 45, 47, 49]
const FORMAT_BITS_LEVEL_M = 0

export type QrCode = { size: number; version: number; mask: number; dark: (x: number, y: number) => boolean }

function rawDataModules(version: number): number {
  let result = (16 * version + 128) * version + 64
  if (version >= 2) {
    const alignments = Math.floor(version / 7) + 2
    result -= (25 * alignments - 10) * alignments - 55
    if (version >= 7) result -= 36
  }
  return result
}

function dataCodewords(version: number): number {
  return Math.floor(rawDataModules(version) / 8) - ECC_CODEWORDS_PER_BLOCK[version] * ERROR_CORRECTION_BLOCKS[version]
}

function gfMultiply(x: number, y: number): number {
  let z = 0
  for (let i = 7; i >= 0; i--) {
    z = (z << 1) ^ ((z >>> 7) * 0x11d)
    z ^= ((y >>> i) & 1) * x
  }
  return z
}

function reedSolomonDivisor(degree: number): number[] {
  const result = new Array<number>(degree).fill(0)
  result[degree - 1] = 1
  let root = 1
  for (let i = 0; i < degree; i++) {
    for (let j = 0; j < result.length; j++) {
      result[j] = gfMultiply(result[j], root)
      if (j + 1 < result.length) result[j] ^= result[j + 1]
    }
    root = gfMultiply(root, 0x02)
  }
  return result
}

function reedSolomonRemainder(data: number[], divisor: number[]): number[] {
  const result = divisor.map(() => 0)
  for (const byte of data) {
    const factor = byte ^ (result.shift() as number)
    result.push(0)
    divisor.forEach((coefficient, i) => (result[i] ^= gfMultiply(coefficient, factor)))
  }
  return result
}

function bit(value: number, index: number): boolean {
  return ((value >>> index) & 1) !== 0
}

export function encodeQr(text: string): QrCode {
  const bytes = [...Buffer.from(text, 'utf8')]
  let version = 1
  for (; ; version++) {
    if (version > 40) throw new Error('qr: text too long')
    const needed = 4 + (version < 10 ? 8 : 16) + bytes.length * 8
    if (needed <= dataCodewords(version) * 8) break
  }
  const size = version * 4 + 17
  const capacity = dataCodewords(version) * 8

  // Segment: byte mode, count, bytes; then terminator, byte alignment and pad bytes.
  const bits: number[] = []
  const push = (value: number, length: number) => {
    for (let i = length - 1; i >= 0; i--) bits.push((value >>> i) & 1)
  }
  push(0b0100, 4)
  push(bytes.length, version < 10 ? 8 : 16)
  for (const byte of bytes) push(byte, 8)
  push(0, Math.min(4, capacity - bits.length))
  push(0, (8 - (bits.length % 8)) % 8)
  for (let pad = 0xec; bits.length < capacity; pad ^= 0xec ^ 0x11) push(pad, 8)
  const data: number[] = []
  for (let i = 0; i < bits.length; i += 8) data.push(parseInt(bits.slice(i, i + 8).join(''), 2))

  // Blocks with their error correction, interleaved.
  const blockCount = ERROR_CORRECTION_BLOCKS[version]
  const eccLength = ECC_CODEWORDS_PER_BLOCK[version]
  const rawCodewords = Math.floor(rawDataModules(version) / 8)
  const shortBlocks = blockCount - (rawCodewords % blockCount)
  const shortBlockLength = Math.floor(rawCodewords / blockCount)
  const divisor = reedSolomonDivisor(eccLength)
  const blocks: number[][] = []
  for (let i = 0, offset = 0; i < blockCount; i++) {
    const length = shortBlockLength - eccLength + (i < shortBlocks ? 0 : 1)
    const block = data.slice(offset, offset + length)
    offset += length
    const ecc = reedSolomonRemainder(block, divisor)
    if (i < shortBlocks) block.push(0)
    blocks.push(block.concat(ecc))
  }
  const codewords: number[] = []
  for (let i = 0; i < blocks[0].length; i++) {
    blocks.forEach((block, j) => {
      if (i !== shortBlockLength - eccLength || j >= shortBlocks) codewords.push(block[i])
    })
  }

  const modules = Array.from({ length: size }, () => new Array<boolean>(size).fill(false))
  const isFunction = Array.from({ length: size }, () => new Array<boolean>(size).fill(false))
  const setFunction = (x: number, y: number, dark: boolean) => {
    modules[y][x] = dark
    isFunction[y][x] = true
  }

  // Function patterns: timing, finders, alignment, format (placeholder), version.
  for (let i = 0; i < size; i++) {
    setFunction(6, i, i % 2 === 0)
    setFunction(i, 6, i % 2 === 0)
  }
  for (const [cx, cy] of [[3, 3], [size - 4, 3], [3, size - 4]]) {
    for (let dy = -4; dy <= 4; dy++) {
      for (let dx = -4; dx <= 4; dx++) {
        const distance = Math.max(Math.abs(dx), Math.abs(dy))
        const x = cx + dx
        const y = cy + dy
        if (x >= 0 && x < size && y >= 0 && y < size) setFunction(x, y, distance !== 2 && distance !== 4)
      }
    }
  }
  const alignment: number[] = []
  if (version > 1) {
    const count = Math.floor(version / 7) + 2
    const step = Math.floor((version * 8 + count * 3 + 5) / (count * 4 - 4)) * 2
    alignment.push(6)
    for (let position = size - 7; alignment.length < count; position -= step) alignment.splice(1, 0, position)
  }
  alignment.forEach((ax, i) => {
    alignment.forEach((ay, j) => {
      const nearFinder = (i === 0 && j === 0) || (i === 0 && j === alignment.length - 1) || (i === alignment.length - 1 && j === 0)
      if (nearFinder) return
      for (let dy = -2; dy <= 2; dy++) for (let dx = -2; dx <= 2; dx++) setFunction(ax + dx, ay + dy, Math.max(Math.abs(dx), Math.abs(dy)) !== 1)
    })
  })
  const drawFormat = (mask: number) => {
    const value = (FORMAT_BITS_LEVEL_M << 3) | mask
    let remainder = value
    for (let i = 0; i < 10; i++) remainder = (remainder << 1) ^ ((remainder >>> 9) * 0x537)
    const format = ((value << 10) | remainder) ^ 0x5412
    for (let i = 0; i <= 5; i++) setFunction(8, i, bit(format, i))
    setFunction(8, 7, bit(format, 6))
    setFunction(8, 8, bit(format, 7))
    setFunction(7, 8, bit(format, 8))
    for (let i = 9; i < 15; i++) setFunction(14 - i, 8, bit(format, i))
    for (let i = 0; i < 8; i++) setFunction(size - 1 - i, 8, bit(format, i))
    for (let i = 8; i < 15; i++) setFunction(8, size - 15 + i, bit(format, i))
    setFunction(8, size - 8, true)
  }
  drawFormat(0)
  if (version >= 7) {
    let remainder = version
    for (let i = 0; i < 12; i++) remainder = (remainder << 1) ^ ((remainder >>> 11) * 0x1f25)
    const versionBits = (version << 12) | remainder
    for (let i = 0; i < 18; i++) {
      const a = size - 11 + (i % 3)
      const b = Math.floor(i / 3)
      setFunction(a, b, bit(versionBits, i))
      setFunction(b, a, bit(versionBits, i))
    }
  }

  // Data in the zig-zag order, two columns at a time from the bottom right.
  let index = 0
  for (let right = size - 1; right >= 1; right -= 2) {
    if (right === 6) right = 5
    for (let vertical = 0; vertical < size; vertical++) {
      for (let j = 0; j < 2; j++) {
        const x = right - j
        const upward = ((right + 1) & 2) === 0
        const y = upward ? size - 1 - vertical : vertical
        if (!isFunction[y][x] && index < codewords.length * 8) {
          modules[y][x] = bit(codewords[index >>> 3], 7 - (index & 7))
          index++
        }
      }
    }
  }

  const applyMask = (mask: number) => {
    for (let y = 0; y < size; y++) {
      for (let x = 0; x < size; x++) {
        if (isFunction[y][x]) continue
        const product = x * y
        const invert = [
          (x + y) % 2 === 0,
          y % 2 === 0,
          x % 3 === 0,
          (x + y) % 3 === 0,
          (Math.floor(x / 3) + Math.floor(y / 2)) % 2 === 0,
          (product % 2) + (product % 3) === 0,
          ((product % 2) + (product % 3)) % 2 === 0,
          (((x + y) % 2) + (product % 3)) % 2 === 0,
        ][mask]
        if (invert) modules[y][x] = !modules[y][x]
      }
    }
  }

  let bestMask = 0
  let bestPenalty = Infinity
  for (let mask = 0; mask < 8; mask++) {
    applyMask(mask)
    drawFormat(mask)
    const score = penalty(modules)
    if (score < bestPenalty) {
      bestPenalty = score
      bestMask = mask
    }
    applyMask(mask) // XOR again: undone
  }
  applyMask(bestMask)
  drawFormat(bestMask)
  return { size, version, mask: bestMask, dark: (x, y) => modules[y][x] }
}

/** The standard's four penalty rules (runs, 2x2 blocks, finder look-alikes, dark balance). */
function penalty(modules: boolean[][]): number {
  const size = modules.length
  let result = 0
  const line = (get: (i: number) => boolean) => {
    let score = 0
    let run = 1
    for (let i = 1; i <= size; i++) {
      if (i < size && get(i) === get(i - 1)) run++
      else {
        if (run >= 5) score += 3 + (run - 5)
        run = 1
      }
    }
    const finder = [true, false, true, true, true, false, true]
    for (let i = 0; i + 7 <= size; i++) {
      if (!finder.every((dark, k) => get(i + k) === dark)) continue
      const lightBefore = [1, 2, 3, 4].every((k) => i - k < 0 || !get(i - k))
      const lightAfter = [0, 1, 2, 3].every((k) => i + 7 + k >= size || !get(i + 7 + k))
      if (lightBefore || lightAfter) score += 40
    }
    return score
  }
  for (let y = 0; y < size; y++) result += line((x) => modules[y][x])
  for (let x = 0; x < size; x++) result += line((y) => modules[y][x])
  let dark = 0
  for (let y = 0; y < size; y++) {
    for (let x = 0; x < size; x++) {
      if (modules[y][x]) dark++
      if (x + 1 < size && y + 1 < size) {
        const color = modules[y][x]
        if (color === modules[y][x + 1] && color === modules[y + 1][x] && color === modules[y + 1][x + 1]) result += 3
      }
    }
  }
  const total = size * size
  result += (Math.ceil(Math.abs(dark * 20 - total * 10) / total) - 1) * 10
  return result
}

/** An SVG of the code with the standard quiet zone of four modules; scales to any size. */
export function qrSvg(text: string, label: string): string {
  const code = encodeQr(text)
  const border = 4
  const dimension = code.size + border * 2
  let path = ''
  for (let y = 0; y < code.size; y++) {
    for (let x = 0; x < code.size; x++) if (code.dark(x, y)) path += `M${x + border} ${y + border}h1v1h-1z`
  }
  const escapedLabel = label.replace(/[&<>"]/g, (char) => `&#${char.charCodeAt(0)};`)
  return (
    `<svg xmlns="http://www.w3.org/2000/svg" class="qr" viewBox="0 0 ${dimension} ${dimension}" width="${dimension * 5}" height="${dimension * 5}" role="img" aria-label="${escapedLabel}" shape-rendering="crispEdges">` +
    `<rect width="100%" height="100%" fill="#fff"/><path d="${path}" fill="#000"/></svg>`
  )
}
