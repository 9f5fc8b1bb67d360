// The QR code on the two-factor screen, drawn as inline SVG so the page needs no image request and
// no third-party service ever sees the secret. uqr encodes (error correction level M, the smallest
// version that holds the text); this module only draws its modules as one path.
import { encode } from 'uqr'

/** The standard quiet zone: four light modules on each side. */
const QUIET_ZONE = 4
/** Pixels per module at the SVG's natural size; the viewBox lets CSS scale it. */
const MODULE_PIXELS = 5

/** An SVG of the code with its quiet zone, labelled for screen readers; scales to any size. */
export function qrSvg(text: string, label: string): string {
  const code = encode(text, { ecc: 'M', border: QUIET_ZONE })
  let path = ''
  code.data.forEach((row, y) => {
    row.forEach((dark, x) => {
      if (dark) path += `M${x} ${y}h1v1h-1z`
    })
  })
  const size = code.size
  const escapedLabel = label.replace(/[&<>"]/g, (char) => `&#${char.charCodeAt(0)};`)
  return (
    `<svg xmlns="http://www.w3.org/2000/svg" class="qr" viewBox="0 0 ${size} ${size}" width="${size * MODULE_PIXELS}" height="${size * MODULE_PIXELS}" role="img" aria-label="${escapedLabel}" shape-rendering="crispEdges">` +
    `<rect width="100%" height="100%" fill="#fff"/><path d="${path}" fill="#000"/></svg>`
  )
}
