// Shared steps of the import and export tests: upload a file, start the job, wait for its end.
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { TestServer } from '../helpers/server.ts'

/** Real CSV exports of other tools, kept as they came (test/fixtures/csv/README.md). */
export const FIXTURES = fileURLToPath(new URL('../fixtures/csv/', import.meta.url))
export const fixture = (name: string) => readFileSync(join(FIXTURES, name))

export async function upload(server: TestServer, token: string, type: string, csv: string | Buffer, fileName = 'upload.csv') {
  const boundary = 'testboundary1234'
  const body = Buffer.concat([
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${fileName}"\r\nContent-Type: text/csv\r\n\r\n`),
    Buffer.isBuffer(csv) ? csv : Buffer.from(csv),
    Buffer.from(`\r\n--${boundary}--\r\n`),
  ])
  return server.request('POST', `/api/${type}/import/upload`, {
    token,
    raw: body,
    headers: { 'content-type': `multipart/form-data; boundary=${boundary}` },
  })
}

export async function waitForImport(server: TestServer, token: string, type: string, id: string, timeoutMs = 15_000) {
  const started = Date.now()
  for (;;) {
    const response = await server.request('GET', `/api/${type}/import/${id}`, { token })
    if (response.status !== 200) throw new Error(`GET import answered ${response.status}: ${response.text}`)
    if (['completed', 'failed'].includes(response.body.data.status)) return response.body.data
    if (Date.now() - started > timeoutMs) throw new Error(`import ${id} still ${response.body.data.status} after ${timeoutMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}

/** Upload, start with the given options (default: the suggested mapping, create), wait. */
export async function importCsv(
  server: TestServer,
  token: string,
  type: string,
  csv: string | Buffer,
  options: Record<string, unknown> = {},
) {
  const uploaded = await upload(server, token, type, csv)
  if (uploaded.status !== 201) throw new Error(`upload answered ${uploaded.status}: ${uploaded.text}`)
  const started = await server.request('POST', `/api/${type}/import/${uploaded.body.data.id}`, { token, body: options })
  if (started.status !== 202) throw new Error(`start answered ${started.status}: ${started.text}`)
  return { upload: uploaded.body.data, job: await waitForImport(server, token, type, uploaded.body.data.id) }
}
