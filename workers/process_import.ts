// process_import: lands an uploaded CSV file (src/imports/process-import.ts has the steps and
// their crash safety). A refusal (grant gone, broken file) fails the import at once; any other
// error is retried by graphile-worker, and the retry resumes after the last committed batch.
import type { Task } from 'graphile-worker'
import type { Config } from '../src/config.ts'
import { type ImportJob, markFailed, processImport } from '../src/imports/process-import.ts'

export function processImportTask(_config: Config): Task {
  return async (payload, helpers) => {
    const job = payload as ImportJob
    await helpers.withPgClient(async (client) => {
      try {
        await processImport(client, job, { log: (line) => helpers.logger.debug(line) })
      } catch (error) {
        if (helpers.job.attempts >= helpers.job.max_attempts)
          await markFailed(client, job, `the import stopped after ${helpers.job.attempts} attempts: ${(error as Error).message}`)
        throw error
      }
    })
  }
}
